//! Reviewed continuations of saved work: candidates, actions and status, for both kinds.
//!
//! A **checkpoint continuation** lets a request that stopped at its retained checkpoint
//! continue on the same ticket (same attempt, budgets and charged usage). A
//! **final-outcome continuation** lets a worker accept a retained final report without
//! re-running anything; its window is for claiming only. A candidate starts no work;
//! an action is saved once per caller-owned id and admits the existing ticket through
//! the outbox.
//!
//! - [`candidate`](mod@candidate): the rules, as a function of the facts and the policy.
//! - [`action`]: the strict action bodies and the saved action's view.

pub mod action;
pub mod candidate;

pub use action::{
    ActionView, CheckpointContinuationInputV1, FinalOutcomeContinuationInputV1, FiniteLease,
};
pub use candidate::{Candidate, ChargedUsage, Hold, HoldReason, Kind, Limits, RetainedOutcome};

use action::{action_view, ActionInput};
use candidate::{Facts, Qualification, Report};

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::json::StrictJson;
use super::path_id;
use super::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::digest;
use cairn_common::journal;
use cairn_common::lineage;
use cairn_common::policy::{self, Policy, MAX_WINDOW_SECONDS};
use cairn_common::qualification;
use cairn_common::request::action::{self as saved, NewAction};
use cairn_common::request::{self, RequestEvent};
use cairn_common::run::JobMessage;
use chrono::Utc;
use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

/// Gathers what the candidate is computed from; locked when `lock` (an admission).
async fn facts(
    conn: &mut PgConnection,
    run_id: Uuid,
    request_id: Uuid,
    lock: bool,
) -> Result<Option<Facts>, sqlx::Error> {
    let sql = format!(
        "SELECT r.id AS run_id, e.id AS request_id, e.state, e.attempt, e.max_attempts, e.lease_epoch,
                COALESCE(e.lease_owner IS NOT NULL AND e.lease_deadline > clock_timestamp(), FALSE) AS live_owner,
                e.max_commands, e.max_wall_seconds, e.used_commands, e.used_wall_ms, e.used_cpu_ms,
                e.checkpoint, {journal_source} AS journal_source, {current} AS source_digest,
                r.deadline, r.operator_id,
                (EXISTS (SELECT 1 FROM journal_receipts jr
                          WHERE jr.request_id = e.id AND jr.snapshot_id IS NOT NULL)
                 AND NOT EXISTS (SELECT 1 FROM lineage_heads h JOIN project_snapshots s ON s.id = h.head_id
                                  WHERE h.work_context_id = r.work_context_id AND h.retired_at IS NULL
                                    AND s.status = 'ready' AND s.retention = 'current')) AS checkpoint_reclaimed,
                COALESCE(t.revoked_at IS NOT NULL, FALSE) AS operator_revoked, t.role AS operator_role
           FROM execution_requests e
           JOIN runs r ON r.id = e.run_id
           LEFT JOIN api_tokens t ON t.id = r.operator_id
          WHERE e.id = $1 AND e.run_id = $2 AND e.kind = 'run'{lock}",
        journal_source = journal::source_sql("e.id", "r.work_context_id", "$3"),
        current = lineage::current_tree_sql("r.work_context_id", "$3"),
        lock = if lock { " FOR UPDATE OF e" } else { "" }
    );
    let found: Option<Facts> = sqlx::query_as(&sql)
        .bind(request_id)
        .bind(run_id)
        .bind(lineage::empty_tree_digest())
        .fetch_optional(&mut *conn)
        .await?;
    let Some(mut facts) = found else {
        return Ok(None);
    };
    facts.unknown_effects = journal::unknown_outcomes(conn, request_id, "")
        .await?
        .into_iter()
        .filter(|(_, idempotent)| !idempotent)
        .map(|(key, _)| key)
        .collect();
    facts.journal_digest = journal::digest(conn, request_id).await?;
    let report: Option<(String, Option<String>, serde_json::Value, bool)> = sqlx::query_as(
        "SELECT f.outcome, f.followup_kind, f.body, c.request_id IS NOT NULL
           FROM final_reports f LEFT JOIN report_consumptions c ON c.request_id = f.request_id
          WHERE f.request_id = $1",
    )
    .bind(request_id)
    .fetch_optional(&mut *conn)
    .await?;
    facts.report = report.map(|(outcome, followup_kind, body, consumed)| Report {
        outcome,
        followup_kind,
        body,
        consumed,
    });
    facts.qualification = qualification_of(conn, facts.checkpoint.as_ref()).await?;
    Ok(Some(facts))
}

/// The current implementation's profile and the checkpoint's, with whether each is
/// registered as qualified.
async fn qualification_of(
    conn: &mut PgConnection,
    checkpoint: Option<&serde_json::Value>,
) -> Result<Qualification, sqlx::Error> {
    let current = qualification::current();
    let current_qualified = qualification::is_qualified(&mut *conn, &current).await?;
    let retained = checkpoint
        .and_then(|c| c.get("implementation_profile"))
        .and_then(|p| p.as_str())
        .map(str::to_string);
    let retained_qualified = match &retained {
        Some(p) => qualification::is_qualified(conn, p).await?,
        None => false,
    };
    Ok(Qualification {
        current,
        current_qualified,
        retained,
        retained_qualified,
    })
}

/// The current candidate of a request of this run.
async fn candidate(
    conn: &mut PgConnection,
    kind: Kind,
    policy: &Policy,
    (run_id, request_id): (Uuid, Uuid),
    caller: &Caller,
    lock: bool,
) -> Result<Candidate, ApiError> {
    let facts = facts(conn, run_id, request_id, lock)
        .await?
        .ok_or_else(|| ApiError::not_found("execution request of this run"))?;
    Ok(candidate::evaluate(
        kind,
        facts,
        policy,
        caller.token_id,
        Utc::now(),
    ))
}

async fn read_candidate(
    state: &AppState,
    kind: Kind,
    caller: &Caller,
    run_id: &str,
    request_id: &str,
) -> Result<Candidate, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(run_id, "run_id")?;
    let request_id = path_id(request_id, "request_id")?;
    let policy = policy::load_of_run(&state.pool, run_id).await?;
    let mut conn = state.pool.acquire().await?;
    candidate(
        &mut conn,
        kind,
        &policy,
        (run_id, request_id),
        caller,
        false,
    )
    .await
}

async fn save_action(
    state: &AppState,
    kind: Kind,
    caller: &Caller,
    ids: (String, String, String),
    input: ActionInput,
) -> Result<Response, ApiError> {
    caller.require(Role::Admin)?;
    let run_id = path_id(&ids.0, "run_id")?;
    let request_id = path_id(&ids.1, "request_id")?;
    let action_id = path_id(&ids.2, "action_id")?;
    let input_digest = digest::of_json(&input.raw);

    let mut tx = state.pool.begin().await?;
    // The policy is read under a lock held to the commit, then every admission of this
    // request serializes on its row.
    let policy = policy::load_locked(&mut tx, run_id).await?;
    let current = candidate(&mut tx, kind, &policy, (run_id, request_id), caller, true).await?;

    if let Some(row) = saved::find(&mut tx, action_id).await? {
        return replay(kind, row, (run_id, request_id), &input_digest);
    }
    let checkpoint_ref = checkpoint_ref(kind, &current);
    if saved::taken(&mut tx, request_id, kind.action(), &checkpoint_ref).await? {
        return Err(ApiError::conflict(
            "checkpoint_already_admitted",
            match kind {
                Kind::Checkpoint => "another action was already saved for this checkpoint",
                Kind::FinalOutcome => {
                    "another action was already saved for this request's retained final result"
                }
            },
        ));
    }
    admissible(&current, &input)?;

    let now = Utc::now();
    let window_ends_at = now + chrono::Duration::seconds(i64::from(input.valid_for_seconds));
    let witness_digest = digest::of_json(&json!({
        "candidate_digest": current.candidate_digest,
        "holds": [],
        "checked_at": now,
        "checked_by": caller.token_id,
    }));
    let admission_seal = digest::of_json(&json!({
        "action_id": action_id,
        "input_digest": input_digest,
        "witness_digest": witness_digest,
        "window_ends_at": window_ends_at,
    }));
    let row = saved::save(
        &mut tx,
        &NewAction {
            id: action_id,
            kind: kind.action(),
            run_id,
            request_id,
            checkpoint_ref: &checkpoint_ref,
            operator_id: caller.token_id,
            input: &input.raw,
            input_digest: &input_digest,
            candidate_digest: &current.candidate_digest,
            witness_digest: &witness_digest,
            admission_seal: &admission_seal,
            valid_for_seconds: i32::try_from(input.valid_for_seconds).unwrap_or(MAX_WINDOW_SECONDS),
            window_ends_at,
        },
    )
    .await?;
    readmit(
        &mut tx,
        kind,
        (run_id, request_id, action_id),
        current.attempt,
    )
    .await?;
    tx.commit().await?;
    state.metrics.continuations_admitted.inc();
    Ok((StatusCode::CREATED, Json(action_view(kind, row))).into_response())
}

/// An action id saved before: the same action and input get the same receipt, and
/// nothing more is admitted; other input under it is refused.
fn replay(
    kind: Kind,
    row: saved::Action,
    (run_id, request_id): (Uuid, Uuid),
    input_digest: &str,
) -> Result<Response, ApiError> {
    let same = row.kind == kind.action()
        && row.run_id == run_id
        && row.request_id == request_id
        && row.input_digest == input_digest;
    if same {
        return Ok((StatusCode::CREATED, Json(action_view(kind, row))).into_response());
    }
    Err(ApiError::conflict(
        "action_id_conflict",
        "this action id was saved with different input; read its status instead of submitting again",
    ))
}

/// What an action saves against: the checkpoint's sequence, or the final report.
fn checkpoint_ref(kind: Kind, current: &Candidate) -> String {
    match kind {
        Kind::Checkpoint => format!(
            "checkpoint:{}",
            current
                .checkpoint
                .as_ref()
                .and_then(|c| c.get("sequence"))
                .map(|s| s.to_string())
                .unwrap_or_default()
        ),
        Kind::FinalOutcome => "final_report".to_string(),
    }
}

/// Whether the candidate admits this action now: ready (no hold), the digest the
/// caller reviewed, and a window within its maximum.
fn admissible(current: &Candidate, input: &ActionInput) -> Result<(), ApiError> {
    if current.admission != "READY" {
        let reasons: Vec<String> = current
            .holds
            .iter()
            .map(|h| {
                serde_json::to_value(h.reason)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default()
            })
            .collect();
        return Err(ApiError::conflict(
            "candidate_held",
            format!(
                "the candidate is held ({}); nothing was admitted",
                reasons.join(", ")
            ),
        ));
    }
    if input.candidate_digest != current.candidate_digest {
        return Err(ApiError::conflict(
            "candidate_digest_mismatch",
            "candidate_digest is not the current candidate's; read the candidate again",
        )
        .with_field("candidate_digest"));
    }
    if input.valid_for_seconds > current.maximum_window_seconds as u32 {
        return Err(ApiError::unprocessable(
            "valid_for_seconds",
            format!(
                "at most the candidate's maximum_window_seconds ({})",
                current.maximum_window_seconds
            ),
        ));
    }
    Ok(())
}

/// Queues the same ticket again for the action: no new attempt, no budget reset.
async fn readmit(
    conn: &mut PgConnection,
    kind: Kind,
    (run_id, request_id, action_id): (Uuid, Uuid, Uuid),
    attempt: i32,
) -> Result<(), request::Error> {
    let message = JobMessage {
        tenant: None,
        kind: kind.job_kind(),
        run_id,
        request_id,
        action_id: Some(action_id),
        attempt: Some(attempt),
    };
    let event = match kind {
        Kind::Checkpoint => RequestEvent::ContinueFromCheckpoint,
        Kind::FinalOutcome => RequestEvent::ReadmitReport,
    };
    request::readmit(conn, &message, event).await
}

async fn read_status(
    state: &AppState,
    kind: Kind,
    caller: &Caller,
    run_id: &str,
    request_id: &str,
) -> Result<ActionView, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(run_id, "run_id")?;
    let request_id = path_id(request_id, "request_id")?;
    let exists: Option<(Uuid,)> =
        sqlx::query_as("SELECT id FROM execution_requests WHERE id = $1 AND run_id = $2")
            .bind(request_id)
            .bind(run_id)
            .fetch_optional(&state.pool)
            .await?;
    if exists.is_none() {
        return Err(ApiError::not_found("execution request of this run"));
    }
    let mut conn = state.pool.acquire().await?;
    let row = saved::latest(&mut conn, request_id, kind.action()).await?;
    Ok(match row {
        Some(row) => action_view(kind, row),
        None => ActionView {
            kind: format!("{}_status", kind.name()),
            run_id: run_id.into(),
            request_id: request_id.into(),
            action_id: None,
            status: "not_recovered".into(),
            witness_digest: None,
            admission_seal: None,
            candidate_digest: None,
            input_digest: None,
            lease: None,
            created_at: None,
            updated_at: None,
        },
    })
}

/// Inspect a checkpoint continuation candidate; starts no work.
#[utoipa::path(get, operation_id = "get_checkpoint_continuation_candidate", tag = "continuations", path = "/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}/candidate", params(("run_id" = String, Path), ("request_id" = String, Path)),
    responses((status = 200, body = Candidate), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn checkpoint_candidate(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, request_id)): Path<(String, String)>,
) -> Result<Json<Candidate>, ApiError> {
    read_candidate(&state, Kind::Checkpoint, &caller, &run_id, &request_id)
        .await
        .map(Json)
}

/// Save one reviewed checkpoint continuation on the existing ticket (admin).
#[utoipa::path(post, operation_id = "request_checkpoint_continuation", tag = "continuations", path = "/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}/actions/{action_id}",
    params(("run_id" = String, Path), ("request_id" = String, Path), ("action_id" = String, Path, description = "Caller-owned, 32 lowercase hex")),
    request_body = CheckpointContinuationInputV1,
    responses((status = 201, description = "Saved (or the identical earlier receipt)", body = ActionView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn checkpoint_action(
    State(state): State<AppState>,
    caller: Caller,
    Path(ids): Path<(String, String, String)>,
    StrictJson(body): StrictJson<CheckpointContinuationInputV1>,
) -> Result<Response, ApiError> {
    let input = ActionInput::try_from(body)?;
    save_action(&state, Kind::Checkpoint, &caller, ids, input).await
}

/// Read the saved checkpoint continuation and its worker status.
#[utoipa::path(get, operation_id = "get_checkpoint_continuation_status", tag = "continuations", path = "/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}/status", params(("run_id" = String, Path), ("request_id" = String, Path)),
    responses((status = 200, body = ActionView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn checkpoint_status(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, request_id)): Path<(String, String)>,
) -> Result<Json<ActionView>, ApiError> {
    read_status(&state, Kind::Checkpoint, &caller, &run_id, &request_id)
        .await
        .map(Json)
}

/// Review a retained final report and current eligibility; changes nothing.
#[utoipa::path(get, operation_id = "get_final_outcome_continuation_candidate", tag = "continuations", path = "/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}/candidate", params(("run_id" = String, Path), ("request_id" = String, Path)),
    responses((status = 200, body = Candidate), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn final_candidate(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, request_id)): Path<(String, String)>,
) -> Result<Json<Candidate>, ApiError> {
    read_candidate(&state, Kind::FinalOutcome, &caller, &run_id, &request_id)
        .await
        .map(Json)
}

/// Save one reviewed final-outcome acceptance (the run's original operator, as admin).
#[utoipa::path(post, operation_id = "request_final_outcome_continuation", tag = "continuations", path = "/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}/actions/{action_id}",
    params(("run_id" = String, Path), ("request_id" = String, Path), ("action_id" = String, Path)),
    request_body = FinalOutcomeContinuationInputV1,
    responses((status = 201, body = ActionView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn final_action(
    State(state): State<AppState>,
    caller: Caller,
    Path(ids): Path<(String, String, String)>,
    StrictJson(body): StrictJson<FinalOutcomeContinuationInputV1>,
) -> Result<Response, ApiError> {
    let input = ActionInput::try_from(body)?;
    // Only the run's original operator may act; checked before anything else is read.
    let run_id = path_id(&ids.0, "run_id")?;
    let operator: Option<Option<Uuid>> =
        sqlx::query_scalar("SELECT operator_id FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_optional(&state.pool)
            .await?;
    match operator {
        None => return Err(ApiError::not_found("run")),
        Some(op) if op != Some(caller.token_id) => {
            return Err(ApiError::forbidden(
                "only the run's original operator may accept its report",
            ))
        }
        Some(_) => {}
    }
    save_action(&state, Kind::FinalOutcome, &caller, ids, input).await
}

/// Read the saved final-outcome action and its worker outcome.
#[utoipa::path(get, operation_id = "get_final_outcome_continuation_status", tag = "continuations", path = "/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}/status", params(("run_id" = String, Path), ("request_id" = String, Path)),
    responses((status = 200, body = ActionView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn final_status(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, request_id)): Path<(String, String)>,
) -> Result<Json<ActionView>, ApiError> {
    read_status(&state, Kind::FinalOutcome, &caller, &run_id, &request_id)
        .await
        .map(Json)
}
