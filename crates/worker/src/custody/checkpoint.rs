//! Checkpoints: capture under a durable hold, then one fenced transaction that makes the
//! snapshot ready, appends it to the lineage and writes the step's receipt on it.

use super::{Custody, CustodyError, Subject, Tree};
use crate::fault;
use backon::{BackoffBuilder, ExponentialBuilder};
use cairn_common::hold::{self, HoldTarget};
use cairn_common::journal::{self, Receipt};
use cairn_common::lease::Lease;
use cairn_common::lineage::{self, LineageError, NewSnapshot, SnapshotStatus};
use cairn_common::report::{self, RetainedReport};
use cairn_snapshot as snapshot;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A step's receipt, and the final report retained with the last one: what a checkpoint
/// commits with the snapshot holding the step's effects.
#[derive(Debug, Clone, Copy)]
pub struct Commit<'a> {
    pub receipt: Receipt<'a>,
    pub report: Option<RetainedReport<'a>>,
}

impl Commit<'_> {
    /// Writes the receipt on `snapshot` (and retains the report), in the caller's
    /// fenced transaction.
    async fn record(
        &self,
        conn: &mut sqlx::PgConnection,
        lease: &Lease,
        snapshot: Uuid,
    ) -> Result<(), sqlx::Error> {
        journal::record_receipt(&mut *conn, lease, &self.receipt, Some(snapshot)).await?;
        if let Some(report) = &self.report {
            report::retain(conn, lease, report).await?;
        }
        Ok(())
    }
}

/// How one checkpoint went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checkpoint {
    /// The tree (and the receipt, if any) stands on this snapshot: a new one, or the one
    /// the tree was already at when nothing changed.
    Stands(Uuid),
    /// This capture failed (store, disk, a snapshot failed under it); the hold keeps
    /// the tree and another try may pass. Nothing was committed.
    Failed(String),
}

impl Custody {
    /// A step's commit: [`Custody::checkpoint`] with its receipt, tried again with a
    /// backoff for `capture_retry` while the job goes on. Then the attempt ends with no
    /// receipt ([`CustodyError::CaptureFailed`]): a receipt never outlives its tree.
    pub async fn commit_step(
        &self,
        lease: &Lease,
        subject: &Subject,
        tree: &mut Tree,
        commit: &Commit<'_>,
        stop: &CancellationToken,
    ) -> Result<Uuid, CustodyError> {
        let deadline = Instant::now() + self.settings.capture_retry;
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(5))
            .without_max_times()
            .build();
        loop {
            let reason = match self.checkpoint(lease, subject, tree, Some(commit)).await {
                Ok(Checkpoint::Stands(snapshot)) => return Ok(snapshot),
                Ok(Checkpoint::Failed(reason)) => reason,
                // A lost connection or a restart is retried within the lease (a lost
                // lease fails the fenced begin instead); the commit may have landed
                // before the connection broke, so it is read back first.
                Err(e) if e.is_transient() => {
                    if let Ok(Some(snapshot)) = self.committed(lease, commit).await {
                        tree.position = Some(snapshot);
                        tree.index = None;
                        tree.uncaptured = false;
                        return Ok(snapshot);
                    }
                    // Best effort: what is left is failed by the reaper once the lease ends.
                    let _ = self.abandon_unfinished(lease, tree).await;
                    e.to_string()
                }
                Err(e) => return Err(e),
            };
            let delay = delays.next().unwrap_or(Duration::from_secs(5));
            if stop.is_cancelled() || Instant::now() + delay > deadline {
                return Err(CustodyError::CaptureFailed(reason));
            }
            tracing::warn!(error = %reason, ?delay, "checkpoint failed; retrying within the lease");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.cancelled() => return Err(CustodyError::CaptureFailed(reason)),
            }
        }
    }

    /// One checkpoint of the live tree, with a step's receipt when given. A tree
    /// unchanged from its position stands on it (no capture, no pack). Otherwise: a
    /// durable hold and the snapshot row, the capture, then one transaction that makes
    /// the snapshot ready, appends it against the tree's position and writes the
    /// receipt on it. A failure leaves the hold, so release never drops the tree.
    pub async fn checkpoint(
        &self,
        lease: &Lease,
        subject: &Subject,
        tree: &mut Tree,
        commit: Option<&Commit<'_>>,
    ) -> Result<Checkpoint, CustodyError> {
        let settings = &self.settings;
        let scanned = match snapshot::scan(&tree.workspace.root, &settings.rules).await {
            Ok(scanned) => scanned,
            Err(e) => return Ok(Checkpoint::Failed(format!("reading the tree: {e}"))),
        };
        if let (Some(position), Some(index)) = (tree.position, tree.index.as_deref()) {
            if scanned.unchanged_from(index) {
                if let Some(commit) = commit {
                    let mut tx = lease.begin_fenced(&self.pool).await?;
                    commit.record(&mut tx, lease, position).await?;
                    tx.commit().await?;
                }
                tree.uncaptured = false;
                return Ok(Checkpoint::Stands(position));
            }
        }
        tree.uncaptured = true;
        let expires = hold::expiry(
            chrono::Utc::now(),
            subject.deadline,
            settings.persistent,
            settings.hold_limits,
        );
        let mut tx = lease.begin_fenced(&self.pool).await?;
        // Capture is serialized with credential rotation: the generation row is locked
        // until this snapshot row exists, so a rotation either sees it (and retires it)
        // or happened before (and it records the new generation).
        let generation = lineage::lock_generation(&mut tx, &subject.agent).await?;
        if !lineage::lock_store_for_capture(&mut tx, settings.store_id).await? {
            return Ok(Checkpoint::Failed(
                "the snapshot store is being reclaimed".into(),
            ));
        }
        let target = HoldTarget {
            workspace_id: tree.workspace_id,
            run_id: Some(subject.run_id),
            work_context: Some(subject.work_context),
            agent: &subject.agent,
        };
        let hold_id = hold::hold_for_capture(&mut tx, &target, expires).await?;
        let snapshot_id = lineage::create_uploading(
            &mut tx,
            &NewSnapshot {
                kind: "checkpoint",
                agent: &subject.agent,
                repository: subject.repository.as_deref(),
                backend: &settings.backend,
                base_image: settings.base_image.as_deref(),
                canonical_ref: subject.git_ref.as_deref(),
                work_context_id: Some(subject.work_context),
                workspace_id: Some(tree.workspace_id),
                store_url: settings.store.url(),
                store_id: settings.store_id,
                credential_generation: generation,
                owner: Some((lease.request_id, lease.epoch)),
            },
        )
        .await?;
        tx.commit().await?;
        fault::point(fault::DURING_CAPTURE);

        let mut skipped = scanned.skipped.clone();
        let captured = snapshot::capture_scanned(
            &settings.store,
            &tree.workspace.root,
            scanned,
            tree.index.clone(),
            snapshot_id,
        )
        .await;
        let (manifest, stats) = match captured {
            Ok(captured) => captured,
            Err(e) => {
                tracing::warn!(error = %e, snapshot_id = %snapshot_id.simple(), "capture failed; the hold keeps the live tree");
                self.abandon(lease, snapshot_id, hold_id).await?;
                return Ok(Checkpoint::Failed(e.to_string()));
            }
        };
        for path in &stats.secrets {
            skipped.add(snapshot::Exclusion::SecretContent, path.clone());
        }
        let mut tx = lease.begin_fenced(&self.pool).await?;
        let size = i64::try_from(manifest.total_bytes()).unwrap_or(i64::MAX);
        let ready = lineage::mark_ready(
            &mut tx,
            snapshot_id,
            &snapshot::manifest_key(snapshot_id),
            size,
            &manifest.packs,
        )
        .await?;
        if !ready {
            // The row left `uploading` meanwhile (the reaper failed a capture it took for
            // abandoned, and may have reclaimed packs it reused): never append it.
            drop(tx);
            self.abandon(lease, snapshot_id, hold_id).await?;
            return Ok(Checkpoint::Failed(
                "the snapshot was failed while it was captured".into(),
            ));
        }
        if skipped.total() > 0 {
            lineage::record_skipped(&mut tx, snapshot_id, &skipped).await?;
        }
        let appended = lineage::append(
            &mut tx,
            subject.work_context,
            &subject.agent,
            tree.position,
            snapshot_id,
        )
        .await;
        let sequence = match appended {
            Ok(sequence) => sequence,
            Err(LineageError::Conflict {
                expected, actual, ..
            }) => {
                drop(tx);
                tracing::warn!(
                    ?expected,
                    ?actual,
                    "the lineage holds a head this tree lacks; not appended"
                );
                self.abandon(lease, snapshot_id, hold_id).await?;
                return Err(CustodyError::CaptureFailed(format!(
                    "the lineage moved to {actual:?} while this tree derives from {expected:?}"
                )));
            }
            Err(LineageError::Db(e)) => return Err(e.into()),
        };
        if let Some(commit) = commit {
            commit.record(&mut tx, lease, snapshot_id).await?;
        }
        hold::end(&mut tx, hold_id, "captured").await?;
        sqlx::query("UPDATE workspaces SET snapshot_id = $2, updated_at = now() WHERE id = $1")
            .bind(tree.workspace_id)
            .bind(snapshot_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        tree.position = Some(snapshot_id);
        tree.index = Some(Arc::new(manifest));
        tree.uncaptured = false;
        tracing::info!(snapshot_id = %snapshot_id.simple(), sequence, files = stats.files, unchanged = stats.files_unchanged, new_chunks = stats.chunks_new, "checkpoint committed");
        Ok(Checkpoint::Stands(snapshot_id))
    }

    /// The snapshot this lease's receipt of the step stands on, if it was committed.
    async fn committed(
        &self,
        lease: &Lease,
        commit: &Commit<'_>,
    ) -> Result<Option<Uuid>, sqlx::Error> {
        let recorded: Option<Option<Uuid>> = sqlx::query_scalar(
            "SELECT snapshot_id FROM journal_receipts
              WHERE request_id = $1 AND step_key = $2 AND lease_epoch = $3",
        )
        .bind(lease.request_id)
        .bind(commit.receipt.step_key)
        .bind(lease.epoch)
        .fetch_optional(&self.pool)
        .await?;
        Ok(recorded.flatten())
    }

    /// Fails this lease's captures that a broken connection left unfinished (so they
    /// defer no reclamation), and lets the tree's holds stop saying "capturing".
    async fn abandon_unfinished(&self, lease: &Lease, tree: &Tree) -> Result<(), CustodyError> {
        let mut tx = lease.begin_fenced(&self.pool).await?;
        let unfinished: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM project_snapshots
              WHERE request_id = $1 AND lease_epoch = $2 AND status IN ('creating', 'uploading')",
        )
        .bind(lease.request_id)
        .bind(lease.epoch)
        .fetch_all(&mut *tx)
        .await?;
        let from = [SnapshotStatus::Creating, SnapshotStatus::Uploading];
        for id in unfinished {
            lineage::set_status(&mut tx, id, &from, SnapshotStatus::Failed).await?;
        }
        let capturing: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM holds WHERE workspace_id = $1 AND capture_in_progress AND ended_at IS NULL",
        )
        .bind(tree.workspace_id)
        .fetch_all(&mut *tx)
        .await?;
        for id in capturing {
            hold::set_capture_in_progress(&mut tx, id, false).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// A capture that will not be appended: its snapshot fails (so it defers no
    /// reclamation in its store) and its hold stops saying "capturing" but stays.
    async fn abandon(
        &self,
        lease: &Lease,
        snapshot_id: Uuid,
        hold_id: Uuid,
    ) -> Result<(), CustodyError> {
        let mut tx = lease.begin_fenced(&self.pool).await?;
        lineage::set_status(
            &mut tx,
            snapshot_id,
            &[SnapshotStatus::Creating, SnapshotStatus::Uploading],
            SnapshotStatus::Failed,
        )
        .await?;
        hold::set_capture_in_progress(&mut tx, hold_id, false).await?;
        tx.commit().await?;
        Ok(())
    }
}
