//! Claiming a request: the lease, then the decision whether the message still means
//! work (a stale or duplicate message is dropped), and the claim's own endings
//! (cancelled or past its deadline before it started; a retained report accepted).

use super::handle::{Claimed, JobOutcome};
use crate::context::Worker;
use crate::error::JobError;
use cairn_common::handoff::{self, AdoptionStatus, HandoffState};
use cairn_common::lease::LeaseError;
use cairn_common::report::{self, Acceptance};
use cairn_common::request::action::{self, ActionStatus};
use cairn_common::request::{self, RequestState};
use cairn_common::run::{JobKind, JobMessage, StepSpec};
use uuid::Uuid;

/// The result of a claim attempt.
pub enum Claim {
    Run(Box<Claimed>),
    Done(JobOutcome),
}

#[derive(sqlx::FromRow)]
struct RequestRow {
    state: RequestState,
    kind: String,
    run_id: Uuid,
    attempt: i32,
    steps: serde_json::Value,
    repository: Option<String>,
    git_ref: Option<String>,
    max_commands: i32,
    max_wall_seconds: i32,
    used_commands: i32,
    used_wall_ms: i64,
    cancel_requested: bool,
    deadline_passed: bool,
    queued_for_seconds: f64,
    agent: String,
    work_context_id: Uuid,
    deadline: Option<chrono::DateTime<chrono::Utc>>,
}

/// Claims the request a message announces and decides whether there is work. Only
/// after this returns may the delivery be acked.
#[tracing::instrument(skip_all, fields(request_id = %message.request_id, kind = ?message.kind))]
pub async fn claim(worker: &Worker, message: &JobMessage) -> Result<Claim, JobError> {
    let lease = match worker
        .leases
        .claim(message.request_id, &worker.settings.worker_id)
        .await
    {
        Ok(Some(lease)) => lease,
        Ok(None) => {
            return Ok(Claim::Done(JobOutcome::Dropped(
                "another worker holds the request".into(),
            )))
        }
        Err(LeaseError::NotFound(_)) => {
            return Ok(Claim::Done(JobOutcome::Dropped("unknown request".into())))
        }
        Err(e) => return Err(e.into()),
    };
    let mut tx = lease.begin_fenced(&worker.pool).await?;
    let row: RequestRow = sqlx::query_as(
        "SELECT e.state, e.kind, e.run_id, e.attempt, r.steps, r.repository, r.git_ref, e.max_commands,
                e.max_wall_seconds, e.used_commands, e.used_wall_ms,
                e.cancel_requested_at IS NOT NULL AS cancel_requested,
                COALESCE(r.deadline <= now(), FALSE) AS deadline_passed,
                EXTRACT(EPOCH FROM clock_timestamp() - e.queued_at)::float8 AS queued_for_seconds,
                r.agent, r.work_context_id, r.deadline
           FROM execution_requests e JOIN runs r ON r.id = e.run_id WHERE e.id = $1",
    )
    .bind(lease.request_id)
    .fetch_one(&mut *tx)
    .await?;
    let queued = row.state == RequestState::Queued && row.kind == "run";
    // A reviewed continuation or an adopted verification that owns the ticket now.
    let pending_action: Option<(Uuid, String)> = sqlx::query_as(
        "(SELECT id, kind, created_at FROM continuation_actions
           WHERE request_id = $1 AND status = 'queued' AND window_ends_at > now())
         UNION ALL
         (SELECT id, 'verification', created_at FROM verification_adoptions
           WHERE execution_request_id = $1 AND status = 'queued')
         ORDER BY created_at DESC LIMIT 1",
    )
    .bind(lease.request_id)
    .fetch_optional(&mut *tx)
    .await?;

    let work = match message.kind {
        // A plain run message is stale once a reviewed continuation owns the ticket.
        JobKind::Run if queued && pending_action.is_none() => true,
        JobKind::CheckpointContinuation
        | JobKind::FinalOutcomeContinuation
        | JobKind::Verification => {
            let expected = match message.kind {
                JobKind::CheckpointContinuation => "checkpoint_continuation",
                JobKind::FinalOutcomeContinuation => "final_outcome_continuation",
                _ => "verification",
            };
            queued
                && pending_action
                    .as_ref()
                    .is_some_and(|(id, kind)| Some(*id) == message.action_id && kind == expected)
        }
        JobKind::Run => false,
    };
    if !work {
        worker.leases.release_in(&mut tx, &lease).await?;
        tx.commit().await?;
        worker.leases.clear_liveness(&lease).await;
        return Ok(Claim::Done(JobOutcome::Dropped(format!(
            "nothing to do: request is {}",
            row.state
        ))));
    }
    worker.metrics.jobs_claimed.inc();
    worker
        .metrics
        .claim_latency_seconds
        .observe(row.queued_for_seconds.max(0.0));
    if row.cancel_requested {
        request::cancel::cancel_now(&mut tx, lease.request_id, "cancelled before it started")
            .await?;
    } else if row.deadline_passed {
        let reason = "the run's deadline passed before it started";
        request::set_state(
            &mut tx,
            lease.request_id,
            RequestState::Failed,
            Some(reason),
            None,
        )
        .await?;
        match pending_action {
            Some((adoption_id, kind)) if kind == "verification" => {
                handoff::set_adoption_status(
                    &mut tx,
                    adoption_id,
                    AdoptionStatus::Failed,
                    Some(reason),
                )
                .await?;
                handoff::set_handoff_state_of(&mut tx, adoption_id, HandoffState::Failed).await?;
            }
            Some((action_id, _)) => {
                action::set_status(&mut tx, action_id, ActionStatus::Failed).await?;
            }
            None => {}
        }
    }
    if row.cancel_requested || row.deadline_passed {
        worker.leases.release_in(&mut tx, &lease).await?;
        tx.commit().await?;
        worker.leases.clear_liveness(&lease).await;
        worker.metrics.jobs_failed.inc();
        return Ok(Claim::Done(if row.cancel_requested {
            JobOutcome::Cancelled
        } else {
            JobOutcome::Failed("the run's deadline passed before it started".into())
        }));
    }
    if message.kind == JobKind::FinalOutcomeContinuation {
        let acceptance = report::accept(
            &mut tx,
            &lease,
            message.action_id,
            &worker.settings.worker_id,
        )
        .await?;
        worker.leases.release_in(&mut tx, &lease).await?;
        tx.commit().await?;
        worker.leases.clear_liveness(&lease).await;
        let outcome = match acceptance {
            Acceptance::Accepted { .. } => {
                worker.metrics.jobs_completed.inc();
                JobOutcome::Accepted
            }
            Acceptance::Missing => {
                worker.metrics.jobs_failed.inc();
                JobOutcome::NeedsReconciliation("no retained report to accept".into())
            }
        };
        return Ok(Claim::Done(outcome));
    }
    request::set_state(
        &mut tx,
        lease.request_id,
        RequestState::Executing,
        None,
        None,
    )
    .await?;
    match (message.kind, message.action_id) {
        (JobKind::Verification, Some(adoption_id)) => {
            handoff::claim_adoption(&mut tx, adoption_id, lease.epoch).await?;
        }
        (_, Some(action_id)) => {
            action::claim(&mut tx, action_id, lease.epoch).await?;
        }
        (_, None) => {}
    }
    tx.commit().await?;
    worker.active.enter(lease.request_id).await;
    let steps: Vec<StepSpec> = serde_json::from_value(row.steps).unwrap_or_default();
    Ok(Claim::Run(Box::new(Claimed {
        lease,
        kind: message.kind,
        action_id: message.action_id,
        run_id: row.run_id,
        attempt: row.attempt,
        steps,
        repository: row.repository,
        git_ref: row.git_ref,
        max_commands: row.max_commands,
        max_wall_ms: i64::from(row.max_wall_seconds) * 1000,
        used_commands: row.used_commands,
        used_wall_ms: row.used_wall_ms,
        agent: row.agent,
        work_context: row.work_context_id,
        deadline: row.deadline,
    })))
}
