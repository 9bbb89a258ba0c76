//! Capture-before-commit, for every job that keeps a tree (a run's step, a sandbox's
//! operation, stop, snapshot or fork): the snapshot row, the capture, then one fenced
//! transaction that makes the snapshot ready, appends it to the lineage when asked and
//! writes the job's seal on it. A tree unchanged from its position is sealed on that
//! position with no capture. A failure commits nothing and fails the snapshot.

use super::{Checkpoint, Custody, CustodyError};
use crate::fault;
use cairn_common::hold::{self, HoldTarget};
use cairn_common::lease::{Lease, LeaseError};
use cairn_common::lineage::{self, CapturedBy, LineageError, NewSnapshot, SnapshotStatus};
use cairn_common::retry;
use cairn_common::workspace;
use cairn_snapshot::{self as snapshot, Manifest};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use std::path::Path;
use std::sync::Arc;
use uuid::Uuid;

/// The parts of a live tree a commit reads and moves.
pub struct TreeAt<'t> {
    pub root: &'t Path,
    /// Its workspace row; none for a tree captured as a baseline.
    pub workspace_id: Option<Uuid>,
    /// The lineage head the tree derives from (what the next append expects).
    pub position: &'t mut Option<Uuid>,
    /// The stat index of the tree as last captured or restored.
    pub index: &'t mut Option<Arc<Manifest>>,
    /// Whether the live tree may hold work `position` lacks.
    pub uncaptured: &'t mut bool,
    /// Whether `index` is `position`'s, so an unchanged tree stands on the position.
    pub index_is_position: bool,
}

/// What a job writes with its snapshot, in the fenced transaction that makes the
/// snapshot ready.
// Only generic callers in this crate: no `Send` bound on the futures is needed to name.
#[allow(async_fn_in_trait)]
pub trait Seal {
    type Error: From<CustodyError> + From<sqlx::Error> + From<LeaseError>;

    /// Whether a tree unchanged from its position may be sealed on it, uncaptured.
    fn stands_on_unchanged(&self) -> bool;

    async fn seal(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        snapshot: Uuid,
    ) -> Result<TreeAfter, Self::Error>;
}

/// What a seal did to the tree it was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeAfter {
    /// The tree goes on (its row is still live).
    Stays,
    /// The seal ended the tree's task: its row is destroyed, last at the seal's
    /// snapshot, and every hold of it ended.
    Ended,
}

/// How a capture's seal ended.
enum Sealed {
    Landed,
    /// It must not count; nothing was committed.
    Refused(String),
    /// Its commit failed, and may have landed before the reply was lost.
    Unknown(sqlx::Error),
}

/// A capture's manifest, what it left out, and what it did.
type Captured = (Manifest, snapshot::Skipped, snapshot::CaptureStats);

/// What is captured, and how.
pub struct Capture<'a> {
    /// `checkpoint`, `baseline`, `stop`, `named` or `fork`.
    pub kind: &'a str,
    pub agent: &'a str,
    pub repository: Option<&'a str>,
    pub git_ref: Option<&'a str>,
    /// The lineage it belongs to; none for a baseline.
    pub work_context: Option<Uuid>,
    pub by: CapturedBy,
    pub name: Option<&'a str>,
    /// For a tree nothing else holds: a durable hold kept while it is captured, ended
    /// by the commit (a failure leaves it, so release never drops the tree).
    pub hold: Option<(HoldTarget<'a>, DateTime<Utc>)>,
    /// Whether the snapshot is appended to the work context's lineage (and becomes the
    /// tree's position).
    pub appends: bool,
}

/// Nothing to write with the snapshot (a baseline).
pub struct NoSeal;

impl Seal for NoSeal {
    type Error = CustodyError;

    fn stands_on_unchanged(&self) -> bool {
        false
    }

    async fn seal(
        &self,
        _: &mut PgConnection,
        _: &Lease,
        _: Uuid,
    ) -> Result<TreeAfter, CustodyError> {
        Ok(TreeAfter::Stays)
    }
}

impl Custody {
    /// Captures the tree and commits `seal` with it (see the module's note).
    pub async fn commit<S: Seal>(
        &self,
        lease: &Lease,
        capture: &Capture<'_>,
        tree: TreeAt<'_>,
        seal: &S,
    ) -> Result<Checkpoint, S::Error> {
        let scanned = match snapshot::scan(tree.root, &self.settings.rules).await {
            Ok(scanned) => scanned,
            Err(e) => return Ok(Checkpoint::Failed(format!("reading the tree: {e}"))),
        };
        if let (Some(position), Some(index), true, true) = (
            *tree.position,
            tree.index.as_deref(),
            tree.index_is_position,
            seal.stands_on_unchanged(),
        ) {
            if scanned.unchanged_from(index) {
                self.seal_unchanged(lease, position, seal).await?;
                *tree.uncaptured = false;
                return Ok(Checkpoint::Stands(position));
            }
        }
        if capture.appends {
            *tree.uncaptured = true;
        }
        let Some((snapshot_id, hold_id)) = self.begin_capture(lease, capture, &tree).await? else {
            return Ok(Checkpoint::Failed(
                "the snapshot store is being reclaimed".into(),
            ));
        };
        fault::point(fault::DURING_CAPTURE);

        let mut skipped = scanned.skipped.clone();
        let captured = snapshot::capture_scanned(
            &self.settings.store,
            tree.root,
            scanned,
            tree.index.clone(),
            snapshot_id,
        )
        .await;
        let captured = captured.map(|(manifest, stats)| {
            let secret = snapshot::Exclusion::SecretContent;
            (stats.secrets.iter()).for_each(|path| skipped.add(secret, path.clone()));
            (manifest, skipped, stats)
        });
        self.conclude(lease, capture, tree, (snapshot_id, hold_id), captured, seal)
            .await
    }

    /// Commits `seal` with a tree its caller has verified is exactly `manifest`, stat
    /// for stat (a fork's copy-on-write copy of its capture's tree, cut to that
    /// capture): the tree is not walked or read, and only the manifest is stored, under
    /// a snapshot of its own. `Failed` when a pack it names has been reclaimed: the
    /// caller captures the tree instead.
    pub async fn commit_known<S: Seal>(
        &self,
        lease: &Lease,
        capture: &Capture<'_>,
        tree: TreeAt<'_>,
        manifest: Manifest,
        seal: &S,
    ) -> Result<Checkpoint, S::Error> {
        if capture.appends {
            *tree.uncaptured = true;
        }
        let Some((snapshot_id, hold_id)) = self.begin_capture(lease, capture, &tree).await? else {
            return Ok(Checkpoint::Failed(
                "the snapshot store is being reclaimed".into(),
            ));
        };
        let recorded = snapshot::record_known(&self.settings.store, manifest, snapshot_id).await;
        let recorded = recorded.map(|manifest| {
            let files = (manifest.entries.iter())
                .filter(|e| e.kind == snapshot::EntryKind::File)
                .count() as u64;
            let stats = snapshot::CaptureStats {
                files,
                files_unchanged: files,
                ..Default::default()
            };
            (manifest, snapshot::Skipped::default(), stats)
        });
        self.conclude(lease, capture, tree, (snapshot_id, hold_id), recorded, seal)
            .await
    }

    /// Seals a capture (or abandons it when it failed or must not count), and moves the
    /// tree to it when it appends.
    async fn conclude<S: Seal>(
        &self,
        lease: &Lease,
        capture: &Capture<'_>,
        tree: TreeAt<'_>,
        (snapshot_id, hold_id): (Uuid, Option<Uuid>),
        captured: Result<Captured, snapshot::SnapshotError>,
        seal: &S,
    ) -> Result<Checkpoint, S::Error> {
        let (manifest, skipped, stats) = match captured {
            Ok(captured) => captured,
            Err(e) => {
                tracing::warn!(error = %e, snapshot_id = %snapshot_id.simple(), "capture failed; the tree stays held");
                self.abandon(lease, snapshot_id, hold_id).await;
                return Ok(Checkpoint::Failed(e.to_string()));
            }
        };
        let sealed = self
            .seal_capture(
                lease,
                capture,
                &tree,
                (snapshot_id, hold_id),
                &manifest,
                &skipped,
                seal,
            )
            .await;
        let failed = match sealed {
            Ok(Sealed::Landed) => None,
            Ok(Sealed::Refused(reason)) => Some(Ok(Checkpoint::Failed(reason))),
            Ok(Sealed::Unknown(e)) => match self.sealed_after_all(snapshot_id).await {
                Some(true) => None,
                Some(false) => Some(Err(e.into())),
                // It may have landed: nothing is abandoned on a guess.
                None => return Err(e.into()),
            },
            Err(e) => Some(Err(e)),
        };
        if let Some(failed) = failed {
            self.abandon(lease, snapshot_id, hold_id).await;
            return failed;
        }
        if capture.appends {
            *tree.position = Some(snapshot_id);
            *tree.index = Some(Arc::new(manifest));
            *tree.uncaptured = false;
        }
        tracing::info!(snapshot_id = %snapshot_id.simple(), kind = capture.kind, files = stats.files, unchanged = stats.files_unchanged, new_chunks = stats.chunks_new, "capture committed");
        Ok(Checkpoint::Stands(snapshot_id))
    }

    /// Whether a seal whose commit failed landed after all: a fault may hide a commit
    /// that landed, and only the seal's transaction records its snapshot's manifest
    /// (`lineage::mark_ready`). Asked until it answers, within `write_retry`: `None`
    /// when it never did.
    async fn sealed_after_all(&self, snapshot_id: Uuid) -> Option<bool> {
        fault::unanswered::<sqlx::Error>(fault::SEAL_UNANSWERED).ok()?;
        let mut delays = self.settings.write_delays();
        let mut landed = || async {
            let recorded: Option<bool> = sqlx::query_scalar(
                "SELECT manifest_key IS NOT NULL FROM project_snapshots WHERE id = $1",
            )
            .bind(snapshot_id)
            .fetch_optional(&self.pool)
            .await?;
            Ok::<_, sqlx::Error>(Some(recorded == Some(true)))
        };
        let what = "a capture's seal";
        let answer = retry::read_back(&mut delays, what, &|| false, &mut landed).await;
        answer.flatten()
    }

    /// Seals on the snapshot an unchanged tree is at, with no capture.
    async fn seal_unchanged<S: Seal>(
        &self,
        lease: &Lease,
        position: Uuid,
        seal: &S,
    ) -> Result<(), S::Error> {
        let mut tx = lease.begin_fenced(&self.pool).await?;
        seal.seal(&mut tx, lease, position).await?;
        tx.commit().await?;
        fault::lost_reply::<sqlx::Error>(fault::SEAL_REPLY)?;
        Ok(())
    }

    /// The snapshot row (already `uploading`), and the capture's hold if it takes one,
    /// in one fenced transaction; `None` while the store is being reclaimed.
    async fn begin_capture(
        &self,
        lease: &Lease,
        capture: &Capture<'_>,
        tree: &TreeAt<'_>,
    ) -> Result<Option<(Uuid, Option<Uuid>)>, CustodyError> {
        let settings = &self.settings;
        let mut tx = lease.begin_fenced(&self.pool).await?;
        // Capture is serialized with credential rotation: the generation row is locked
        // until this snapshot row exists, so a rotation either sees it (and retires it)
        // or happened before (and it records the new generation).
        // The store's capture lock too: `None` while the reaper reclaims the store.
        let locked = lineage::lock_for_capture(&mut tx, capture.agent, settings.store_id).await?;
        let Some(generation) = locked else {
            return Ok(None);
        };
        let hold_id = match &capture.hold {
            Some((target, expires)) => {
                Some(hold::hold_for_capture(&mut tx, target, *expires).await?)
            }
            None => None,
        };
        let snapshot_id = lineage::create_uploading(
            &mut tx,
            &NewSnapshot {
                kind: capture.kind,
                agent: capture.agent,
                repository: capture.repository,
                backend: &settings.backend,
                base_image: settings.base_image.as_deref(),
                canonical_ref: capture.git_ref,
                work_context_id: capture.work_context,
                workspace_id: tree.workspace_id,
                store_url: settings.store.url(),
                store_id: settings.store_id,
                credential_generation: generation,
                owner: Some((capture.by, lease.epoch)),
                predecessor: *tree.position,
                name: capture.name,
                writer_node: settings.node.as_deref(),
            },
        )
        .await?;
        tx.commit().await?;
        Ok(Some((snapshot_id, hold_id)))
    }

    /// The one fenced transaction that makes the capture count: `Refused` when it must
    /// not (nothing committed), `Unknown` when its commit failed (it may have landed).
    #[allow(clippy::too_many_arguments)]
    async fn seal_capture<S: Seal>(
        &self,
        lease: &Lease,
        capture: &Capture<'_>,
        tree: &TreeAt<'_>,
        (snapshot_id, hold_id): (Uuid, Option<Uuid>),
        manifest: &Manifest,
        skipped: &snapshot::Skipped,
        seal: &S,
    ) -> Result<Sealed, S::Error> {
        let mut tx = lease.begin_fenced(&self.pool).await?;
        let size = i64::try_from(manifest.total_bytes()).unwrap_or(i64::MAX);
        let key = snapshot::recorded_key(snapshot_id, manifest);
        let stored = lineage::Stored {
            manifest_key: &key,
            size_bytes: size,
            tree_digest: &manifest.tree_digest(),
            pack_ids: &manifest.packs,
        };
        if !lineage::mark_ready(&mut tx, snapshot_id, &stored).await? {
            // The row left `uploading` meanwhile (the reaper failed a capture it took for
            // abandoned, and may have reclaimed packs it reused): never append it.
            let reason = "the snapshot was failed while it was captured";
            return Ok(Sealed::Refused(reason.into()));
        }
        if skipped.total() > 0 {
            lineage::record_skipped(&mut tx, snapshot_id, skipped).await?;
        }
        if let (true, Some(work_context)) = (capture.appends, capture.work_context) {
            let appended = lineage::append(
                &mut tx,
                work_context,
                capture.agent,
                *tree.position,
                snapshot_id,
            )
            .await;
            match appended {
                Ok(_) => {}
                Err(LineageError::Conflict {
                    expected, actual, ..
                }) => {
                    tracing::warn!(
                        ?expected,
                        ?actual,
                        "the lineage holds a head this tree lacks; not appended"
                    );
                    return Err(CustodyError::CaptureFailed(format!(
                        "the lineage moved to {actual:?} while this tree derives from {expected:?}"
                    ))
                    .into());
                }
                Err(LineageError::Db(e)) => return Err(e.into()),
            }
        }
        // A seal that ended the tree wrote its last position and ended its holds, this
        // capture's too: the tree's own rows are written only for a tree that goes on.
        if seal.seal(&mut tx, lease, snapshot_id).await? == TreeAfter::Stays {
            if let (true, Some(_), Some(workspace_id)) =
                (capture.appends, capture.work_context, tree.workspace_id)
            {
                workspace::moved_to(&mut tx, workspace_id, snapshot_id).await?;
            }
            if let Some(hold_id) = hold_id {
                hold::end(&mut tx, hold_id, "captured").await?;
            }
        }
        let committed = tx.commit().await;
        match committed.and_then(|()| fault::lost_reply(fault::SEAL_REPLY)) {
            Ok(()) => Ok(Sealed::Landed),
            Err(e) => Ok(Sealed::Unknown(e)),
        }
    }

    /// A capture that will not count: its snapshot fails (so it defers no reclamation
    /// in its store) and its hold stops saying "capturing" but stays. Best effort, and
    /// fenced: what is left is failed by the reaper once the lease ends.
    async fn abandon(&self, lease: &Lease, snapshot_id: Uuid, hold_id: Option<Uuid>) {
        let abandoned = async {
            let mut tx = lease.begin_fenced(&self.pool).await?;
            let from = [SnapshotStatus::Creating, SnapshotStatus::Uploading];
            lineage::set_status(&mut tx, snapshot_id, &from, SnapshotStatus::Failed).await?;
            if let Some(hold_id) = hold_id {
                hold::set_capture_in_progress(&mut tx, hold_id, false).await?;
            }
            tx.commit().await?;
            Ok::<_, CustodyError>(())
        };
        if let Err(e) = abandoned.await {
            tracing::warn!(error = %e, snapshot_id = %snapshot_id.simple(), "an abandoned capture was not marked failed; the reaper will");
        }
    }
}
