//! One job: claim the request under a fenced lease, then run it — a run's plan, or an
//! adopted verification — with its lease keeper beside it, and record how it ended.
//!
//! - [`claim`](mod@claim): the claim and the decision whether a message still means work.
//! - [`handle`]: the [`Job`] handle, the claimed request and the outcome.
//! - [`plan`]: a run's steps on its acquired tree.
//! - [`ending`]: what each way of ending records.
//! - [`intent`]: a step's intent, under the contract's limits.
//! - [`folded`]: a plan's writes committed in custody's transactions: its first intent
//!   with its tree's record in use, its completion with its last receipt.
//! - [`durable`]: durable writes retried through database faults, within the lease.

pub mod claim;
pub mod durable;
pub mod ending;
pub mod folded;
pub mod handle;
pub mod intent;
pub mod plan;
pub mod retry;

pub use claim::{claim, Claim};
pub use handle::{Claimed, Job, JobOutcome};

use crate::context::Worker;
use crate::error::JobError;
use crate::keeper::{self, Reason, StopReason};
use crate::verification;
use cairn_common::request::Continuation;
use cairn_common::run::JobKind;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Runs a claimed request until it ends, is handed back on `drain`, or the lease is lost.
#[tracing::instrument(skip_all, fields(request_id = %claimed.lease.request_id.simple(), run_id = %claimed.run_id.simple(), attempt = claimed.attempt))]
pub async fn execute(
    worker: Arc<Worker>,
    claimed: Box<Claimed>,
    drain: CancellationToken,
) -> JobOutcome {
    let stop = CancellationToken::new();
    let cause = Arc::new(StopReason::default());
    let (pause_sender, pause) = tokio::sync::watch::channel(false);
    let watch = keeper::Watch {
        stop: stop.clone(),
        reason: cause.clone(),
        pause: pause_sender,
        window_ends_at: match claimed.continuation {
            Continuation::Checkpoint(_) => claimed.window_ends_at,
            _ => None,
        },
        signals: worker.signals.subscribe(claimed.lease.request_id),
    };
    let keeper = keeper::spawn(worker.clone(), claimed.lease.clone(), watch);
    let drain_watch = {
        let (stop, cause, drain) = (stop.clone(), cause.clone(), drain.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = drain.cancelled() => { cause.set(Reason::Drain); stop.cancel(); }
                _ = stop.cancelled() => {}
            }
        })
    };
    let job = Job::new(worker.clone(), *claimed, stop.clone(), cause, pause);
    let ran = match job.claimed.kind {
        JobKind::Verification => verification::run(&job).await,
        JobKind::Publication => crate::publication::run(&job).await,
        _ => plan::run(&job).await,
    };
    let outcome = match ran {
        Ok(outcome) => outcome,
        Err(JobError::Lease(e)) => {
            tracing::warn!(error = %e, "a durable write was refused: this worker no longer owns the request");
            worker.metrics.stale_writes_rejected.inc();
            worker.metrics.self_fenced.inc();
            JobOutcome::Fenced
        }
        Err(JobError::Refused(refused)) => {
            // The request moved under this job (a bug, or a writer outside the lease):
            // nothing was changed, and the lease lapses to the sweeper.
            tracing::error!(error = %refused, "the transition table refused this job's move");
            JobOutcome::Fenced
        }
        Err(e @ (JobError::Db(_) | JobError::Custody(_))) => {
            // The lease will lapse and the sweeper will give the request another attempt.
            tracing::error!(error = %e, "error while running a job; leaving it to the lease sweeper");
            JobOutcome::Fenced
        }
    };
    stop.cancel();
    keeper.stop().await;
    let _ = drain_watch.await;
    worker.active.leave(job.request_id()).await;
    match &outcome {
        JobOutcome::Completed | JobOutcome::AwaitingVerification | JobOutcome::ChecksPassed => {
            worker.metrics.jobs_completed.inc();
        }
        JobOutcome::HandedBack => {
            worker.metrics.jobs_handed_back.inc();
        }
        JobOutcome::Failed(_) | JobOutcome::NeedsReconciliation(_) | JobOutcome::Cancelled => {
            worker.metrics.jobs_failed.inc();
        }
        _ => {}
    }
    tracing::info!(outcome = ?outcome, "job ended");
    outcome
}
