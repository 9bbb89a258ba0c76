//! Exec and file operations. Each is recorded for the sandbox's worker, which runs it in
//! the sandbox's step sandbox and journals it like a step (intent, then a receipt on the
//! durable tree holding its effects). Each counts as activity. On a stopped or paused
//! persistent sandbox it resumes the sandbox first; a non-persistent one answers `409`.

use super::lifecycle::{lock, resume_in, Locked};
use super::view::{self, OperationView};
use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::json::StrictJson;
use crate::api::path_id;
use crate::api::query::StrictQuery;
use crate::api::AppState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use cairn_common::sandbox::spec::MAX_FILE_BYTES;
use cairn_common::sandbox::{ExecSpec, FileSpec, Operation, SandboxState};
use serde::Deserialize;
use std::time::Duration;
use utoipa::IntoParams;
use uuid::Uuid;

/// How long past its own timeout a reply waits for an operation (a resume, a capture).
pub const MARGIN: Duration = Duration::from_secs(60);

/// Whether the sandbox takes an operation now (resuming it first when it may).
pub(super) fn takes(row: &Locked) -> Result<bool, ApiError> {
    let leaving = row.desired == "stopped" || row.desired == "destroyed";
    match row.state {
        SandboxState::Running | SandboxState::Creating if leaving || row.desired == "paused" => {
            Err(ApiError::conflict(
                "invalid_state",
                format!(
                    "the sandbox is {} and being {}: it takes no operation",
                    row.state, row.desired
                ),
            )
            .with_field("state"))
        }
        SandboxState::Running | SandboxState::Creating => Ok(false),
        SandboxState::Stopped | SandboxState::Paused if row.persistent => Ok(true),
        SandboxState::Stopped | SandboxState::Paused => Err(ApiError::conflict(
            "not_persistent",
            format!(
                "the sandbox is {} and not persistent: it is never resumed by an operation; resume it explicitly",
                row.state
            ),
        )
        .with_field("state")),
        other => Err(ApiError::conflict(
            "invalid_state",
            format!("the sandbox is {other}: it takes no operation"),
        )
        .with_field("state")),
    }
}

/// Records the operation (resuming the sandbox first if it must), then waits for its
/// receipt up to `wait`: `200` with it, or `202` with the operation still open.
async fn submit(
    state: &AppState,
    id: Uuid,
    operation: Operation,
    wait: Duration,
) -> Result<(StatusCode, OperationView), ApiError> {
    let mut tx = state.pool.begin().await?;
    let row = lock(&mut tx, id).await?;
    if takes(&row)? {
        resume_in(&mut tx, id, &row).await?;
    }
    let operation_id = record(&mut tx, id, &operation).await?;
    tx.commit().await?;
    state.metrics.sandbox_operations.inc();
    await_receipt(state, operation_id, wait).await
}

/// Records an operation for the sandbox's owner, in the caller's transaction (it
/// counts as activity).
pub async fn record(
    conn: &mut sqlx::PgConnection,
    id: Uuid,
    operation: &Operation,
) -> Result<Uuid, ApiError> {
    let body = serde_json::to_value(operation)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    Ok(cairn_common::sandbox::operations::record(conn, id, operation.kind(), &body).await?)
}

/// Waits for an operation's receipt up to `wait`: `200` with it (or `interrupted`),
/// `202` with it still open.
pub async fn await_receipt(
    state: &AppState,
    operation_id: Uuid,
    wait: Duration,
) -> Result<(StatusCode, OperationView), ApiError> {
    let read = || async {
        let mut conn = state.pool.acquire().await?;
        view::operation(&mut conn, operation_id)
            .await?
            .ok_or_else(|| ApiError::not_found("operation"))
    };
    let ended = |view: &OperationView| view.state == "done" || view.state == "interrupted";
    let every = Duration::from_millis(20);
    let (view, ended) = crate::api::poll::until(wait, every, read, ended).await?;
    let status = if ended {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, view))
}

/// How an exec is answered.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ExecQuery {
    /// `false`: answer `202` with the operation at once, to follow its output as it is
    /// printed (`…/operations/{operation_id}/output?follow=true`) and read its receipt
    /// from `…/operations/{operation_id}`. Default `true`: answer with the receipt.
    pub wait: Option<bool>,
}

/// Run a command in the sandbox. The reply is its receipt: exit code, signal, timeout,
/// output tails and usage, and the snapshot holding its effects; its whole output is
/// at `…/operations/{operation_id}/output`, as it is printed.
#[utoipa::path(post, operation_id = "exec_in_sandbox", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}/exec",
    request_body = ExecSpec,
    params(("sandbox_id" = String, Path, description = "32 hex characters"), ExecQuery),
    responses((status = 200, description = "Its receipt (or `interrupted`)", body = OperationView),
        (status = 202, description = "Still running (or `wait=false`); read it from the operations", body = OperationView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "Not running, and not resumable by an operation", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn exec(
    State(state): State<AppState>,
    caller: Caller,
    Path(sandbox_id): Path<String>,
    StrictQuery(query): StrictQuery<ExecQuery>,
    StrictJson(spec): StrictJson<ExecSpec>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    spec.validate()?;
    let wait = if query.wait.unwrap_or(true) {
        Duration::from_secs(u64::from(spec.timeout_sec)) + MARGIN
    } else {
        Duration::ZERO
    };
    let (status, view) = submit(&state, id, Operation::Exec(spec), wait).await?;
    Ok((status, Json(view)).into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    /// Relative to the sandbox's tree; absent or `.` is its root (a listing).
    pub path: Option<String>,
}

impl PathQuery {
    fn spec(&self, allow_root: bool) -> Result<FileSpec, ApiError> {
        let spec = FileSpec {
            path: self.path.clone().unwrap_or_else(|| ".".into()),
        };
        spec.validate(allow_root)?;
        Ok(spec)
    }
}

/// The answer of a file operation, or the error its receipt names.
fn answered(view: OperationView) -> Result<serde_json::Value, ApiError> {
    let result = view.result.clone().unwrap_or_default();
    if view.state == "interrupted" {
        return Err(ApiError::conflict(
            "interrupted",
            result["error"]
                .as_str()
                .unwrap_or("the operation was interrupted")
                .to_string(),
        ));
    }
    if let Some(error) = result["error"].as_str() {
        return Err(
            ApiError::new(StatusCode::NOT_FOUND, "file_error", error.to_string())
                .with_field("path"),
        );
    }
    Ok(result)
}

/// A file operation that only reads: its answer, or the `202` reply while it is open.
async fn file_operation(
    state: &AppState,
    caller: &Caller,
    sandbox_id: &str,
    query: &PathQuery,
    allow_root: bool,
    operation: fn(FileSpec) -> Operation,
) -> Result<Result<serde_json::Value, Response>, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(sandbox_id, "sandbox_id")?;
    let spec = query.spec(allow_root)?;
    let (status, view) = submit(state, id, operation(spec), MARGIN).await?;
    if status == StatusCode::ACCEPTED {
        return Ok(Err((status, Json(view)).into_response()));
    }
    answered(view).map(Ok)
}

/// List a directory of the sandbox's tree.
#[utoipa::path(get, operation_id = "list_sandbox_files", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}/files",
    params(("sandbox_id" = String, Path, description = "32 hex characters"), PathQuery),
    responses((status = 200, description = "`entries`: name, type (`file`, `dir`, `link`, `other`) and size", body = Object),
        (status = 202, description = "Not answered yet", body = OperationView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(sandbox_id): Path<String>,
    StrictQuery(query): StrictQuery<PathQuery>,
) -> Result<Response, ApiError> {
    match file_operation(&state, &caller, &sandbox_id, &query, true, Operation::List).await? {
        Ok(listing) => Ok(Json(listing).into_response()),
        Err(pending) => Ok(pending),
    }
}

/// Read a file of the sandbox's tree (at most 4 MiB), as bytes.
#[utoipa::path(get, operation_id = "read_sandbox_file", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}/files/content",
    params(("sandbox_id" = String, Path, description = "32 hex characters"), PathQuery),
    responses((status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 202, description = "Not answered yet", body = OperationView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn read(
    State(state): State<AppState>,
    caller: Caller,
    Path(sandbox_id): Path<String>,
    StrictQuery(query): StrictQuery<PathQuery>,
) -> Result<Response, ApiError> {
    let result =
        match file_operation(&state, &caller, &sandbox_id, &query, false, Operation::Read).await? {
            Ok(result) => result,
            Err(pending) => return Ok(pending),
        };
    let content = base64::engine::general_purpose::STANDARD
        .decode(result["content"].as_str().unwrap_or_default())
        .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, "bad_answer", e.to_string()))?;
    Ok(([("content-type", "application/octet-stream")], content).into_response())
}

/// Write a file of the sandbox's tree (the body's bytes, at most 4 MiB), making its
/// directories. Journaled like an exec: the reply is its receipt.
#[utoipa::path(put, operation_id = "write_sandbox_file", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}/files/content",
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    params(("sandbox_id" = String, Path, description = "32 hex characters"), PathQuery),
    responses((status = 200, description = "Its receipt", body = OperationView),
        (status = 202, description = "Not written yet", body = OperationView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn write(
    State(state): State<AppState>,
    caller: Caller,
    Path(sandbox_id): Path<String>,
    StrictQuery(query): StrictQuery<PathQuery>,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    let spec = query.spec(false)?;
    if body.len() > MAX_FILE_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "file_too_large",
            format!("a file write takes at most {MAX_FILE_BYTES} bytes"),
        ));
    }
    let operation = Operation::Write {
        path: spec.path,
        content: base64::engine::general_purpose::STANDARD.encode(&body),
    };
    let (status, view) = submit(&state, id, operation, MARGIN).await?;
    if status == StatusCode::OK && view.state == "interrupted" {
        answered(view.clone())?;
    }
    Ok((status, Json(view)).into_response())
}
