//! The moves a sandbox's owner makes, each in one fenced transaction: running (its tree
//! acquired here), stopped (with its stop snapshot, its slot released), destroyed, or
//! failed to start.

use super::operation::{self, Owner};
use super::tree::{self, SandboxTree, Seal, Unacquired};
use super::{HostError, SandboxRow, POLL};
use crate::context::Worker;
use crate::isolation;
use crate::workspace;
use backon::{BackoffBuilder, ExponentialBuilder};
use cairn_common::lease::{Lease, LeaseError};
use cairn_common::sandbox::record;
use cairn_common::sandbox::{SandboxEvent, SandboxState};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How many times a stop's capture is tried before the sandbox fails.
const STOP_TRIES: usize = 4;

/// A claimed sandbox on this worker.
pub struct Host {
    pub worker: Arc<Worker>,
    pub lease: Lease,
    pub row: SandboxRow,
    /// Cancelled once the lease cannot be kept.
    pub lost: CancellationToken,
    /// The held namespaces its commands enter, where processes run in namespaces.
    pub session: Option<isolation::Session>,
}

impl Host {
    /// Acquires the tree, marks the sandbox running, then serves it until it leaves.
    pub async fn run(
        mut self,
        shutdown: &CancellationToken,
        drain: &CancellationToken,
    ) -> Result<&'static str, HostError> {
        let mut tree = match tree::acquire(&self.worker, &self.row).await {
            Ok(tree) => tree,
            Err(Unacquired::Failed(reason)) => {
                self.failed(&reason).await?;
                return Ok("failed_to_start");
            }
            Err(Unacquired::Host(e)) => {
                // The sweeper places it again (its attempts are counted).
                self.lapse().await;
                return Err(e);
            }
        };
        if tree.origin == "source" {
            // A copy of another sandbox: its identity goes, and its tree becomes this
            // sandbox's own first checkpoint.
            let root = tree.workspace.root.clone();
            match tokio::task::spawn_blocking(move || super::fork::scrub(&root)).await {
                Ok(Ok(removed)) if removed > 0 => tracing::info!(removed, "identity files removed"),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    self.failed(&format!("scrubbing the copied tree: {e}"))
                        .await?;
                    return Ok("failed_to_start");
                }
                Err(e) => return Err(HostError::Transient(e.to_string())),
            }
            let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
            tree::record_in_use(&mut tx, &self.worker, &self.row, &tree).await?;
            tx.commit().await?;
            if let Err(e) =
                tree::commit(&self.worker, &self.lease, &self.row, &mut tree, Seal::Start).await
            {
                self.lapse().await;
                return Err(e);
            }
        }
        let spec = isolation::Spec {
            workspace: tree.workspace.root.clone(),
            cwd: None,
            home: tree.workspace.home.clone(),
            network: self
                .row
                .effective_network(self.worker.isolation.network_default()),
            limits: self.worker.isolation.limits(None),
        };
        self.session = match self.worker.isolation.start_session(&spec).await {
            Ok(session) => session,
            Err(reason) => {
                self.failed(&reason).await?;
                return Ok("failed_to_start");
            }
        };
        self.running(&tree).await?;
        tracing::info!(
            origin = tree.origin,
            held = self.session.is_some(),
            "sandbox running"
        );
        let left = self.serve(&mut tree, shutdown, drain).await;
        // Whatever happened, no process of the sandbox outlives its hosting here.
        if let Some(session) = self.session.take() {
            session.end(&self.worker.isolation).await;
        }
        left
    }

    /// Serves the running sandbox: its operations in order, and what is asked of it.
    async fn serve(
        &mut self,
        tree: &mut SandboxTree,
        shutdown: &CancellationToken,
        drain: &CancellationToken,
    ) -> Result<&'static str, HostError> {
        let mut paused: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                biased;
                _ = self.lost.cancelled() => return Err(self.lost_error()),
                _ = shutdown.cancelled() => {
                    self.stop(tree, Some("worker_drained")).await?;
                    return Ok("worker_drained");
                }
                _ = tokio::time::sleep(POLL) => {}
            }
            // One row: what is asked of the sandbox, and its next operation if any.
            let next: Result<(String, Option<Uuid>, Option<serde_json::Value>), sqlx::Error> =
                sqlx::query_as(
                    "SELECT s.desired, o.id, o.body FROM sandboxes s
                       LEFT JOIN LATERAL (SELECT id, body FROM sandbox_operations
                                           WHERE sandbox_id = s.id AND state = 'pending'
                                           ORDER BY seq LIMIT 1) o ON TRUE
                      WHERE s.id = $1",
                )
                .bind(self.row.id)
                .fetch_one(&self.worker.pool)
                .await;
            let next = next.map(|(desired, id, body)| (desired, id.zip(body)));
            let (desired, op) = match next {
                Ok(next) => next,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the sandbox failed; trying again");
                    continue;
                }
            };
            match (desired.as_str(), paused) {
                ("stopped", _) => {
                    self.stop(tree, None).await?;
                    return Ok("stopped");
                }
                ("destroyed", _) => {
                    self.destroy(tree).await?;
                    return Ok("destroyed");
                }
                // A pause lasts at most the limit, then it behaves like a stop.
                (_, Some(since)) if since.elapsed() >= self.worker.settings.pause_limit => {
                    self.stop(tree, Some("pause_expired")).await?;
                    return Ok("pause_expired");
                }
                ("paused", None) => {
                    self.pause(true).await?;
                    paused = Some(tokio::time::Instant::now());
                    continue;
                }
                ("running", Some(_)) => {
                    self.pause(false).await?;
                    paused = None;
                }
                (_, Some(_)) => continue,
                _ => {}
            }
            if let Some((id, body)) = op {
                operation::perform(&self.owner(), tree, id, body, drain).await?;
            }
        }
    }

    /// Freezes every process of the sandbox in place and records it paused, or thaws
    /// them and records it running.
    async fn pause(&self, frozen: bool) -> Result<(), HostError> {
        if let Some(session) = &self.session {
            session.freeze(frozen);
        }
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        let event = if frozen {
            SandboxEvent::Pause
        } else {
            SandboxEvent::Resume
        };
        record::transition(&mut tx, self.row.id, event).await?;
        sqlx::query(
            "UPDATE sandboxes SET paused_at = CASE WHEN $2 THEN now() END, last_activity_at = now()
              WHERE id = $1",
        )
        .bind(self.row.id)
        .bind(frozen)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE workspaces SET state = CASE WHEN $2 THEN 'paused' ELSE 'running' END WHERE id = (SELECT workspace_id FROM sandboxes WHERE id = $1)")
            .bind(self.row.id)
            .bind(frozen)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        tracing::info!(frozen, "sandbox paused or thawed in place");
        Ok(())
    }

    /// What an operation needs of its owner.
    fn owner(&self) -> Owner<'_> {
        Owner {
            worker: &self.worker,
            lease: &self.lease,
            row: &self.row,
            lost: &self.lost,
            session: self.session.as_ref(),
        }
    }

    fn lost_error(&self) -> HostError {
        HostError::Lost(LeaseError::Expired {
            request_id: self.row.id,
        })
    }

    /// Lets the lease lapse now, so the sweeper places the sandbox again at once.
    async fn lapse(&self) {
        let _ = sqlx::query(
            "UPDATE sandboxes SET lease_deadline = clock_timestamp()
              WHERE id = $1 AND lease_epoch = $2 AND lease_owner = $3",
        )
        .bind(self.row.id)
        .bind(self.lease.epoch)
        .bind(&self.lease.owner)
        .execute(&self.worker.pool)
        .await;
    }

    /// Ends this owner's lease in its fenced transaction, commits it, then drops the
    /// liveness key: the last write of every way a sandbox leaves its worker but a stop
    /// (whose seal releases the lease itself).
    async fn release_and_commit(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    ) -> Result<(), HostError> {
        let leases = self.worker.leases.for_sandboxes();
        leases.release_in(&mut tx, &self.lease).await?;
        tx.commit().await?;
        leases.clear_liveness(&self.lease);
        Ok(())
    }

    /// Marks the sandbox running on this worker, its tree recorded and held.
    async fn running(&self, tree: &SandboxTree) -> Result<(), HostError> {
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        let event = match self.row.state {
            SandboxState::Creating => SandboxEvent::Ready,
            _ => SandboxEvent::Resume,
        };
        tree::record_in_use(&mut tx, &self.worker, &self.row, tree).await?;
        record::transition(&mut tx, self.row.id, event).await?;
        sqlx::query(
            "UPDATE sandboxes SET worker_id = $2, workspace_id = $3, stop_reason = NULL, error_reason = NULL,
                    paused_at = NULL, last_activity_at = now(), placement_attempt = 1
              WHERE id = $1",
        )
        .bind(self.row.id)
        .bind(&self.worker.settings.worker_id)
        .bind(tree.workspace_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Its tree could not be acquired, for good: a sandbox being created fails with the
    /// reason; one being resumed is (or stays) stopped and says why.
    async fn failed(&self, reason: &str) -> Result<(), HostError> {
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        if self.row.state == SandboxState::Creating {
            record::transition(&mut tx, self.row.id, SandboxEvent::BootFailure).await?;
            sqlx::query("UPDATE sandboxes SET error_reason = $2 WHERE id = $1")
                .bind(self.row.id)
                .bind(reason)
                .execute(&mut *tx)
                .await?;
        } else {
            // A paused one whose worker was lost and whose disk cannot be restored now
            // is stopped, as its pause would have been.
            if self.row.state == SandboxState::Paused {
                record::transition(&mut tx, self.row.id, SandboxEvent::Stop).await?;
            }
            sqlx::query(
                "UPDATE sandboxes SET desired = 'stopped', stop_reason = 'restore_failed', error_reason = $2,
                        paused_at = NULL
                  WHERE id = $1",
            )
            .bind(self.row.id)
            .bind(reason)
            .execute(&mut *tx)
            .await?;
        }
        record::interrupt_operations(&mut tx, self.row.id, reason).await?;
        self.release_and_commit(tx).await?;
        tracing::warn!(reason, "sandbox could not be prepared");
        Ok(())
    }

    /// Stops the sandbox here: the stop snapshot is captured and committed with the
    /// stop, then the local tree goes (the snapshot holds it). A capture that keeps
    /// failing fails the sandbox instead, and its hold keeps the tree.
    pub async fn stop(
        &self,
        tree: &mut SandboxTree,
        reason: Option<&str>,
    ) -> Result<(), HostError> {
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(2))
            .with_max_times(STOP_TRIES - 1)
            .build();
        loop {
            let error = match tree::commit(
                &self.worker,
                &self.lease,
                &self.row,
                tree,
                Seal::Stop { reason },
            )
            .await
            {
                Ok(snapshot) => {
                    self.worker
                        .leases
                        .for_sandboxes()
                        .clear_liveness(&self.lease);
                    workspace::remove(&tree.workspace).await;
                    tracing::info!(snapshot = %snapshot.simple(), "sandbox stopped; its stop snapshot holds its tree");
                    return Ok(());
                }
                Err(e @ (HostError::Capture(_) | HostError::Db(_) | HostError::Transient(_))) => e,
                Err(e) => return Err(e),
            };
            match delays.next() {
                Some(delay) if !self.lost.is_cancelled() => {
                    tracing::warn!(error = %error, ?delay, "stop capture failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                _ => {
                    self.runtime_failure(&format!(
                        "its stop snapshot could not be captured: {error}"
                    ))
                    .await?;
                    return Ok(());
                }
            }
        }
    }

    /// Recovery failed at run time: the sandbox is in `error`; its hold keeps the tree.
    async fn runtime_failure(&self, reason: &str) -> Result<(), HostError> {
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        record::transition(&mut tx, self.row.id, SandboxEvent::RuntimeFailure).await?;
        sqlx::query("UPDATE sandboxes SET error_reason = $2 WHERE id = $1")
            .bind(self.row.id)
            .bind(reason)
            .execute(&mut *tx)
            .await?;
        record::interrupt_operations(&mut tx, self.row.id, reason).await?;
        self.release_and_commit(tx).await?;
        Ok(())
    }

    /// Destroys the sandbox: everything released, the local tree removed. Its snapshots
    /// go after the reaper's grace.
    async fn destroy(&mut self, tree: &SandboxTree) -> Result<(), HostError> {
        if let Some(session) = self.session.take() {
            session.end(&self.worker.isolation).await;
        }
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        record::transition(&mut tx, self.row.id, SandboxEvent::Destroy).await?;
        sqlx::query("UPDATE sandboxes SET destroyed_at = now(), paused_at = NULL WHERE id = $1")
            .bind(self.row.id)
            .execute(&mut *tx)
            .await?;
        record::interrupt_operations(&mut tx, self.row.id, "the sandbox was destroyed first")
            .await?;
        record::end_holds(&mut tx, self.row.id, "sandbox_destroyed").await?;
        sqlx::query(
            "UPDATE workspaces SET state = 'destroyed', destroyed_at = now(), updated_at = now() WHERE id = $1",
        )
        .bind(tree.workspace_id)
        .execute(&mut *tx)
        .await?;
        self.release_and_commit(tx).await?;
        workspace::remove(&tree.workspace).await;
        Ok(())
    }
}
