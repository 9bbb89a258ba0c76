//! How a job ends: what it records (completion, failure, reconciliation, cancellation),
//! handing the request back on a drain, stopping it at its checkpoint after a pause past
//! its limit, and ending an attempt that has no result.

use super::claim;
use super::durable;
use super::handle::{Job, JobOutcome};
use crate::custody::{CustodyError, Opening, Release, Subject, Tree};
use crate::error::JobError;
use crate::fault;
use crate::keeper::Reason;
use crate::step::StepOutcome;
use cairn_common::handoff;
use cairn_common::journal::{self, Receipt, Record};
use cairn_common::report::{self, Acceptance};
use cairn_common::request::action;
use cairn_common::request::limits::{self, Breach, Moment};
use cairn_common::request::{self, ActionEvent, AdoptionEvent, Continuation, RequestEvent};
use cairn_common::run::{JobKind, JobMessage};
use std::path::PathBuf;

/// Acquires the job's workspace. When none can be had, the request fails with the
/// reason; when its checkpoint cannot be read now, the attempt ends. Either way the
/// outcome comes back instead.
pub async fn acquire_or_end<O: Opening>(
    job: &Job,
    subject: &Subject,
    opening: &O,
) -> Result<Result<Tree, JobOutcome>, JobError> {
    match job
        .worker
        .custody
        .acquire(job.lease(), subject, opening)
        .await
    {
        Ok(tree) => Ok(Ok(tree)),
        Err(CustodyError::Workspace(e)) => {
            let message = format!("workspace: {e}");
            finish(job, RequestEvent::Fail, Some(&message), None).await?;
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
    let landed = || async {
        let written = journal::written(
            &job.worker.pool,
            job.lease(),
            Record::Receipt,
            receipt.step_key,
        );
        Ok(written.await?.then_some(()))
    };
    durable::until_landed(job, "receipt", || write_receipt_once(job, receipt), landed).await
}

async fn write_receipt_once(job: &Job, receipt: &Receipt<'_>) -> Result<(), JobError> {
    let mut tx = job.begin().await?;
    journal::record_receipt(&mut tx, job.lease(), receipt, None).await?;
    tx.commit().await?;
    Ok(())
}

/// How a completion's transaction went.
enum Completion {
    /// It committed.
    Done(JobOutcome),
    /// A lost connection failed it, and the read-back found the lease released: it
    /// landed, or the request moved on without it (requeued, or another owner's).
    ReadBack(JobOutcome),
    /// A limit was reached meanwhile (a cancel, the window, the deadline): nothing was
    /// written, and the request ends as the limit says.
    Breached(Breach),
}

/// Every step has its receipt: unless a limit was reached meanwhile, accept the
/// report, if any, and complete.
pub async fn complete(job: &Job) -> Result<JobOutcome, JobError> {
    match complete_with(job, None).await? {
        Completion::Done(outcome) | Completion::ReadBack(outcome) => Ok(outcome),
        Completion::Breached(breach) => breached(job, &breach, Moment::Completion, None).await,
    }
}

/// [`complete`] for a plan run on a tree: the tree's release (its task ended) commits
/// in the completion's own transaction, one fenced commit instead of two. A limit
/// reached meanwhile releases it as that limit's ending does; a completion that could
/// not be written releases it as a plan that ended on that error does.
pub async fn complete_and_release(
    job: &Job,
    subject: &Subject,
    tree: &Tree,
) -> Result<JobOutcome, JobError> {
    let custody = &job.worker.custody;
    let result = complete_with(job, Some((subject, tree))).await;
    // After a lost connection, only the tree's row says whether this release landed
    // with the completion.
    let landed = match &result {
        Ok(Completion::Done(_)) => true,
        Ok(Completion::Breached(_)) => false,
        Ok(Completion::ReadBack(_)) | Err(_) => custody.is_destroyed(tree).await,
    };
    if landed {
        custody
            .released(tree, Release::Ended { retire: false })
            .await;
    } else {
        let how = match &result {
            Ok(Completion::Breached(breach)) => release_at(breach),
            Ok(_) | Err(JobError::Lease(_)) => Release::Fenced,
            Err(_) => Release::HandedOn,
        };
        custody.release(job.lease(), subject, tree, how).await;
    }
    match result? {
        Completion::Done(outcome) | Completion::ReadBack(outcome) => Ok(outcome),
        Completion::Breached(breach) => breached(job, &breach, Moment::Completion, None).await,
    }
}

/// How the tree is released when a limit ends the plan: back at its checkpoint, a
/// continuation's tree stays for the next review; otherwise the task ended.
pub fn release_at(breach: &Breach) -> Release {
    match breach {
        Breach::WindowEnded => Release::HandedOn,
        _ => Release::Ended { retire: false },
    }
}

async fn complete_with(job: &Job, tree: Option<(&Subject, &Tree)>) -> Result<Completion, JobError> {
    fault::point(fault::BEFORE_COMPLETION);
    let write = || complete_once(job, tree);
    let landed = || async { Ok(durable::ended(job).await?.map(Completion::ReadBack)) };
    durable::until_landed(job, "completion", write, landed).await
}

async fn complete_once(job: &Job, tree: Option<(&Subject, &Tree)>) -> Result<Completion, JobError> {
    let mut tx = job.begin().await?;
    let request_id = job.request_id();
    let current = limits::read(&mut tx, request_id, job.claimed.continuation).await?;
    if let Some(breach) = current.breach(Moment::Completion) {
        return Ok(Completion::Breached(breach));
    }
    let report = report::standing(&mut tx, request_id).await?;
    if let Some((subject, tree)) = tree {
        // A task is done (its lineage retired) when it completed without asking for
        // more: a blocked or clarification report pauses it, and its checkpoint stays
        // current.
        let retire = !report.asks_for_more;
        let how = Release::Ended { retire };
        job.worker
            .custody
            .release_rows(&mut tx, subject, tree, how)
            .await?;
    }
    let outcome = if report.awaits_acceptance {
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
        request::transition(&mut tx, request_id, RequestEvent::Complete, None, None).await?;
        if let Some(action_id) = job.claimed.action_id {
            action::transition(&mut tx, action_id, ActionEvent::Complete).await?;
        }
        JobOutcome::Completed
    };
    job.worker.leases.release_in(&mut tx, job.lease()).await?;
    fault::cut(fault::BEFORE_COMPLETION_COMMIT, &mut tx).await;
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease());
    Ok(Completion::Done(outcome))
}

/// A limit was reached (at an intent or at completion): the request ends as the limit
/// says, with its admitting continuation, and the lease is released, in one fenced
/// transaction.
pub async fn breached(
    job: &Job,
    breach: &Breach,
    at: Moment,
    next: Option<&str>,
) -> Result<JobOutcome, JobError> {
    let write = || breached_once(job, breach, at, next);
    let landed = || durable::ended(job);
    durable::until_landed(job, "the end at a limit", write, landed).await
}

async fn breached_once(
    job: &Job,
    breach: &Breach,
    at: Moment,
    next: Option<&str>,
) -> Result<JobOutcome, JobError> {
    let mut tx = job.begin().await?;
    // Released first: ending may fence the epoch out (a stop at the checkpoint).
    job.worker.leases.release_in(&mut tx, job.lease()).await?;
    let continuation = job.claimed.continuation;
    let ended = limits::end_for(&mut tx, job.request_id(), continuation, breach, at, next).await?;
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease());
    tracing::info!(?breach, ?ended, "a limit of the contract was reached");
    Ok(claim::ended_outcome(ended))
}

/// Ends the job by `event` and releases the lease, in one fenced transaction; a step
/// left without a receipt is charged.
pub async fn finish(
    job: &Job,
    event: RequestEvent,
    reason: Option<&str>,
    step: Option<&str>,
) -> Result<(), JobError> {
    let write = || finish_once(job, event, reason, step);
    durable::until_landed(job, "the ending", write, || durable::released(job)).await
}

async fn finish_once(
    job: &Job,
    event: RequestEvent,
    reason: Option<&str>,
    step: Option<&str>,
) -> Result<(), JobError> {
    let mut tx = job.begin().await?;
    journal::charge_interrupted(&mut tx, job.request_id(), None).await?;
    request::transition(&mut tx, job.request_id(), event, reason, step).await?;
    match job.claimed.continuation {
        // A verification that ends without its completion fails its adoption and
        // handoff (or is cancelled with them).
        Continuation::Verification(adoption_id) => {
            let adoption = match event {
                RequestEvent::Cancel => AdoptionEvent::Cancel,
                _ => AdoptionEvent::Fail,
            };
            handoff::adoption_transition(&mut tx, adoption_id, adoption, reason).await?;
            handoff::fail_unless_passed(&mut tx, adoption_id).await?;
        }
        Continuation::Checkpoint(action_id) | Continuation::FinalOutcome(action_id) => {
            let action = match event {
                RequestEvent::Reconcile => ActionEvent::Reconcile,
                RequestEvent::Complete => ActionEvent::Complete,
                _ => ActionEvent::Fail,
            };
            action::transition(&mut tx, action_id, action).await?;
        }
        Continuation::None => {}
    }
    job.worker.leases.release_in(&mut tx, job.lease()).await?;
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease());
    Ok(())
}

/// The job was stopped mid-way: cancelled, drained, past its window or its pause, or
/// fenced.
pub async fn interrupted(job: &Job) -> Result<JobOutcome, JobError> {
    match job.cause() {
        Some(Reason::Cancelled) => {
            let reason = Some("cancelled while running");
            finish(job, RequestEvent::Cancel, reason, None).await?;
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
        Some(Reason::WindowEnded) => {
            breached(job, &Breach::WindowEnded, Moment::Intent, None).await
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
    let landed = || durable::ended(job);
    durable::until_landed(
        job,
        "the attempt's end",
        || end_attempt_once(job, error),
        landed,
    )
    .await
}

async fn end_attempt_once(job: &Job, error: &CustodyError) -> Result<JobOutcome, JobError> {
    let reason = error.ends_attempt().unwrap_or("attempt_ended");
    let mut tx = job.begin().await?;
    let continuation = job.claimed.continuation;
    let ended = request::end_attempt(&mut tx, job.request_id(), continuation, reason).await?;
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease());
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
    let write = || stop_after_pause_once(job);
    durable::until_landed(job, "the stop after a pause", write, || {
        durable::released(job)
    })
    .await
}

async fn stop_after_pause_once(job: &Job) -> Result<(), JobError> {
    let mut tx = job.begin().await?;
    job.worker.leases.release_in(&mut tx, job.lease()).await?;
    if let Some(action_id) = job.claimed.action_id {
        action::transition(&mut tx, action_id, ActionEvent::Fail).await?;
    }
    request::pause::clear(&mut tx, job.request_id()).await?;
    request::stop_at_checkpoint(&mut tx, job.request_id(), "pause_expired").await?;
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease());
    Ok(())
}

/// Drain: the request goes back to the queue at once, on the same attempt, for
/// another worker; a stopped step has no receipt and follows the unknown-outcome rule.
/// A checkpoint continuation goes back inside its window, or stops at its checkpoint.
pub async fn hand_back(job: &Job) -> Result<(), JobError> {
    let write = || hand_back_once(job);
    durable::until_landed(job, "the hand-back", write, || durable::released(job)).await
}

async fn hand_back_once(job: &Job) -> Result<(), JobError> {
    let mut tx = job.begin().await?;
    match job.claimed.continuation {
        Continuation::Checkpoint(action_id) => {
            if action::window_open(&mut tx, action_id).await? {
                request::fence_out(&mut tx, job.request_id()).await?;
                action::transition(&mut tx, action_id, ActionEvent::HandBack).await?;
                let message = JobMessage {
                    tenant: None,
                    kind: JobKind::CheckpointContinuation,
                    run_id: job.claimed.run_id,
                    request_id: job.request_id(),
                    action_id: Some(action_id),
                    attempt: Some(job.claimed.attempt),
                };
                request::readmit(&mut tx, &message, RequestEvent::Requeue).await?;
            } else {
                let reason = "continuation_window_ended";
                request::stop_at_checkpoint(&mut tx, job.request_id(), reason).await?;
                action::transition(&mut tx, action_id, ActionEvent::Fail).await?;
            }
        }
        _ => {
            request::requeue(&mut tx, job.request_id(), false).await?;
        }
    }
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease());
    Ok(())
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
        sandbox: serde_json::Value::Null,
        limit: None,
    }
}
