//! A run that needs a person: its uncertain steps, and the decisions an operator takes
//! on each (`mark_done`, `mark_not_done`, `fail_run`), each under a caller-owned id.

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::json::StrictJson;
use crate::api::path_id;
use crate::api::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::ids::Id;
use cairn_common::request::reconciliation::{
    self as decisions, NewDecision, Outcome, Refused, Saved, Verdict,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// The longest reason a decision keeps.
const MAX_REASON_CHARS: usize = 2000;

/// A decision as saved.
#[derive(Debug, Serialize, ToSchema)]
pub struct DecisionView {
    #[schema(value_type = String)]
    pub decision_id: Id,
    #[schema(value_type = String)]
    pub run_id: Id,
    #[schema(value_type = String)]
    pub request_id: Id,
    pub step_key: String,
    pub decision: Verdict,
    pub reason: String,
    /// The token that decided, and its name.
    #[schema(value_type = String)]
    pub decided_by: Id,
    pub decided_by_name: String,
    /// The lease epoch the decision fenced out: no holder of it can write again.
    pub fenced_epoch: i64,
    /// What the run did next: `queued` (it continues), `waiting` (other steps still need
    /// a decision) or `failed`.
    pub outcome: Outcome,
    pub created_at: DateTime<Utc>,
}

impl From<Saved> for DecisionView {
    fn from(s: Saved) -> Self {
        DecisionView {
            decision_id: s.id.into(),
            run_id: s.run_id.into(),
            request_id: s.request_id.into(),
            step_key: s.step_key,
            decision: s.decision,
            reason: s.reason,
            decided_by: s.decided_by.into(),
            decided_by_name: s.decided_by_name,
            fenced_epoch: s.fenced_epoch,
            outcome: s.outcome,
            created_at: s.created_at,
        }
    }
}

/// One step a person must decide, and what is known of it.
#[derive(Debug, Serialize, ToSchema, sqlx::FromRow)]
pub struct UncertainStep {
    pub step_key: String,
    pub step_index: i32,
    pub idempotent: bool,
    /// `unknown_outcome` (it started and its end was never recorded) or
    /// `tree_behind_journal` (its receipt stands on a tree its successor lacked).
    pub standing: String,
    /// Its intent: the epoch and attempt that started it, the worker, when.
    pub intent_epoch: i64,
    pub attempt: i32,
    pub worker: Option<String>,
    pub started_at: DateTime<Utc>,
    /// When its interruption was charged (its end as far as anyone knows).
    pub ended_at: Option<DateTime<Utc>>,
    /// What its receipt said, when it has one on a tree the successor lacked.
    pub exit_code: Option<i32>,
    pub stdout_tail: Option<String>,
    pub stderr_tail: Option<String>,
    /// Where its output so far is read (`?stream=stderr`, `?tail_bytes=N`).
    pub output_url: String,
}

/// What a run needs a person for.
#[derive(Debug, Serialize, ToSchema)]
pub struct Reconciliation {
    #[schema(value_type = String)]
    pub run_id: Id,
    #[schema(value_type = String)]
    pub request_id: Id,
    pub state: String,
    pub stop_reason: Option<String>,
    /// The steps still to decide, in plan order; empty unless the run needs a person.
    pub uncertain_steps: Vec<UncertainStep>,
    /// Every decision taken on this run, oldest first.
    pub decisions: Vec<DecisionView>,
}

/// A decision on one uncertain step.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionInput {
    pub step_key: String,
    pub decision: Verdict,
    /// Why, for the journal: 1 to 2000 characters.
    pub reason: String,
}

/// The list of a run's decisions.
#[derive(Debug, Serialize, ToSchema)]
pub struct DecisionList {
    pub decisions: Vec<DecisionView>,
}

/// What a run needs a person for: its uncertain steps and the decisions taken.
#[utoipa::path(get, operation_id = "get_run_reconciliation", tag = "runs", path = "/api/v1/runs/{run_id}/reconciliation",
    params(("run_id" = String, Path)),
    responses((status = 200, body = Reconciliation), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<Reconciliation>, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    let mut conn = state.pool.acquire().await?;
    let request: Option<(Uuid, String, Option<String>)> = sqlx::query_as(
        "SELECT id, state, stop_reason FROM execution_requests WHERE run_id = $1 AND kind = 'run'",
    )
    .bind(run_id)
    .fetch_optional(&mut *conn)
    .await?;
    let (request_id, request_state, stop_reason) =
        request.ok_or_else(|| ApiError::not_found("run"))?;
    let keys = decisions::undecided(&mut conn, request_id).await?;
    let uncertain_steps: Vec<UncertainStep> = sqlx::query_as(
        "SELECT i.step_key, i.step_index, i.idempotent,
                CASE WHEN r.step_key IS NULL THEN 'unknown_outcome' ELSE 'tree_behind_journal' END AS standing,
                i.lease_epoch AS intent_epoch, i.attempt, i.worker_id AS worker, i.started_at, i.ended_at,
                r.exit_code, r.stdout_tail, r.stderr_tail,
                '/api/v1/runs/' || $3 || '/steps/' || i.step_key || '/output' AS output_url
           FROM journal_intents i
           LEFT JOIN journal_receipts r ON r.request_id = i.request_id AND r.step_key = i.step_key
          WHERE i.request_id = $1 AND i.step_key = ANY($2)
          ORDER BY i.step_index",
    )
    .bind(request_id)
    .bind(&keys)
    .bind(run_id.simple().to_string())
    .fetch_all(&mut *conn)
    .await?;
    let taken = decisions::of_run(&mut conn, run_id).await?;
    Ok(Json(Reconciliation {
        run_id: run_id.into(),
        request_id: request_id.into(),
        state: cairn_common::request::RequestState::parse(&request_state)
            .map_or(request_state, |s| s.run_state().to_string()),
        stop_reason,
        uncertain_steps,
        decisions: taken.into_iter().map(DecisionView::from).collect(),
    }))
}

/// Every decision taken on a run, oldest first.
#[utoipa::path(get, operation_id = "list_reconciliation_decisions", tag = "runs", path = "/api/v1/runs/{run_id}/reconciliation/decisions",
    params(("run_id" = String, Path)),
    responses((status = 200, body = DecisionList), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<DecisionList>, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    let mut conn = state.pool.acquire().await?;
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM runs WHERE id = $1)")
        .bind(run_id)
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Err(ApiError::not_found("run"));
    }
    let taken = decisions::of_run(&mut conn, run_id).await?;
    Ok(Json(DecisionList {
        decisions: taken.into_iter().map(DecisionView::from).collect(),
    }))
}

/// Read one decision back (after a POST whose answer was lost).
#[utoipa::path(get, operation_id = "get_reconciliation_decision", tag = "runs", path = "/api/v1/runs/{run_id}/reconciliation/decisions/{decision_id}",
    params(("run_id" = String, Path), ("decision_id" = String, Path)),
    responses((status = 200, body = DecisionView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn read(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, decision_id)): Path<(String, String)>,
) -> Result<Json<DecisionView>, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    let decision_id = path_id(&decision_id, "decision_id")?;
    let mut conn = state.pool.acquire().await?;
    match decisions::find(&mut conn, decision_id).await? {
        Some(saved) if saved.run_id == run_id => Ok(Json(saved.into())),
        _ => Err(ApiError::not_found("decision")),
    }
}

/// Decide one uncertain step of a run that needs a person (operator). The id is the
/// caller's: save it before the POST, and repeat the same body to read the same receipt.
#[utoipa::path(post, operation_id = "create_reconciliation_decision", tag = "runs", path = "/api/v1/runs/{run_id}/reconciliation/decisions/{decision_id}",
    params(("run_id" = String, Path), ("decision_id" = String, Path, description = "Caller-owned, 32 lowercase hex")),
    request_body = DecisionInput,
    responses((status = 201, description = "Saved and applied", body = DecisionView),
        (status = 200, description = "This id saved the same decision before", body = DecisionView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn decide(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, decision_id)): Path<(String, String)>,
    StrictJson(input): StrictJson<DecisionInput>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let run_id = path_id(&run_id, "run_id")?;
    let decision_id = path_id(&decision_id, "decision_id")?;
    validate(&input)?;
    let new = NewDecision {
        id: decision_id,
        run_id,
        step_key: &input.step_key,
        decision: input.decision,
        reason: input.reason.trim(),
        decided_by: caller.token_id,
    };
    let mut tx = state.pool.begin().await?;
    let (saved, fresh) = decisions::decide(&mut tx, &new).await.map_err(refusal)?;
    tx.commit().await?;
    if fresh {
        tracing::info!(run = %run_id.simple(), step = %saved.step_key, decision = %saved.decision,
            outcome = %saved.outcome, by = %saved.decided_by_name, "reconciliation decision applied");
    }
    let status = if fresh {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(DecisionView::from(saved))).into_response())
}

fn validate(input: &DecisionInput) -> Result<(), ApiError> {
    if !cairn_common::run::valid_name(&input.step_key, 64) {
        return Err(ApiError::unprocessable(
            "step_key",
            "a step key is 1 to 64 letters, digits, '.', '_' or '-'",
        ));
    }
    let reason = input.reason.trim();
    if reason.is_empty() || reason.chars().count() > MAX_REASON_CHARS {
        return Err(ApiError::unprocessable(
            "reason",
            format!("say why, in 1 to {MAX_REASON_CHARS} characters: the journal keeps it"),
        ));
    }
    Ok(())
}

fn refusal(refused: Refused) -> ApiError {
    match refused {
        Refused::NoRun => ApiError::not_found("run"),
        Refused::IdReused(_) => ApiError::conflict(
            "decision_id_conflict",
            "this decision id was used earlier for another decision: read it back, or use a new id",
        )
        .with_field("decision_id"),
        Refused::NotAwaiting(state) => ApiError::conflict(
            "not_awaiting_reconciliation",
            format!(
                "the run is {}, not needs_reconciliation; nothing was changed",
                state.run_state()
            ),
        ),
        Refused::UnderContinuation => ApiError::conflict(
            "under_continuation",
            "the uncertain step ran under a reviewed continuation; a decision would not keep its window: cancel the run, or review its checkpoint again",
        ),
        Refused::NotUndecided { step, undecided } => ApiError::conflict(
            "step_not_undecided",
            format!(
                "step {step:?} has no outcome to decide (decided already, or never uncertain); undecided: {}",
                if undecided.is_empty() {
                    "none".to_string()
                } else {
                    undecided.join(", ")
                }
            ),
        )
        .with_field("step_key"),
        Refused::Db(e) => e.into(),
        Refused::Table(e) => e.into(),
    }
}
