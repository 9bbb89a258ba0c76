//! The lease sweeper: one leader at a time (a PostgreSQL advisory lock held on its own
//! connection) finds requests whose lease lapsed and decides what happens next.
//!
//! - A plain run that was executing gets an automatic attempt through the outbox, up to
//!   `max_attempts`; after that it stops at its last checkpoint (`attempts_exhausted`).
//! - A run whose retained final report was never accepted needs reconciliation.
//! - A checkpoint continuation whose finite lease or window ended stops at its checkpoint
//!   again; only another reviewed continuation takes it further.
//! - A verification gets another attempt of the same adoption; with attempts spent, its
//!   handoff waits for a new adoption.
//! - A claim that never started (lapsed while still `queued`) is announced again.
//! - A queued request whose delivery is parked on a stalled worker is announced again
//!   ([`crate::parked`]).
//!
//! Every change moves the lease epoch on, so a paused former owner writes nothing.

use crate::parked;
use cairn_common::heartbeat;
use cairn_common::leader::{pause, Leadership};
use cairn_common::request::action::{self, ActionKind};
use cairn_common::request::cancel::cancel_now;
use cairn_common::request::limits::{self, Breach, Moment};
use cairn_common::request::requeue::{requeue_verification, verification_attempts_exhausted};
use cairn_common::request::{self, ActionEvent, Continuation, RequestEvent, RequestState};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use sqlx::postgres::PgConnection;
use sqlx::{Connection, PgPool};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The advisory lock key of the sweeper leader ("cairnswp").
const LEADER_LOCK: i64 = 0x6361_6972_6e73_7770;

#[derive(Clone, Default)]
pub struct SweeperMetrics {
    pub attempts_requeued: Counter,
    pub stopped_at_checkpoint: Counter,
    pub needs_reconciliation: Counter,
    pub claims_reannounced: Counter,
    pub parked_reannounced: Counter,
    pub windows_closed: Counter,
    pub sweeps: Counter,
}

impl SweeperMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        cairn_common::register_metrics!(registry;
            "sweeper_attempts_requeued", "Lapsed runs given another automatic attempt" => m.attempts_requeued;
            "sweeper_stopped_at_checkpoint", "Requests stopped at their last checkpoint" => m.stopped_at_checkpoint;
            "sweeper_needs_reconciliation", "Requests whose retained report awaits review" => m.needs_reconciliation;
            "sweeper_claims_reannounced", "Claims that lapsed before starting, announced again" => m.claims_reannounced;
            "sweeper_parked_reannounced", "Queued requests whose delivery was parked on a worker that did not take it, announced again" => m.parked_reannounced;
            "sweeper_windows_closed", "Continuation windows that ended unclaimed" => m.windows_closed;
            "sweeper_sweeps", "Sweeps run by the leader" => m.sweeps;
        );
        m
    }
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    pub requeued: u64,
    pub stopped: u64,
    pub reconciling: u64,
    pub reannounced: u64,
    pub parked: u64,
    pub cancelled: u64,
    pub windows_closed: u64,
}

#[derive(sqlx::FromRow)]
struct Lapsed {
    id: Uuid,
    run_id: Uuid,
    /// `run`, or `publication` (a request of its own, with no checkpoint).
    kind: String,
    state: RequestState,
    attempt: i32,
    max_attempts: i32,
    cancel_requested: bool,
    report_unaccepted: bool,
    executing_action: Option<Uuid>,
    queued_action_id: Option<Uuid>,
    queued_action_kind: Option<ActionKind>,
    queued_window_ended: bool,
    executing_verification: Option<Uuid>,
    queued_verification: Option<Uuid>,
}

/// One sweep, in one transaction per batch. Safe to run concurrently with itself
/// (rows are locked with SKIP LOCKED) but normally only the leader runs it. Each request
/// is handled in its own savepoint: a move the transition table refuses (the request
/// moved since it was read) changes nothing and the rest of the batch goes on.
pub async fn sweep_once(
    pool: &PgPool,
    batch: i64,
    metrics: &SweeperMetrics,
) -> Result<SweepReport, sqlx::Error> {
    let mut report = SweepReport::default();
    let mut tx = pool.begin().await?;
    let lapsed: Vec<Lapsed> = sqlx::query_as(&format!(
        "SELECT e.id, e.run_id, e.kind, e.state, e.attempt, e.max_attempts,
                e.cancel_requested_at IS NOT NULL AS cancel_requested,
                EXISTS (SELECT 1 FROM final_reports f WHERE f.request_id = e.id
                         AND NOT EXISTS (SELECT 1 FROM report_consumptions c WHERE c.request_id = e.id))
                  AS report_unaccepted,
                (SELECT a.id FROM continuation_actions a WHERE a.request_id = e.id AND a.status = 'executing'
                  ORDER BY a.created_at DESC LIMIT 1) AS executing_action,
                q.id AS queued_action_id, q.kind AS queued_action_kind,
                COALESCE(q.window_ends_at <= now(), FALSE) AS queued_window_ended,
                (SELECT v.id FROM verification_adoptions v WHERE v.execution_request_id = e.id AND v.status = 'executing'
                  ORDER BY v.created_at DESC LIMIT 1) AS executing_verification,
                (SELECT v.id FROM verification_adoptions v WHERE v.execution_request_id = e.id AND v.status = 'queued'
                  ORDER BY v.created_at DESC LIMIT 1) AS queued_verification
           FROM execution_requests e
           LEFT JOIN LATERAL (SELECT a.id, a.kind, a.window_ends_at FROM continuation_actions a
                               WHERE a.request_id = e.id AND a.status = 'queued'
                               ORDER BY a.created_at DESC LIMIT 1) q ON TRUE
          WHERE e.lease_owner IS NOT NULL AND e.kind IN ('run', 'publication')
            AND (e.lease_deadline < clock_timestamp() OR {owner_silent})
          ORDER BY e.lease_deadline
          LIMIT $1
            FOR UPDATE OF e SKIP LOCKED",
        owner_silent = heartbeat::owner_silent_sql("$2"),
    ))
    .bind(batch)
    .bind(heartbeat::lapse_ms())
    .fetch_all(&mut *tx)
    .await?;
    for l in lapsed {
        let mut savepoint = Connection::begin(&mut *tx).await?;
        let handled = handle_lapsed(&mut savepoint, &l, &mut report).await;
        settle(savepoint, l.id, handled).await?;
    }
    tx.commit().await?;

    // Continuation windows that ended before any worker claimed them: the action
    // expires (it admitted nothing) and the request is back where it was reviewed.
    let mut tx = pool.begin().await?;
    let expired: Vec<(Uuid, ActionKind, Uuid, RequestState)> = sqlx::query_as(
        "SELECT a.id, a.kind, a.request_id, e.state
           FROM continuation_actions a JOIN execution_requests e ON e.id = a.request_id
          WHERE a.status = 'queued' AND a.window_ends_at <= now()
            AND (e.lease_owner IS NULL OR e.lease_deadline < clock_timestamp())
          ORDER BY a.window_ends_at
          LIMIT $1
            FOR UPDATE OF e SKIP LOCKED",
    )
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    for (action_id, kind, request_id, state) in expired {
        let mut savepoint = Connection::begin(&mut *tx).await?;
        let ended = window_ended(&mut savepoint, action_id, kind, request_id, state).await;
        if settle(savepoint, request_id, ended).await? {
            report.windows_closed += 1;
        }
    }
    tx.commit().await?;

    report.parked = parked::announce_again(pool, batch).await?;

    metrics.attempts_requeued.inc_by(report.requeued);
    metrics.stopped_at_checkpoint.inc_by(report.stopped);
    metrics.needs_reconciliation.inc_by(report.reconciling);
    metrics.claims_reannounced.inc_by(report.reannounced);
    metrics.parked_reannounced.inc_by(report.parked);
    metrics.windows_closed.inc_by(report.windows_closed);
    metrics.sweeps.inc();
    Ok(report)
}

/// Ends one request's savepoint: commits what was done, or rolls it back; a refused
/// move is logged and skipped (`false`), a database error ends the sweep.
async fn settle(
    savepoint: sqlx::Transaction<'_, sqlx::Postgres>,
    request_id: Uuid,
    done: Result<(), request::Error>,
) -> Result<bool, sqlx::Error> {
    match done {
        Ok(()) => {
            savepoint.commit().await?;
            Ok(true)
        }
        Err(request::Error::Refused(refused)) => {
            savepoint.rollback().await?;
            tracing::warn!(request_id = %request_id.simple(), error = %refused, "the sweeper left a request that moved");
            Ok(false)
        }
        Err(request::Error::Db(e)) => Err(e),
    }
}

/// A queued action's window ended unclaimed: it expires, and its request (queued by it)
/// stops at its checkpoint again (or, for a report, waits for another review). A request
/// that is no longer queued by it keeps its state; only the action expires.
async fn window_ended(
    conn: &mut PgConnection,
    action_id: Uuid,
    kind: ActionKind,
    request_id: Uuid,
    state: RequestState,
) -> Result<(), request::Error> {
    if state != RequestState::Queued {
        action::transition(&mut *conn, action_id, ActionEvent::Expire).await?;
        return Ok(());
    }
    request::fence_out(&mut *conn, request_id).await?;
    let continuation = match kind {
        ActionKind::CheckpointContinuation => Continuation::Checkpoint(action_id),
        ActionKind::FinalOutcomeContinuation => Continuation::FinalOutcome(action_id),
    };
    let breach = Breach::WindowEnded;
    limits::end_for(conn, request_id, continuation, &breach, Moment::Claim, None).await?;
    Ok(())
}

async fn handle_lapsed(
    conn: &mut PgConnection,
    l: &Lapsed,
    report: &mut SweepReport,
) -> Result<(), request::Error> {
    let state = l.state;
    if l.cancel_requested && !state.is_terminal() {
        request::fence_out(&mut *conn, l.id).await?;
        cancel_now(&mut *conn, l.id, "cancelled; its worker stopped answering").await?;
        report.cancelled += 1;
        return Ok(());
    }
    match state {
        RequestState::Queued if l.queued_verification.is_some() => {
            let adoption = l.queued_verification.unwrap_or_default();
            requeue_verification(&mut *conn, l.run_id, l.id, adoption, l.attempt).await?;
            report.reannounced += 1;
        }
        RequestState::Queued => {
            // Claimed, then lost before it started: announce it again, same attempt,
            // unless the admitting window ended meanwhile.
            request::fence_out(&mut *conn, l.id).await?;
            let action = l.queued_action_id.zip(l.queued_action_kind);
            let mut message =
                request::requeue::queued_message(l.run_id, l.id, l.attempt, action, None);
            if action.is_none() {
                message.kind = request::job_kind_of(&l.kind);
            }
            let continuation = match action {
                Some((id, ActionKind::CheckpointContinuation)) => Continuation::Checkpoint(id),
                Some((id, ActionKind::FinalOutcomeContinuation)) => Continuation::FinalOutcome(id),
                None => Continuation::None,
            };
            if l.queued_window_ended && continuation != Continuation::None {
                let breach = Breach::WindowEnded;
                limits::end_for(conn, l.id, continuation, &breach, Moment::Claim, None).await?;
                report.windows_closed += 1;
                return Ok(());
            }
            request::readmit(&mut *conn, &message, RequestEvent::Requeue).await?;
            report.reannounced += 1;
        }
        RequestState::Executing if l.kind == "publication" => {
            lapsed_publication(conn, l, report).await?
        }
        RequestState::Executing => {
            if let Some(adoption) = l.executing_verification {
                lapsed_verification(&mut *conn, l, adoption, report).await?;
            } else if let Some(action) = l.executing_action {
                action::transition(&mut *conn, action, ActionEvent::Fail).await?;
                request::stop_at_checkpoint(&mut *conn, l.id, "continuation_lease_expired").await?;
                report.stopped += 1;
            } else if l.report_unaccepted {
                request::fence_out(&mut *conn, l.id).await?;
                let reason = Some("final_report_unaccepted");
                request::transition(&mut *conn, l.id, RequestEvent::Reconcile, reason, None)
                    .await?;
                report.reconciling += 1;
            } else if l.attempt < l.max_attempts {
                let attempt = request::requeue(&mut *conn, l.id, true).await?;
                tracing::info!(request_id = %l.id.simple(), attempt, "lease lapsed; automatic attempt queued");
                report.requeued += 1;
            } else {
                request::stop_at_checkpoint(&mut *conn, l.id, "attempts_exhausted").await?;
                tracing::info!(request_id = %l.id.simple(), "lease lapsed with attempts spent; stopped at its last checkpoint");
                report.stopped += 1;
            }
        }
        // Someone claimed a request with nothing to do and vanished: just clear it.
        _ => request::fence_out(&mut *conn, l.id).await?,
    }
    Ok(())
}

/// A publication whose worker vanished: another attempt while attempts remain (it
/// wrote nothing but, perhaps, an artifact the next one replaces), then it fails.
async fn lapsed_publication(
    conn: &mut PgConnection,
    l: &Lapsed,
    report: &mut SweepReport,
) -> Result<(), request::Error> {
    if l.attempt < l.max_attempts {
        request::requeue(&mut *conn, l.id, true).await?;
        report.requeued += 1;
        return Ok(());
    }
    request::fence_out(&mut *conn, l.id).await?;
    let reason = Some("publication_attempts_exhausted");
    request::transition(&mut *conn, l.id, RequestEvent::Fail, reason, None).await?;
    Ok(())
}

/// A verification whose worker vanished: another attempt of the same adoption while
/// attempts remain (checks with results are not run again); then the handoff waits for a
/// new adoption, and the request says why.
async fn lapsed_verification(
    conn: &mut PgConnection,
    l: &Lapsed,
    adoption: Uuid,
    report: &mut SweepReport,
) -> Result<(), request::Error> {
    if l.attempt < l.max_attempts {
        requeue_verification(&mut *conn, l.run_id, l.id, adoption, l.attempt + 1).await?;
        tracing::info!(request_id = %l.id.simple(), attempt = l.attempt + 1, "verification lease lapsed; queued again");
        report.requeued += 1;
        return Ok(());
    }
    verification_attempts_exhausted(&mut *conn, l.id, adoption).await?;
    report.stopped += 1;
    Ok(())
}

/// Runs the sweeper: competes for leadership, and sweeps every `interval` while leader.
pub async fn run(
    pool: PgPool,
    interval: Duration,
    metrics: SweeperMetrics,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        let Some(mut leadership) = Leadership::try_acquire(&pool, LEADER_LOCK).await else {
            pause(interval, &shutdown).await;
            continue;
        };
        tracing::info!("this scheduler leads the lease sweeper");
        while !shutdown.is_cancelled() {
            if let Err(e) = sweep_once(&pool, 500, &metrics).await {
                tracing::warn!(error = %e, "sweep failed");
            }
            if let Err(e) = crate::sandbox_sweep::sweep(&pool, 500).await {
                tracing::warn!(error = %e, "sandbox sweep failed");
            }
            if let Err(e) = crate::sandbox_expiry::expire(&pool, 500).await {
                tracing::warn!(error = %e, "sandbox timeouts not applied");
            }
            // Still leader? A lost connection means another may have taken over.
            if !leadership.still_held().await {
                tracing::warn!("sweeper lost its leader connection");
                break;
            }
            pause(interval, &shutdown).await;
        }
        leadership.release().await;
    }
}
