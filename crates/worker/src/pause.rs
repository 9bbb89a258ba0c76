//! Pause: an operator asked a running job to pause (`POST /api/v1/runs/{id}/pause`).
//!
//! The step's processes are stopped (`SIGSTOP` to its process group), the tree is
//! captured as a checkpoint under a durable hold, and only then is the request recorded
//! paused: the scheduler's paused reply always follows the capture. Resume continues the
//! processes (`SIGCONT`). A pause that outlasts its limit (30 minutes by default)
//! behaves like a stop: the processes end and the request stops at its checkpoint, from
//! which a reviewed continuation can take it further.

use crate::custody::{Checkpoint, CustodyError, Held, Subject};
use crate::job::{Claimed, JobError, Worker};
use crate::renewal::{Reason, StopReason};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::json;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How a pause ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseEnd {
    Resumed,
    /// The limit passed: the job is stopped (reason [`Reason::PauseExpired`]).
    Expired,
    /// Cancelled, drained or fenced while paused.
    Stopped,
}

/// Sends `signal` to a step's process group; `group` 0 means no step is running.
fn signal_group(group: i32, signal: Signal) {
    if group > 0 {
        let _ = killpg(Pid::from_raw(group), signal);
    }
}

/// Whether a pause is requested now.
pub fn requested(pause: &watch::Receiver<bool>) -> bool {
    *pause.borrow()
}

/// Waits until a pause is requested (never returns if the keeper is gone).
pub async fn until_requested(pause: &mut watch::Receiver<bool>) {
    if pause.wait_for(|p| *p).await.is_err() {
        std::future::pending::<()>().await;
    }
}

pub struct Pausing<'a> {
    pub job: &'a Claimed,
    pub subject: &'a Subject,
    pub step: Option<&'a str>,
    /// The running step's process group, 0 between steps.
    pub group: i32,
    pub stop: &'a CancellationToken,
    pub reason: &'a StopReason,
}

impl Worker {
    /// Pauses here until resumed, stopped, or past the limit. The step's processes are
    /// continued on every way out, errors included.
    pub(crate) async fn pause_here(
        &self,
        at: Pausing<'_>,
        held: &mut Held,
        pause: &mut watch::Receiver<bool>,
    ) -> Result<PauseEnd, JobError> {
        signal_group(at.group, Signal::SIGSTOP);
        let end = self.paused(&at, held, pause).await;
        // Stopped processes cannot act on SIGTERM: continue them whatever comes next.
        signal_group(at.group, Signal::SIGCONT);
        let end = end?;
        let step_goes_on = at.group > 0;
        match end {
            PauseEnd::Resumed => {
                let mut tx = at.job.lease.begin_fenced(&self.pool).await?;
                sqlx::query(
                    "UPDATE execution_requests SET paused_at = NULL, updated_at = now() WHERE id = $1",
                )
                .bind(at.job.lease.request_id)
                .execute(&mut *tx)
                .await?;
                set_workspace_paused(&mut tx, held, false).await?;
                tx.commit().await?;
                // The step goes on changing the tree.
                held.uncaptured |= step_goes_on;
                tracing::info!("resumed");
            }
            PauseEnd::Expired => {
                tracing::info!(limit = ?self.settings.pause_limit, "paused past the limit: stopping like a stop");
                held.uncaptured |= step_goes_on;
                at.reason.set(Reason::PauseExpired);
                at.stop.cancel();
            }
            PauseEnd::Stopped => held.uncaptured |= step_goes_on,
        }
        Ok(end)
    }

    /// With the processes stopped: capture, record the pause, wait for its end.
    async fn paused(
        &self,
        at: &Pausing<'_>,
        held: &mut Held,
        pause: &mut watch::Receiver<bool>,
    ) -> Result<PauseEnd, JobError> {
        tracing::info!(
            step = at.step,
            "pause requested: processes stopped, capturing a checkpoint"
        );
        let mut capture_failed = false;
        if held.uncaptured {
            match self
                .custody
                .checkpoint(&at.job.lease, at.subject, held, None)
                .await
            {
                Ok(Checkpoint::Stands(_)) => {}
                Ok(Checkpoint::Failed(e)) | Err(CustodyError::CaptureFailed(e)) => {
                    tracing::warn!(error = %e, "pause checkpoint failed; the hold keeps the tree");
                    capture_failed = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
        let limit = self.settings.pause_limit;
        let expires_at =
            chrono::Utc::now() + chrono::Duration::from_std(limit).unwrap_or(chrono::Duration::MAX);
        let record = json!({
            // Ids in API bodies are simple (no hyphens).
            "snapshot_id": held.position.map(|id| id.simple().to_string()),
            "step": at.step,
            "capture_failed": capture_failed,
            "expires_at": expires_at,
        });
        let mut tx = at.job.lease.begin_fenced(&self.pool).await?;
        sqlx::query(
            "UPDATE execution_requests SET paused_at = now(), pause_checkpoint = $2, updated_at = now()
              WHERE id = $1",
        )
        .bind(at.job.lease.request_id)
        .bind(&record)
        .execute(&mut *tx)
        .await?;
        set_workspace_paused(&mut tx, held, true).await?;
        tx.commit().await?;
        self.metrics.pauses.inc();
        tracing::info!(snapshot_id = ?held.position, capture_failed, "paused");
        Ok(wait(pause, at.stop, limit).await)
    }
}

async fn wait(
    pause: &mut watch::Receiver<bool>,
    stop: &CancellationToken,
    limit: Duration,
) -> PauseEnd {
    let resumed = async {
        if pause.wait_for(|p| !*p).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = resumed => PauseEnd::Resumed,
        _ = tokio::time::sleep(limit) => PauseEnd::Expired,
        _ = stop.cancelled() => PauseEnd::Stopped,
    }
}

async fn set_workspace_paused(
    conn: &mut sqlx::PgConnection,
    held: &Held,
    paused: bool,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE workspaces SET state = CASE WHEN $2 THEN 'paused' ELSE 'running' END,
                paused_at = CASE WHEN $2 THEN now() END, updated_at = now()
          WHERE id = $1 AND state IN ('running', 'paused')",
    )
    .bind(held.workspace_id)
    .bind(paused)
    .execute(conn)
    .await?;
    Ok(())
}
