//! Pause: an operator asked a running job to pause (`POST /api/v1/runs/{id}/pause`).
//!
//! The step's sandbox is frozen (the cgroup freezer, else `SIGSTOP` to each of its
//! processes), the tree is
//! captured as a checkpoint under a durable hold, and only then is the request recorded
//! paused: the scheduler's paused reply always follows the capture. Resume thaws the
//! sandbox. A pause that outlasts its limit (30 minutes by default)
//! behaves like a stop: the processes end and the request stops at its checkpoint, from
//! which a reviewed continuation can take it further.

use crate::custody::{self, Checkpoint, CustodyError, Subject, Tree};
use crate::error::JobError;
use crate::isolation::Live;
use crate::job::handle::Job;
use crate::keeper::Reason;
use cairn_common::request;
use serde_json::json;
use tokio::sync::watch;

/// How a pause ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseEnd {
    Resumed,
    /// The limit passed: the job is stopped (reason [`Reason::PauseExpired`]).
    Expired,
    /// Cancelled, drained or fenced while paused.
    Stopped,
}

/// Whether a pause is requested now.
pub fn requested(job: &Job) -> bool {
    *job.pause_requests().borrow()
}

/// Waits until a pause is requested (never returns if the keeper is gone).
pub async fn until_requested(pause: &mut watch::Receiver<bool>) {
    if pause.wait_for(|p| *p).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Pauses the job here (in `step`, whose sandbox is `live`; empty between steps)
/// until resumed, stopped, or past the limit. The step's processes are continued on
/// every way out, errors included.
pub async fn pause_here(
    job: &Job,
    subject: &Subject,
    tree: &mut Tree,
    step: Option<&str>,
    live: &Live,
) -> Result<PauseEnd, JobError> {
    let step_goes_on = live.freeze(true);
    let end = paused(job, subject, tree, step).await;
    // Stopped processes cannot act on SIGTERM: continue them whatever comes next.
    live.freeze(false);
    let end = end?;
    match end {
        PauseEnd::Resumed => {
            let mut tx = job.begin().await?;
            request::pause::record_resumed(&mut tx, job.request_id()).await?;
            custody::set_paused(&mut tx, tree, false).await?;
            tx.commit().await?;
            // The step goes on changing the tree.
            tree.live.uncaptured |= step_goes_on;
            tracing::info!("resumed");
        }
        PauseEnd::Expired => {
            tracing::info!(limit = ?job.worker.settings.pause_limit, "paused past the limit: stopping like a stop");
            tree.live.uncaptured |= step_goes_on;
            job.stop_for(Reason::PauseExpired);
        }
        PauseEnd::Stopped => tree.live.uncaptured |= step_goes_on,
    }
    Ok(end)
}

/// With the processes stopped: capture, record the pause, wait for its end.
async fn paused(
    job: &Job,
    subject: &Subject,
    tree: &mut Tree,
    step: Option<&str>,
) -> Result<PauseEnd, JobError> {
    tracing::info!(
        step,
        "pause requested: processes stopped, capturing a checkpoint"
    );
    let mut capture_failed = false;
    if tree.live.uncaptured {
        match job
            .worker
            .custody
            .checkpoint(job.lease(), subject, tree, None)
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
    let limit = job.worker.settings.pause_limit;
    let expires_at =
        chrono::Utc::now() + chrono::Duration::from_std(limit).unwrap_or(chrono::Duration::MAX);
    let record = json!({
        // Ids in API bodies are simple (no hyphens).
        "snapshot_id": tree.live.position.map(|id| id.simple().to_string()),
        "step": step,
        "capture_failed": capture_failed,
        "expires_at": expires_at,
    });
    let mut tx = job.begin().await?;
    request::pause::record_paused(&mut tx, job.request_id(), &record).await?;
    custody::set_paused(&mut tx, tree, true).await?;
    tx.commit().await?;
    job.worker.metrics.pauses.inc();
    tracing::info!(
        snapshot_id = %tree.live.position.map_or_else(|| "none".into(), |p| p.simple().to_string()),
        capture_failed,
        "paused"
    );
    let mut requests = job.pause_requests();
    let resumed = async {
        if requests.wait_for(|p| !*p).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    Ok(tokio::select! {
        _ = resumed => PauseEnd::Resumed,
        _ = tokio::time::sleep(limit) => PauseEnd::Expired,
        _ = job.stop.cancelled() => PauseEnd::Stopped,
    })
}
