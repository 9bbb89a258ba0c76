//! How a job ends: what it records (completion, failure, reconciliation, cancellation),
//! handing the request back on a drain, stopping it at its checkpoint after a pause past
//! its limit, and ending an attempt that has no result.

use super::handle::{Job, JobOutcome};
use crate::custody::{CustodyError, Subject, Tree};
use crate::error::JobError;
use crate::keeper::Reason;
use crate::step::StepOutcome;
use cairn_common::handoff::{self, AdoptionStatus, HandoffState};
use cairn_common::journal::{self, Receipt};
use cairn_common::report::{self, Acceptance};
use cairn_common::request::action::{self, ActionStatus};
use cairn_common::request::{self, RequestState};
use cairn_common::run::{JobKind, JobMessage};
use std::path::PathBuf;

/// Acquires the job's workspace. When none can be had, the request fails with the
/// reason; when its checkpoint cannot be read now, the attempt ends. Either way the
/// outcome comes back instead.
pub async fn acquire_or_end(
    job: &Job,
    subject: &Subject,
) -> Result<Result<Tree, JobOutcome>, JobError> {
    match job.worker.custody.acquire(job.lease(), subject).await {
        Ok(tree) => Ok(Ok(tree)),
        Err(CustodyError::Workspace(e)) => {
            let message = format!("workspace: {e}");
            finish(job, RequestState::Failed, Some(&message), None).await?;
            Ok(Err(JobOutcome::Failed(message)))
        }
        Err(e) => match e.ends_attempt() {
            Some(_) => end_attempt(job, &e).await.map(Err),
            None => Err(e.into()),
        },
    }
}

/// A receipt that stands on no snapshot: the step failed (or never started) and the
/// request fails with it, so nothing continues from its tree.
pub async fn write_receipt(job: &Job, receipt: &Receipt<'_>) -> Result<(), JobError> {
    let mut tx = job.begin().await?;
    journal::record_receipt(&mut tx, job.lease(), receipt, None).await?;
    tx.commit().await?;
    Ok(())
}

/// Every step has its receipt: accept the report, if any, and complete.
pub async fn complete(job: &Job) -> Result<JobOutcome, JobError> {
    let mut tx = job.begin().await?;
    let outcome = if report::awaits_acceptance(&mut tx, job.request_id()).await? {
        let acceptance = report::accept(
            &mut tx,
            job.lease(),
            job.claimed.action_id,
            &job.worker.settings.worker_id,
        )
        .await?;
        match acceptance {
            Acceptance::Accepted { verification: true } => JobOutcome::AwaitingVerification,
            Acceptance::Accepted {
                verification: false,
            } => JobOutcome::Completed,
            Acceptance::Missing => {
                JobOutcome::NeedsReconciliation("no retained report to accept".into())
            }
        }
    } else {
        request::set_state(
            &mut tx,
            job.request_id(),
            RequestState::Completed,
            None,
            None,
        )
        .await?;
        if let Some(action_id) = job.claimed.action_id {
            action::set_status(&mut tx, action_id, ActionStatus::Completed).await?;
        }
        JobOutcome::Completed
    };
    job.worker.leases.release_in(&mut tx, job.lease()).await?;
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease()).await;
    Ok(outcome)
}

/// Ends the job in `state` and releases the lease, in one fenced transaction.
pub async fn finish(
    job: &Job,
    state: RequestState,
    reason: Option<&str>,
    step: Option<&str>,
) -> Result<(), JobError> {
    let mut tx = job.begin().await?;
    request::set_state(&mut tx, job.request_id(), state, reason, step).await?;
    match (job.claimed.kind, job.claimed.action_id) {
        // A verification that ends without its completion fails its adoption and
        // handoff (or is cancelled with them).
        (JobKind::Verification, Some(adoption_id)) => {
            let status = if state == RequestState::Cancelled {
                AdoptionStatus::Cancelled
            } else {
                AdoptionStatus::Failed
            };
            handoff::set_adoption_status(&mut tx, adoption_id, status, reason).await?;
            handoff::set_handoff_state_of(&mut tx, adoption_id, HandoffState::Failed).await?;
        }
        (_, Some(action_id)) => {
            let status = match state {
                RequestState::NeedsReconciliation => ActionStatus::NeedsReconciliation,
                RequestState::Completed => ActionStatus::Completed,
                _ => ActionStatus::Failed,
            };
            action::set_status(&mut tx, action_id, status).await?;
        }
        (_, None) => {}
    }
    job.worker.leases.release_in(&mut tx, job.lease()).await?;
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease()).await;
    Ok(())
}

/// The job was stopped mid-way: cancelled, drained, or fenced.
pub async fn interrupted(job: &Job) -> Result<JobOutcome, JobError> {
    match job.cause() {
        Some(Reason::Cancelled) => {
            finish(
                job,
                RequestState::Cancelled,
                Some("cancelled while running"),
                None,
            )
            .await?;
            Ok(JobOutcome::Cancelled)
        }
        Some(Reason::Drain) => {
            hand_back(job).await?;
            Ok(JobOutcome::HandedBack)
        }
        Some(Reason::PauseExpired) => {
            stop_after_pause(job).await?;
            Ok(JobOutcome::StoppedAtCheckpoint)
        }
        Some(Reason::Fenced) | None => {
            job.worker.metrics.self_fenced.inc();
            Ok(JobOutcome::Fenced)
        }
    }
}

/// The attempt ended with its lease still ours and nothing recorded for its step (its
/// effects could not be captured, or its checkpoint could not be read): the request
/// is followed up as after a lapsed lease, with the reason.
pub async fn end_attempt(job: &Job, error: &CustodyError) -> Result<JobOutcome, JobError> {
    let reason = error.ends_attempt().unwrap_or("attempt_ended");
    let continuation = match (job.claimed.kind, job.claimed.action_id) {
        (JobKind::Verification, Some(id)) => request::Continuation::Verification(id),
        (JobKind::CheckpointContinuation, Some(id)) => request::Continuation::Checkpoint(id),
        _ => request::Continuation::None,
    };
    let mut tx = job.begin().await?;
    let ended = request::end_attempt(&mut tx, job.request_id(), continuation, reason).await?;
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease()).await;
    tracing::warn!(error = %error, ?ended, "the attempt ended without a result");
    Ok(match ended {
        request::AttemptEnd::Requeued => JobOutcome::HandedBack,
        request::AttemptEnd::Stopped => JobOutcome::StoppedAtCheckpoint,
        request::AttemptEnd::AwaitingAdoption => JobOutcome::Failed(error.to_string()),
    })
}

/// A pause past its limit behaves like a stop: the request stops at its checkpoint
/// (a reviewed continuation can take it further) and the lease is released.
pub async fn stop_after_pause(job: &Job) -> Result<(), JobError> {
    let mut tx = job.begin().await?;
    job.worker.leases.release_in(&mut tx, job.lease()).await?;
    if let Some(action_id) = job.claimed.action_id {
        action::set_status(&mut tx, action_id, ActionStatus::Failed).await?;
    }
    request::pause::clear(&mut tx, job.request_id()).await?;
    request::stop_at_checkpoint(&mut tx, job.request_id(), "pause_expired").await?;
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease()).await;
    Ok(())
}

/// Drain: the request goes back to the queue at once, on the same attempt, for
/// another worker; a stopped step has no receipt and follows the unknown-outcome rule.
pub async fn hand_back(job: &Job) -> Result<(), JobError> {
    let mut tx = job.begin().await?;
    match (job.claimed.kind, job.claimed.action_id) {
        (JobKind::CheckpointContinuation, Some(action_id)) => {
            if action::window_open(&mut tx, action_id).await? {
                request::fence_out(&mut tx, job.request_id()).await?;
                action::set_status(&mut tx, action_id, ActionStatus::Queued).await?;
                let message = JobMessage {
                    kind: JobKind::CheckpointContinuation,
                    run_id: job.claimed.run_id,
                    request_id: job.request_id(),
                    action_id: Some(action_id),
                    attempt: Some(job.claimed.attempt),
                };
                request::readmit(&mut tx, &message).await?;
            } else {
                request::stop_at_checkpoint(&mut tx, job.request_id(), "continuation_window_ended")
                    .await?;
                action::set_status(&mut tx, action_id, ActionStatus::Failed).await?;
            }
        }
        _ => {
            request::requeue(&mut tx, job.request_id(), false).await?;
        }
    }
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease()).await;
    Ok(())
}

/// Whether the run's report asks for more than completion (its task stays open).
pub async fn paused_by_report(job: &Job) -> bool {
    let request_id = job.request_id();
    match job.worker.pool.acquire().await {
        Ok(mut conn) => report::asks_for_more(&mut conn, request_id)
            .await
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// The outcome recorded for a command that could not start.
pub fn spawn_failure(message: &str) -> StepOutcome {
    StepOutcome {
        exit_code: None,
        signal: None,
        interrupted: None,
        wall_ms: 0,
        cpu_ms: 0,
        output_digest: cairn_common::digest::sha256_hex(message.as_bytes()),
        stdout_tail: String::new(),
        stderr_tail: message.to_string(),
        stdout_path: PathBuf::new(),
        truncated: false,
    }
}
