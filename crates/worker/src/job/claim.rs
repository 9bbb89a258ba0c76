//! Claiming a request: the lease, then the decision whether the message still means
//! work (a stale or duplicate message is dropped), and the claim's own endings
//! (cancelled or past its deadline before it started; a retained report accepted).

use super::handle::{Claimed, JobOutcome};
use crate::context::Worker;
use crate::error::JobError;
use cairn_common::egress::NetworkSpec;
use cairn_common::handoff;
use cairn_common::journal;
use cairn_common::lease::{Lease, LeaseError};
use cairn_common::report::{self, Acceptance};
use cairn_common::request::action;
use cairn_common::request::limits::{self, Ended, Limits, Moment};
use cairn_common::request::{self, Continuation, RequestEvent, RequestState};
use cairn_common::run::{JobKind, JobMessage, StepSpec};
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

/// The result of a claim attempt.
pub enum Claim {
    Run(Box<Claimed>),
    Done(JobOutcome),
    /// The request is still queued but cannot be claimed now: flow control holds it, or
    /// a lease is still on it. The delivery comes back a little later rather than be
    /// lost.
    Later,
}

#[derive(sqlx::FromRow)]
struct RequestRow {
    tenant_id: String,
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
    queued_for_seconds: f64,
    agent: String,
    work_context_id: Uuid,
    deadline: Option<chrono::DateTime<chrono::Utc>>,
    admission_id: Option<Uuid>,
    admission_kind: Option<String>,
    window_ends_at: Option<chrono::DateTime<chrono::Utc>>,
    tenant_network: Option<sqlx::types::Json<NetworkSpec>>,
    journaled: bool,
    /// The limits as they stand, read with the row.
    #[sqlx(flatten)]
    limits: Limits,
}

impl RequestRow {
    fn admission(&self) -> Option<Admission> {
        let (id, kind) = (self.admission_id?, self.admission_kind.clone()?);
        Some(Admission {
            id,
            kind,
            window_ends_at: self.window_ends_at,
        })
    }
}

/// What admitted the queued request: a reviewed continuation or an adopted verification
/// that owns the ticket now (its window open or not).
struct Admission {
    id: Uuid,
    kind: String,
    window_ends_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl Admission {
    fn continuation(&self) -> Continuation {
        match self.kind.as_str() {
            "checkpoint_continuation" => Continuation::Checkpoint(self.id),
            "final_outcome_continuation" => Continuation::FinalOutcome(self.id),
            _ => Continuation::Verification(self.id),
        }
    }

    fn job_kind(&self) -> JobKind {
        match self.kind.as_str() {
            "checkpoint_continuation" => JobKind::CheckpointContinuation,
            "final_outcome_continuation" => JobKind::FinalOutcomeContinuation,
            _ => JobKind::Verification,
        }
    }
}

/// Claims the request a message announces and decides whether there is work. Only
/// after this returns may the delivery be acked.
#[tracing::instrument(skip_all, fields(request_id = %message.request_id.simple(), kind = ?message.kind))]
pub async fn claim(worker: &Worker, message: &JobMessage) -> Result<Claim, JobError> {
    // The lease is taken inside the claim's own transaction: the epoch's move and what
    // the claim decides commit together, or not at all, and the row stays locked until
    // then, so no fence check is needed in between.
    let mut tx = worker.pool.begin().await?;
    let (lease, previous_deadline) = match take(worker, &mut tx, message).await? {
        Ok(taken) => taken,
        Err(done) => return Ok(done),
    };
    // A step the last owner left running is charged up to that owner's deadline. The
    // first claim (epoch 1) had no last owner, so no step that one could have left.
    if lease.epoch > 1 {
        journal::charge_interrupted(&mut tx, lease.request_id, previous_deadline).await?;
    }
    // Whatever admitted the ticket, its window open or ended, is read with the request:
    // a plain run message is stale as long as a continuation or an adoption owns it.
    let row = read_row(&mut tx, lease.request_id).await?;
    // An announcement naming another tenant than the run's carries no work: it is
    // dropped unclaimed, and the request, still queued, is announced again from its row.
    let tenant_matches = row.tenant_id == message.tenant();
    if !tenant_matches {
        worker.metrics.tenant_mismatches.inc();
    }
    let admission = row.admission();
    if !means_work(message, &row, admission.as_ref(), tenant_matches) {
        worker.leases.release_in(&mut tx, &lease).await?;
        tx.commit().await?;
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
    let continuation = admission
        .as_ref()
        .map_or(Continuation::None, Admission::continuation);
    if let Some(breach) = row.limits.breach(Moment::Claim) {
        let at = Moment::Claim;
        // Released first: ending may fence the epoch out (a stop at the checkpoint).
        worker.leases.release_in(&mut tx, &lease).await?;
        let ended =
            limits::end_for(&mut tx, lease.request_id, continuation, &breach, at, None).await?;
        tx.commit().await?;
        worker.metrics.jobs_failed.inc();
        return Ok(Claim::Done(ended_outcome(ended)));
    }
    if message.kind == JobKind::FinalOutcomeContinuation {
        return accept_report(worker, tx, &lease, message.action_id).await;
    }
    request::transition(&mut tx, lease.request_id, RequestEvent::Claim, None, None).await?;
    match continuation {
        Continuation::Verification(adoption_id) => {
            handoff::claim_adoption(&mut tx, adoption_id, lease.epoch).await?;
        }
        Continuation::Checkpoint(action_id) | Continuation::FinalOutcome(action_id) => {
            action::claim(&mut tx, action_id, lease.epoch).await?;
        }
        Continuation::None => {}
    }
    crate::fault::cut(crate::fault::INSIDE_CLAIM, &mut tx).await;
    tx.commit().await?;
    worker.leases.announce(&lease).await;
    worker.active.enter(lease.request_id).await;
    let window_ends_at = admission.and_then(|a| a.window_ends_at);
    Ok(Claim::Run(Box::new(claimed(
        lease,
        message,
        continuation,
        window_ends_at,
        row,
    ))))
}

/// The request's lease, and the deadline of the owner it was taken over from; or what
/// the message came to when there is no lease to take.
async fn take(
    worker: &Worker,
    conn: &mut PgConnection,
    message: &JobMessage,
) -> Result<Result<(Lease, Option<DateTime<Utc>>), Claim>, JobError> {
    let claimed = worker
        .leases
        .take_in(&mut *conn, message.request_id, &worker.settings.worker_id)
        .await;
    match claimed {
        Ok(Some(taken)) => Ok(Ok((taken.lease, taken.previous_deadline))),
        Ok(None) => {
            let state: Option<RequestState> =
                sqlx::query_scalar("SELECT state FROM execution_requests WHERE id = $1")
                    .bind(message.request_id)
                    .fetch_optional(&mut *conn)
                    .await?;
            Ok(Err(match state {
                Some(RequestState::Queued) => Claim::Later,
                Some(state) => Claim::Done(JobOutcome::Dropped(format!(
                    "nothing to do: request is {state}"
                ))),
                None => Claim::Done(JobOutcome::Dropped("unknown request".into())),
            }))
        }
        Err(LeaseError::NotFound(_)) => Ok(Err(Claim::Done(JobOutcome::Dropped(
            "unknown request".into(),
        )))),
        Err(e) => Err(e.into()),
    }
}

/// The request as its claim decides on it, with whatever admitted its ticket.
async fn read_row(conn: &mut PgConnection, request_id: Uuid) -> Result<RequestRow, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT r.tenant_id, e.state, e.kind, e.run_id, e.attempt, r.steps, r.repository, r.git_ref, e.max_commands,
                e.max_wall_seconds, e.used_commands, e.used_wall_ms,
                EXTRACT(EPOCH FROM clock_timestamp() - e.queued_at)::float8 AS queued_for_seconds,
                r.agent, r.work_context_id, r.deadline,
                a.id AS admission_id, a.kind AS admission_kind, a.window_ends_at,
                {} AS tenant_network,
                EXISTS (SELECT 1 FROM journal_intents j WHERE j.request_id = e.id) AS journaled,
                {}
           FROM execution_requests e JOIN runs r ON r.id = e.run_id
           LEFT JOIN LATERAL (
                (SELECT id, kind, window_ends_at, created_at FROM continuation_actions
                  WHERE request_id = e.id AND status = 'queued')
                UNION ALL
                (SELECT id, 'verification', NULL, created_at FROM verification_adoptions
                  WHERE execution_request_id = e.id AND status = 'queued')
                ORDER BY created_at DESC LIMIT 1) a ON TRUE
          WHERE e.id = $1",
        cairn_common::network_policy::of_tenant("r.tenant_id"),
        // A verification's adoption has no window: its row gives NULL.
        limits::conditions("a.window_ends_at"),
    ))
    .bind(request_id)
    .fetch_one(conn)
    .await
}

/// Whether a message still means work: its request queued, of its tenant, and the
/// message the one that admitted it (a plain run message is stale while a continuation
/// or an adoption owns the ticket).
fn means_work(
    message: &JobMessage,
    row: &RequestRow,
    admission: Option<&Admission>,
    tenant_matches: bool,
) -> bool {
    // A publication is a request of its own kind; everything else runs on the run's.
    let kind = match message.kind {
        JobKind::Publication => "publication",
        _ => "run",
    };
    let queued = row.state == RequestState::Queued && row.kind == kind && tenant_matches;
    match (message.kind, admission) {
        (JobKind::Run | JobKind::Publication, None) => queued,
        (JobKind::Run | JobKind::Publication, Some(_)) => false,
        (kind, Some(a)) => queued && Some(a.id) == message.action_id && a.job_kind() == kind,
        (_, None) => false,
    }
}

/// A final-outcome continuation's claim: the retained report accepted (or found
/// missing) and the lease released, in the claim's transaction.
async fn accept_report(
    worker: &Worker,
    mut tx: Transaction<'static, Postgres>,
    lease: &Lease,
    action_id: Option<Uuid>,
) -> Result<Claim, JobError> {
    let worker_id = &worker.settings.worker_id;
    let acceptance = report::accept(&mut tx, lease, action_id, worker_id).await?;
    worker.leases.release_in(&mut tx, lease).await?;
    tx.commit().await?;
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
    Ok(Claim::Done(outcome))
}

/// What the job knows of its claimed request.
fn claimed(
    lease: Lease,
    message: &JobMessage,
    continuation: Continuation,
    window_ends_at: Option<DateTime<Utc>>,
    row: RequestRow,
) -> Claimed {
    let steps: Vec<StepSpec> = serde_json::from_value(row.steps).unwrap_or_default();
    Claimed {
        lease,
        kind: message.kind,
        action_id: message.action_id,
        continuation,
        window_ends_at,
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
        tenant_network: row.tenant_network.map(|n| n.0),
        journaled: row.journaled,
    }
}

/// The outcome of a request ended for a limit.
pub fn ended_outcome(ended: Ended) -> JobOutcome {
    match ended {
        Ended::Cancelled => JobOutcome::Cancelled,
        Ended::StoppedAtCheckpoint => JobOutcome::StoppedAtCheckpoint,
        Ended::NeedsReconciliation => {
            JobOutcome::NeedsReconciliation("continuation_window_ended".into())
        }
        Ended::Failed(reason) => JobOutcome::Failed(reason),
    }
}
