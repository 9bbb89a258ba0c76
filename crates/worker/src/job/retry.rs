//! A step that failed under its retry policy: its run is queued again on the same
//! attempt, held by the scheduler's gate until its backoff has passed, so no worker slot
//! waits with it. The failure is journaled (`step_retry`: which execution of how many,
//! how it ended, when the next one may start) and the step's own record leaves the
//! journal, so the next claim runs it again on the tree of the last checkpoint.

use super::durable;
use super::handle::{Job, JobOutcome};
use crate::error::JobError;
use cairn_common::journal::{self, Outcome};
use cairn_common::request::{self, gate, Continuation, RequestEvent};
use cairn_common::run::StepSpec;
use cairn_common::step_retry::Ended;
use chrono::{DateTime, Utc};
use serde_json::json;

/// A retry to schedule.
#[derive(Debug, Clone)]
pub struct Retry {
    pub step_key: String,
    /// Failed executions so far, this one included.
    pub failures: u32,
    pub max_attempts: u32,
    pub next_at: DateTime<Utc>,
    pub outcome: Outcome,
}

/// How a failed step ended, as a retry policy asks.
pub fn ended(outcome: &Outcome) -> Ended {
    match (
        outcome.timed_out,
        outcome.limit.as_deref(),
        outcome.signal,
        outcome.exit_code,
    ) {
        (true, _, _, _) => Ended::Timeout,
        (_, Some("memory_limit"), _, _) => Ended::Oom,
        (_, Some(_), _, _) | (_, _, Some(_), _) => Ended::Other,
        (_, None, None, Some(code)) => Ended::Exit(code),
        _ => Ended::Other,
    }
}

/// Whether the failed step runs again, and when: its policy names this failure, it has
/// executions left, no cancel was asked and the wait ends before the run's deadline. A
/// run under a reviewed continuation or a verification never retries (its window or
/// adoption is not kept across the wait).
pub async fn plan(
    job: &Job,
    step: &StepSpec,
    outcome: &Outcome,
) -> Result<Option<Retry>, JobError> {
    let Some(policy) = &step.retry else {
        return Ok(None);
    };
    if job.claimed.continuation != Continuation::None || !policy.retries(ended(outcome)) {
        return Ok(None);
    }
    // Failures so far; whether a cancel was asked; the run's deadline.
    let (before, cancelled, deadline): (i64, bool, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM journal_entries
                  WHERE request_id = e.id AND entry_kind = 'step_retry' AND body->>'step_key' = $2),
                e.cancel_requested_at IS NOT NULL, r.deadline
           FROM execution_requests e JOIN runs r ON r.id = e.run_id WHERE e.id = $1",
    )
    .bind(job.request_id())
    .bind(&step.key)
    .fetch_one(&job.worker.pool)
    .await?;
    let failures = u32::try_from(before).unwrap_or(u32::MAX).saturating_add(1);
    if failures >= policy.max_attempts || cancelled {
        return Ok(None);
    }
    // Jitter from a fresh random id: no generator of our own to seed.
    let random = uuid::Uuid::new_v4().as_u128() as f64 / u128::MAX as f64;
    let wait = policy.delay(failures, random);
    let next_at = Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default();
    // A wait past the deadline would only end in the deadline's failure.
    if deadline.is_some_and(|d| d <= next_at) {
        return Ok(None);
    }
    Ok(Some(Retry {
        step_key: step.key.clone(),
        failures,
        max_attempts: policy.max_attempts,
        next_at,
        outcome: outcome.clone(),
    }))
}

/// Journals the failure, forgets the step, queues the request held until the retry's
/// time and releases the lease, in one fenced transaction.
pub async fn schedule(job: &Job, retry: &Retry) -> Result<JobOutcome, JobError> {
    let write = || async {
        schedule_once(job, retry).await?;
        Ok(JobOutcome::HandedBack)
    };
    let landed = || async {
        Ok(durable::released(job)
            .await?
            .map(|()| JobOutcome::HandedBack))
    };
    durable::until_landed(job, "the step's retry", write, landed).await
}

async fn schedule_once(job: &Job, retry: &Retry) -> Result<(), JobError> {
    let o = &retry.outcome;
    let body = json!({
        "step_key": retry.step_key,
        "failure": retry.failures,
        "max_attempts": retry.max_attempts,
        "exit_code": o.exit_code,
        "signal": o.signal,
        "timed_out": o.timed_out,
        "limit": o.limit,
        "wall_ms": o.wall_ms,
        "stdout_tail": o.stdout_tail,
        "stderr_tail": o.stderr_tail,
        "output_digest": o.output_digest,
        // Where the worker kept the failed execution's whole output.
        "output_artifact": o.output_artifact,
        "lease_epoch": job.lease().epoch,
        "next_attempt_at": retry.next_at,
    });
    let reason = format!(
        "step {} failed ({} of {} executions); it runs again from {}",
        retry.step_key,
        retry.failures,
        retry.max_attempts,
        retry.next_at.to_rfc3339()
    );
    let request_id = job.request_id();
    let mut tx = job.begin().await?;
    journal::entry(&mut tx, job.lease(), "step_retry", &body).await?;
    journal::forget_step(&mut tx, request_id, &retry.step_key).await?;
    request::transition(
        &mut tx,
        request_id,
        RequestEvent::RetryStep,
        Some(&reason),
        None,
    )
    .await?;
    gate::hold_until(&mut tx, request_id, retry.next_at).await?;
    job.worker.leases.release_in(&mut tx, job.lease()).await?;
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease());
    tracing::info!(step = %retry.step_key, failure = retry.failures, of = retry.max_attempts,
        next_attempt_at = %retry.next_at.to_rfc3339(), "the step failed and runs again after its backoff");
    Ok(())
}
