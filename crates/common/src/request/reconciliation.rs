//! Reconciliation decisions: what a person decides about each step of a run whose
//! outcome is unknown (the run `needs_reconciliation`). The one writer of
//! `reconciliation_decisions`.
//!
//! A decision is saved under the caller's id in the transaction that applies it, on the
//! run's request locked and fenced (its lease epoch moves on, so whoever held it can
//! write nothing more). `mark_done` records a receipt by a person, `mark_not_done`
//! forgets the step's intent so it runs again, `fail_run` fails the run. Once no step is
//! left undecided, the request is queued again on the same attempt and budgets and
//! continues from its journal: nothing completed runs again.

use super::fence::fence_out;
use super::requeue::readmit;
use super::state::{transition, RequestState};
use super::table::{self, RequestEvent};
use crate::journal;
use crate::run::{JobKind, JobMessage};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use utoipa::ToSchema;
use uuid::Uuid;

crate::text_enum! {
    /// What a person decided about an uncertain step.
    #[derive(Serialize, Deserialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum Verdict {
        /// The effect happened: a receipt by a person, and the run goes on after it.
        MarkDone => "mark_done",
        /// The effect did not happen: the step runs again, once, on the same request.
        MarkNotDone => "mark_not_done",
        /// The run fails here.
        FailRun => "fail_run",
    }
}

crate::text_enum! {
    /// What the run did after a decision.
    #[derive(Serialize, Deserialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum Outcome {
        /// No step was left undecided: the run was queued to continue.
        Queued => "queued",
        /// Other steps still need a decision.
        Waiting => "waiting",
        /// The run failed (`fail_run`).
        Failed => "failed",
    }
}

/// A saved decision.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Saved {
    pub id: Uuid,
    pub run_id: Uuid,
    pub request_id: Uuid,
    pub step_key: String,
    pub decision: Verdict,
    pub reason: String,
    pub decided_by: Uuid,
    pub decided_by_name: String,
    pub fenced_epoch: i64,
    pub outcome: Outcome,
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, run_id, request_id, step_key, decision, reason, decided_by,
    decided_by_name, fenced_epoch, outcome, created_at";

/// What a caller asks.
#[derive(Debug, Clone)]
pub struct NewDecision<'a> {
    pub id: Uuid,
    pub run_id: Uuid,
    pub step_key: &'a str,
    pub decision: Verdict,
    pub reason: &'a str,
    /// The token that decides.
    pub decided_by: Uuid,
}

/// Why a decision was not applied; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the run has no execution request")]
    NoRun,
    /// The id was used before, for another decision.
    #[error("decision id {0} was used for another decision")]
    IdReused(Uuid),
    /// The run does not need a person now.
    #[error("the run is {0}, not needs_reconciliation")]
    NotAwaiting(RequestState),
    /// The uncertain step ran under a reviewed continuation, whose window a decision
    /// would not keep.
    #[error("the run's uncertain step ran under a reviewed continuation")]
    UnderContinuation,
    /// The step is not one a person must decide (already decided, or never uncertain).
    #[error("step {step:?} is not undecided; undecided: {undecided:?}")]
    NotUndecided {
        step: String,
        undecided: Vec<String>,
    },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Table(#[from] table::Error),
}

/// The request a run needs a person for, locked: `(request_id, state, step it stopped
/// on, attempt)`.
async fn lock_request(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Option<(Uuid, RequestState, Option<String>, i32)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, state, reconciliation_step, attempt FROM execution_requests
          WHERE run_id = $1 AND kind = 'run' FOR UPDATE",
    )
    .bind(run_id)
    .fetch_optional(conn)
    .await
}

/// The steps of a run's request still to decide, in plan order (none unless it needs a
/// person).
pub async fn undecided(
    conn: &mut PgConnection,
    request_id: Uuid,
) -> Result<Vec<String>, sqlx::Error> {
    let (state, stopped_on): (RequestState, Option<String>) =
        sqlx::query_as("SELECT state, reconciliation_step FROM execution_requests WHERE id = $1")
            .bind(request_id)
            .fetch_one(&mut *conn)
            .await?;
    if state != RequestState::NeedsReconciliation {
        return Ok(Vec::new());
    }
    journal::undecided(conn, request_id, stopped_on.as_deref()).await
}

/// Saves and applies a decision, in the caller's transaction; `(decision, true)` when
/// it is new, `(decision, false)` when this id already saved the same one.
pub async fn decide(
    conn: &mut PgConnection,
    new: &NewDecision<'_>,
) -> Result<(Saved, bool), Refused> {
    let (request_id, state, stopped_on, attempt) = lock_request(&mut *conn, new.run_id)
        .await?
        .ok_or(Refused::NoRun)?;
    if let Some(saved) = find(&mut *conn, new.id).await? {
        let same = saved.run_id == new.run_id
            && saved.step_key == new.step_key
            && saved.decision == new.decision
            && saved.reason == new.reason;
        return if same {
            Ok((saved, false))
        } else {
            Err(Refused::IdReused(new.id))
        };
    }
    if state != RequestState::NeedsReconciliation {
        return Err(Refused::NotAwaiting(state));
    }
    if under_continuation(&mut *conn, request_id).await? {
        return Err(Refused::UnderContinuation);
    }
    let undecided = journal::undecided(&mut *conn, request_id, stopped_on.as_deref()).await?;
    if !undecided.iter().any(|s| s == new.step_key) {
        return Err(Refused::NotUndecided {
            step: new.step_key.to_string(),
            undecided,
        });
    }
    let outcome = match new.decision {
        Verdict::FailRun => Outcome::Failed,
        _ if undecided.len() == 1 => Outcome::Queued,
        _ => Outcome::Waiting,
    };
    let forgotten = step_record(&mut *conn, request_id, new.step_key).await?;
    let fenced_epoch = epoch(&mut *conn, request_id).await?;
    fence_out(&mut *conn, request_id).await?;
    let saved = save(&mut *conn, new, request_id, fenced_epoch, outcome).await?;
    let epoch = fenced_epoch + 1;
    apply(&mut *conn, new, request_id, epoch).await?;
    if stopped_on.as_deref() == Some(new.step_key) {
        // Decided: a later stop on it (after an earlier step ran again) names it anew.
        sqlx::query("UPDATE execution_requests SET reconciliation_step = NULL WHERE id = $1")
            .bind(request_id)
            .execute(&mut *conn)
            .await?;
    }
    let body = serde_json::json!({
        "decision_id": new.id.simple().to_string(),
        "step_key": new.step_key,
        "decision": new.decision,
        "reason": new.reason,
        "decided_by": new.decided_by.simple().to_string(),
        "decided_by_name": saved.decided_by_name,
        "outcome": outcome,
        "step_before": forgotten,
    });
    journal::entry_at(
        &mut *conn,
        request_id,
        epoch,
        "reconciliation_decision",
        &body,
    )
    .await?;
    if outcome == Outcome::Queued {
        let message = JobMessage {
            tenant: None,
            kind: JobKind::Run,
            run_id: new.run_id,
            request_id,
            action_id: None,
            attempt: Some(attempt),
        };
        readmit(conn, &message, RequestEvent::ContinueReconciled).await?;
    }
    Ok((saved, true))
}

/// What the decision does to the journal (or the run), under the fenced `epoch`.
async fn apply(
    conn: &mut PgConnection,
    new: &NewDecision<'_>,
    request_id: Uuid,
    epoch: i64,
) -> Result<(), Refused> {
    match new.decision {
        Verdict::MarkDone => {
            journal::record_marked_done(&mut *conn, request_id, new.step_key, epoch, new.id).await?
        }
        Verdict::MarkNotDone => journal::forget_step(&mut *conn, request_id, new.step_key).await?,
        Verdict::FailRun => {
            let reason = format!("failed_by_operator: step {}", new.step_key);
            transition(
                &mut *conn,
                request_id,
                RequestEvent::FailReconciled,
                Some(&reason),
                None,
            )
            .await?;
        }
    }
    Ok(())
}

/// Whether the request's latest reviewed continuation ended needing a person.
async fn under_continuation(
    conn: &mut PgConnection,
    request_id: Uuid,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM continuation_actions
                         WHERE request_id = $1 AND status = 'needs_reconciliation')",
    )
    .bind(request_id)
    .fetch_one(conn)
    .await
}

async fn epoch(conn: &mut PgConnection, request_id: Uuid) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT lease_epoch FROM execution_requests WHERE id = $1")
        .bind(request_id)
        .fetch_one(conn)
        .await
}

/// What the journal held of the step before the decision (its intent and any receipt),
/// kept in the decision's journal entry.
async fn step_record(
    conn: &mut PgConnection,
    request_id: Uuid,
    step_key: &str,
) -> Result<serde_json::Value, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT jsonb_build_object(
                  'intent_epoch', i.lease_epoch, 'attempt', i.attempt, 'worker', i.worker_id,
                  'started_at', i.started_at, 'ended_at', i.ended_at,
                  'receipt_epoch', r.lease_epoch, 'exit_code', r.exit_code,
                  'snapshot_id', r.snapshot_id)
           FROM journal_intents i
           LEFT JOIN journal_receipts r ON r.request_id = i.request_id AND r.step_key = i.step_key
          WHERE i.request_id = $1 AND i.step_key = $2",
    )
    .bind(request_id)
    .bind(step_key)
    .fetch_one(conn)
    .await
}

async fn save(
    conn: &mut PgConnection,
    new: &NewDecision<'_>,
    request_id: Uuid,
    fenced_epoch: i64,
    outcome: Outcome,
) -> Result<Saved, Refused> {
    sqlx::query_as(&format!(
        "INSERT INTO reconciliation_decisions (id, run_id, request_id, step_key, decision, reason,
                decided_by, decided_by_name, fenced_epoch, outcome)
         VALUES ($1, $2, $3, $4, $5, $6, $7,
                 COALESCE((SELECT name FROM api_tokens WHERE id = $7), 'unknown token'), $8, $9)
      RETURNING {COLUMNS}"
    ))
    .bind(new.id)
    .bind(new.run_id)
    .bind(request_id)
    .bind(new.step_key)
    .bind(new.decision)
    .bind(new.reason)
    .bind(new.decided_by)
    .bind(fenced_epoch)
    .bind(outcome)
    .fetch_one(conn)
    .await
    .map_err(|e| match e {
        // The same id, saved at once for another run's decision.
        sqlx::Error::Database(d) if d.is_unique_violation() => Refused::IdReused(new.id),
        e => Refused::Db(e),
    })
}

/// The decision with this id.
pub async fn find(conn: &mut PgConnection, id: Uuid) -> Result<Option<Saved>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM reconciliation_decisions WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await
}

/// Every decision on a run, oldest first.
pub async fn of_run(conn: &mut PgConnection, run_id: Uuid) -> Result<Vec<Saved>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM reconciliation_decisions WHERE run_id = $1 ORDER BY created_at, id"
    ))
    .bind(run_id)
    .fetch_all(conn)
    .await
}
