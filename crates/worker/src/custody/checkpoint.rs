//! A run's checkpoints: a step's receipt sealed with the capture of its effects
//! ([`Custody::commit`]), retried within the lease.

use super::commit::{Capture, Seal, TreeAfter};
use super::{Custody, CustodyError, Subject, Tree};
use cairn_common::hold::{self, HoldTarget};
use cairn_common::journal::{self, Receipt};
use cairn_common::lease::Lease;
use cairn_common::lineage::{self, CapturedBy, SnapshotStatus};
use cairn_common::report::{self, RetainedReport};
use cairn_common::retry::{self, Delays};
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

/// What a plan's last step may commit with its receipt, in the checkpoint's fenced
/// transaction: the request's completion and the tree's release, the tree last at
/// `snapshot` (`Ended`). It writes nothing when something leaves them to a transaction
/// of their own (a limit reached, a report to accept): `Stays`.
// Only generic callers in this crate: no `Send` bound on the futures is needed to name.
#[allow(async_fn_in_trait)]
pub trait Completion {
    async fn complete(
        &self,
        conn: &mut sqlx::PgConnection,
        snapshot: Uuid,
    ) -> Result<TreeAfter, CustodyError>;
}

/// No completion with the receipt: a step that is not the last, or a checkpoint.
pub struct NoCompletion;

impl Completion for NoCompletion {
    async fn complete(
        &self,
        _: &mut sqlx::PgConnection,
        _: Uuid,
    ) -> Result<TreeAfter, CustodyError> {
        Ok(TreeAfter::Stays)
    }
}

/// A step's commit, if any, and what completes with it, as the seal of its checkpoint.
struct StepSeal<'c, 'a, C> {
    commit: Option<&'c Commit<'a>>,
    completion: &'c C,
}

impl<C: Completion> Seal for StepSeal<'_, '_, C> {
    type Error = CustodyError;

    fn stands_on_unchanged(&self) -> bool {
        true
    }

    async fn seal(
        &self,
        conn: &mut sqlx::PgConnection,
        lease: &Lease,
        snapshot: Uuid,
    ) -> Result<TreeAfter, CustodyError> {
        match self.commit {
            Some(commit) => {
                commit.record(conn, lease, snapshot).await?;
                self.completion.complete(conn, snapshot).await
            }
            None => Ok(TreeAfter::Stays),
        }
    }
}

/// A step's committed checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    pub snapshot: Uuid,
    /// Found by this method's read-back of the receipt after a lost connection: which
    /// try's seal landed is not known (a [`Completion`] that counts on its last try
    /// must read it back too). A seal whose own commit is read back as landed
    /// (`Custody::commit`) is this try's, and counts as a clean commit.
    pub read_back: bool,
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
    pub async fn commit_step<C: Completion>(
        &self,
        lease: &Lease,
        subject: &Subject,
        tree: &mut Tree,
        (commit, completion): (&Commit<'_>, &C),
        stop: &CancellationToken,
    ) -> Result<Committed, CustodyError> {
        let (min, max) = (Duration::from_millis(200), Duration::from_secs(5));
        let mut delays = Delays::within(min, max, self.settings.capture_retry);
        // The captures' own time counts too: a store that hangs ends the attempt.
        let deadline = Instant::now() + self.settings.capture_retry;
        loop {
            let seal = StepSeal {
                commit: Some(commit),
                completion,
            };
            let reason = match self.checkpoint_with(lease, subject, tree, &seal).await {
                Ok(Checkpoint::Stands(snapshot)) => {
                    let read_back = false;
                    return Ok(Committed {
                        snapshot,
                        read_back,
                    });
                }
                Ok(Checkpoint::Failed(reason)) => reason,
                // A lost connection or a restart is retried within the lease (a lost
                // lease fails the fenced begin instead); the commit may have landed
                // before the connection broke, so it is read back first, until the
                // read-back answers: a step's commit that landed is not made again.
                Err(e) if e.is_transient() => {
                    let mut landed = || self.committed(lease, commit);
                    let give_up = || stop.is_cancelled() || Instant::now() >= deadline;
                    let what = "the step's commit";
                    let answer = retry::read_back(&mut delays, what, &give_up, &mut landed);
                    let snapshot = match answer.await {
                        Some(snapshot) => snapshot,
                        None => return Err(CustodyError::CaptureFailed(e.to_string())),
                    };
                    if let Some(snapshot) = snapshot {
                        tree.live.moved_to(snapshot);
                        let read_back = true;
                        return Ok(Committed {
                            snapshot,
                            read_back,
                        });
                    }
                    // Best effort: what is left is failed by the reaper once the lease ends.
                    let _ = self.abandon_unfinished(lease, tree).await;
                    e.to_string()
                }
                Err(e) => return Err(e),
            };
            tracing::warn!(error = %reason, "checkpoint failed; retrying within the lease");
            if Instant::now() >= deadline || delays.wait(stop).await.is_none() {
                return Err(CustodyError::CaptureFailed(reason));
            }
        }
    }

    /// One checkpoint of the live tree, with a step's receipt when given: a durable
    /// hold keeps the tree while it is captured, and the snapshot is appended to the
    /// task's lineage (see [`Custody::commit`]).
    pub async fn checkpoint(
        &self,
        lease: &Lease,
        subject: &Subject,
        tree: &mut Tree,
        commit: Option<&Commit<'_>>,
    ) -> Result<Checkpoint, CustodyError> {
        let seal = StepSeal {
            commit,
            completion: &NoCompletion,
        };
        self.checkpoint_with(lease, subject, tree, &seal).await
    }

    async fn checkpoint_with<C: Completion>(
        &self,
        lease: &Lease,
        subject: &Subject,
        tree: &mut Tree,
        seal: &StepSeal<'_, '_, C>,
    ) -> Result<Checkpoint, CustodyError> {
        let settings = &self.settings;
        let expires = hold::expiry(
            chrono::Utc::now(),
            subject.deadline,
            settings.persistent,
            settings.hold_limits,
        );
        let capture = Capture {
            kind: "checkpoint",
            agent: &subject.agent,
            repository: subject.repository.as_deref(),
            git_ref: subject.git_ref.as_deref(),
            work_context: Some(subject.work_context),
            by: CapturedBy::Request(lease.request_id),
            name: None,
            hold: Some((
                HoldTarget {
                    workspace_id: tree.live.workspace_id,
                    run_id: Some(subject.run_id),
                    work_context: Some(subject.work_context),
                    agent: &subject.agent,
                },
                expires,
            )),
            appends: true,
        };
        let at = tree.live.at(true);
        self.commit(lease, &capture, at, seal).await
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
        .bind(tree.live.workspace_id)
        .fetch_all(&mut *tx)
        .await?;
        for id in capturing {
            hold::set_capture_in_progress(&mut tx, id, false).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
