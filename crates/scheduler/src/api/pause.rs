//! Pause and resume of a running run.
//!
//! Pause asks the worker holding the run to stop the step's processes and capture a
//! checkpoint; the paused reply (200) is given only once the worker has recorded the
//! pause, after its capture. If that takes longer than `wait_seconds`, the reply is 202
//! `pausing` and `GET /api/v1/runs/{run_id}/pause` shows when it is paused. Resume
//! continues the processes. A pause that outlasts the worker's limit (30 minutes by
//! default) behaves like a stop: the run stops at its checkpoint (`pause_expired`).

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::path_id;
use super::AppState;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::ids::Id;
use cairn_common::request;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// The pause state of a run.
#[derive(Debug, Serialize, ToSchema)]
pub struct PauseView {
    #[schema(value_type = String)]
    pub run_id: Id,
    #[schema(value_type = String)]
    pub request_id: Id,
    /// `running`, `pausing` (asked, not yet captured), `paused`, `resuming` (asked, the
    /// worker has not continued yet) or `not_running` (the run is not executing).
    pub state: String,
    pub pause_requested_at: Option<DateTime<Utc>>,
    pub paused_at: Option<DateTime<Utc>>,
    /// The pause checkpoint: `snapshot_id` (the lineage head holding the paused tree),
    /// `step` (the step that was stopped, if any), `capture_failed` (the capture failed
    /// and a hold keeps the live tree instead) and `expires_at` (when the pause behaves
    /// like a stop).
    #[schema(value_type = Option<Object>)]
    pub checkpoint: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    /// Seconds to wait for the worker before answering 202 (0 to 60, default 30).
    #[param(minimum = 0, maximum = 60)]
    pub wait_seconds: Option<u64>,
}

const DEFAULT_WAIT: u64 = 30;
const MAX_WAIT: u64 = 60;

type PauseRow = (
    Uuid,
    String,
    bool,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<serde_json::Value>,
);

async fn load(pool: &PgPool, run_id: Uuid) -> Result<PauseRow, ApiError> {
    let row: Option<PauseRow> = sqlx::query_as(
        "SELECT id, state, COALESCE(lease_owner IS NOT NULL AND lease_deadline > clock_timestamp(), FALSE),
                pause_requested_at, paused_at, pause_checkpoint
           FROM execution_requests WHERE run_id = $1 AND kind = 'run'",
    )
    .bind(run_id)
    .fetch_optional(pool)
    .await?;
    row.ok_or_else(|| ApiError::not_found("run"))
}

fn view(run_id: Uuid, row: PauseRow) -> PauseView {
    let (request_id, state, live, requested, paused, checkpoint) = row;
    let state = match (state == "executing" && live, requested, paused) {
        (false, _, _) => "not_running",
        (true, Some(_), Some(_)) => "paused",
        (true, Some(_), None) => "pausing",
        (true, None, Some(_)) => "resuming",
        (true, None, None) => "running",
    };
    PauseView {
        run_id: run_id.into(),
        request_id: request_id.into(),
        state: state.into(),
        pause_requested_at: requested,
        paused_at: paused,
        checkpoint,
    }
}

fn wait_of(
    query: Result<Query<WaitQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Duration, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let seconds = query.wait_seconds.unwrap_or(DEFAULT_WAIT);
    if seconds > MAX_WAIT {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("wait_seconds is from 0 to {MAX_WAIT}"),
        )
        .with_field("wait_seconds"));
    }
    Ok(Duration::from_secs(seconds))
}

/// Polls until `done` holds of the run's pause state or `wait` has passed.
async fn settle(
    pool: &PgPool,
    run_id: Uuid,
    wait: Duration,
    done: impl Fn(&PauseView) -> bool,
) -> Result<PauseView, ApiError> {
    let read = || async { Ok(view(run_id, load(pool, run_id).await?)) };
    let every = Duration::from_millis(100);
    Ok(super::poll::until(wait, every, read, done).await?.0)
}

/// Pause a running run: its step's processes stop and a checkpoint is captured before
/// the paused reply.
#[utoipa::path(post, operation_id = "pause_run", tag = "runs", path = "/api/v1/runs/{run_id}/pause",
    params(("run_id" = String, Path), WaitQuery),
    responses(
        (status = 200, description = "Paused: the checkpoint was captured first", body = PauseView),
        (status = 202, description = "Pausing: the worker has not recorded the pause yet", body = PauseView),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The run is not running", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn pause(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    query: Result<Query<WaitQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let (run_id, wait) = asked_of(&caller, &run_id, query)?;
    let asked = request::pause::ask(&mut *state.pool.acquire().await?, run_id).await?;
    let current = answer(&state.pool, run_id, wait, asked, not_running, "pausing").await?;
    match current.state.as_str() {
        "paused" => Ok((StatusCode::OK, Json(current)).into_response()),
        "pausing" => Ok((StatusCode::ACCEPTED, Json(current)).into_response()),
        _ => Err(not_running()),
    }
}

/// Resume a paused run: its step's processes continue.
#[utoipa::path(post, operation_id = "resume_run", tag = "runs", path = "/api/v1/runs/{run_id}/resume",
    params(("run_id" = String, Path), WaitQuery),
    responses(
        (status = 200, description = "Running again", body = PauseView),
        (status = 202, description = "Resuming: the worker has not continued yet", body = PauseView),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The run is not paused or pausing", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    query: Result<Query<WaitQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let (run_id, wait) = asked_of(&caller, &run_id, query)?;
    let withdrawn = request::pause::withdraw(&mut *state.pool.acquire().await?, run_id).await?;
    let not_paused = || ApiError::conflict("not_paused", "the run is not paused or pausing");
    let current = answer(&state.pool, run_id, wait, withdrawn, not_paused, "resuming").await?;
    let status = match current.state.as_str() {
        "resuming" => StatusCode::ACCEPTED,
        _ => StatusCode::OK,
    };
    Ok((status, Json(current)).into_response())
}

/// The operator, run and wait of a pause or resume.
fn asked_of(
    caller: &Caller,
    run_id: &str,
    query: Result<Query<WaitQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<(Uuid, Duration), ApiError> {
    caller.require(Role::Operator)?;
    Ok((path_id(run_id, "run_id")?, wait_of(query)?))
}

/// Refuses a pause or resume that changed nothing, else waits until the worker has left
/// `settling` or the wait has passed.
async fn answer(
    pool: &PgPool,
    run_id: Uuid,
    wait: Duration,
    changed: bool,
    refused: impl FnOnce() -> ApiError,
    settling: &str,
) -> Result<PauseView, ApiError> {
    refuse_unless(changed, pool, run_id, refused).await?;
    settle(pool, run_id, wait, |v| v.state != settling).await
}

/// Read a run's pause state.
#[utoipa::path(get, operation_id = "get_run_pause", tag = "runs", path = "/api/v1/runs/{run_id}/pause",
    params(("run_id" = String, Path)),
    responses((status = 200, body = PauseView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<PauseView>, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    Ok(Json(view(run_id, load(&state.pool, run_id).await?)))
}

/// A request that changed nothing is refused: a 404 for an unknown run, else `refused`.
async fn refuse_unless(
    changed: bool,
    pool: &PgPool,
    run_id: Uuid,
    refused: impl FnOnce() -> ApiError,
) -> Result<(), ApiError> {
    if !changed {
        load(pool, run_id).await?;
        return Err(refused());
    }
    Ok(())
}

fn not_running() -> ApiError {
    ApiError::conflict(
        "not_running",
        "the run is not running: only a run a worker is executing can pause",
    )
}
