//! A running exec's input, terminal size and end: each call is sent on to the worker
//! that runs it (its probes listener, with that worker's key, as a preview is).
//!
//! An exec takes input only if it was started with `stdin: true` or `pty`; what it is
//! sent is neither journaled nor kept (a terminal's echo is in its output).

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
use axum::Json;
use cairn_common::sandbox::spec::PtySize;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// The most one input call carries.
const MAX_INPUT: usize = 64 * 1024;
/// How long the worker may take: it waits up to 2 s for a starting exec, and 5 s for
/// the command to read (twice with `eof` on a terminal).
const ANSWER: Duration = Duration::from_secs(20);

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct InputQuery {
    /// Close the input after these bytes (on a terminal: its end-of-file character).
    pub eof: Option<bool>,
}

/// What an input call wrote.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct InputWritten {
    /// How many of the bytes the command took, from the first: fewer than were sent
    /// when it did not read the rest within 5 s (send those again; `eof` then applied
    /// to nothing).
    pub written: usize,
}

/// The worker running the exec (its address and key), or why none is asked.
async fn running_on(
    state: &AppState,
    sandbox: Uuid,
    operation: Uuid,
) -> Result<(String, String), ApiError> {
    let found: Option<(String, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT o.kind, o.state, h.preview_url, h.preview_key
           FROM sandbox_operations o JOIN sandboxes s ON s.id = o.sandbox_id
           LEFT JOIN worker_heartbeats h ON h.worker_id = s.worker_id
          WHERE o.id = $1 AND o.sandbox_id = $2",
    )
    .bind(operation)
    .bind(sandbox)
    .fetch_optional(&state.pool)
    .await?;
    let (kind, op_state, url, key) = found.ok_or_else(|| ApiError::not_found("operation"))?;
    if kind != "exec" || op_state != "running" {
        return Err(ApiError::conflict(
            "not_running",
            format!(
                "the operation is a {kind} in state {op_state}: only a running exec takes this"
            ),
        ));
    }
    match (url, key) {
        (Some(url), Some(key)) => Ok((url, key)),
        _ => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "operation_unreachable",
            "the sandbox's worker takes no calls (its CAIRN_PREVIEW_URL is not set)",
        )),
    }
}

/// Sends `body` to the worker's route for the exec; its answer, or Cairn's refusal.
async fn send(
    (url, key): (String, String),
    operation: Uuid,
    action: &str,
    body: reqwest::Body,
    eof: bool,
) -> Result<(StatusCode, Bytes), ApiError> {
    let mut request = super::preview::client()
        .post(format!("{url}/operations/{}/{action}", operation.simple()))
        .timeout(ANSWER)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body);
    if eof {
        request = request.header("cairn-input-eof", "true");
    }
    let unreachable = |e: reqwest::Error| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "operation_unreachable",
            format!("the sandbox's worker did not answer: {e}"),
        )
    };
    let answer = request.send().await.map_err(unreachable)?;
    let status = answer.status();
    let bytes = answer.bytes().await.map_err(unreachable)?;
    if status.is_success() {
        return Ok((status, bytes));
    }
    let refused: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let message = refused["message"]
        .as_str()
        .unwrap_or("the worker refused the call")
        .to_string();
    Err(match refused["error"].as_str() {
        Some("not_running") => ApiError::conflict("not_running", message),
        Some("no_input") => ApiError::conflict("no_input", message),
        Some("not_a_terminal") => ApiError::conflict("not_a_terminal", message),
        _ => ApiError::new(StatusCode::BAD_GATEWAY, "bad_answer", message),
    })
}

/// Write bytes (at most 64 KiB) to a running exec's standard input or terminal, as many
/// as the command takes within 5 s (`written`); `?eof=true` closes the input after them
/// all.
#[utoipa::path(post, operation_id = "send_sandbox_input", tag = "sandboxes",
    path = "/api/v1/sandboxes/{sandbox_id}/operations/{operation_id}/input",
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    params(("sandbox_id" = String, Path, description = "32 hex characters"),
        ("operation_id" = String, Path, description = "32 hex characters"), InputQuery),
    responses((status = 200, description = "What the command took", body = InputWritten),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Not a running exec, started without input, or its input closed", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 502, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn input(
    State(state): State<AppState>,
    caller: Caller,
    Path((sandbox_id, operation_id)): Path<(String, String)>,
    StrictQuery(query): StrictQuery<InputQuery>,
    body: Bytes,
) -> Result<Json<InputWritten>, ApiError> {
    caller.require(Role::Operator)?;
    let sandbox = path_id(&sandbox_id, "sandbox_id")?;
    let operation = path_id(&operation_id, "operation_id")?;
    if body.len() > MAX_INPUT {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_unreadable",
            format!("one input call carries at most {MAX_INPUT} bytes"),
        ));
    }
    let worker = running_on(&state, sandbox, operation).await?;
    let eof = query.eof.unwrap_or(false);
    let (_, answer) = send(worker, operation, "input", body.into(), eof).await?;
    let written: InputWritten = serde_json::from_slice(&answer)
        .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, "bad_answer", e.to_string()))?;
    Ok(Json(written))
}

/// Change the size of a running exec's terminal (it gets `SIGWINCH`).
#[utoipa::path(post, operation_id = "resize_sandbox_terminal", tag = "sandboxes",
    path = "/api/v1/sandboxes/{sandbox_id}/operations/{operation_id}/resize",
    request_body = PtySize,
    params(("sandbox_id" = String, Path, description = "32 hex characters"),
        ("operation_id" = String, Path, description = "32 hex characters")),
    responses((status = 204, description = "Resized"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Not a running exec in a terminal", body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 502, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn resize(
    State(state): State<AppState>,
    caller: Caller,
    Path((sandbox_id, operation_id)): Path<(String, String)>,
    StrictJson(size): StrictJson<PtySize>,
) -> Result<StatusCode, ApiError> {
    caller.require(Role::Operator)?;
    let sandbox = path_id(&sandbox_id, "sandbox_id")?;
    let operation = path_id(&operation_id, "operation_id")?;
    size.validate("rows")?;
    let worker = running_on(&state, sandbox, operation).await?;
    let body = serde_json::to_vec(&size).unwrap_or_default();
    send(worker, operation, "resize", body.into(), false).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// End a running exec: its processes get `SIGTERM`, then `SIGKILL` after the grace;
/// its receipt says `killed`. Answers at once with the operation as it stands.
#[utoipa::path(post, operation_id = "kill_sandbox_operation", tag = "sandboxes",
    path = "/api/v1/sandboxes/{sandbox_id}/operations/{operation_id}/kill",
    params(("sandbox_id" = String, Path, description = "32 hex characters"),
        ("operation_id" = String, Path, description = "32 hex characters")),
    responses((status = 202, description = "Being ended", body = OperationView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Not a running exec", body = ErrorBody),
        (status = 502, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn kill(
    State(state): State<AppState>,
    caller: Caller,
    Path((sandbox_id, operation_id)): Path<(String, String)>,
) -> Result<(StatusCode, Json<OperationView>), ApiError> {
    caller.require(Role::Operator)?;
    let sandbox = path_id(&sandbox_id, "sandbox_id")?;
    let operation = path_id(&operation_id, "operation_id")?;
    let worker = running_on(&state, sandbox, operation).await?;
    send(worker, operation, "kill", reqwest::Body::from(""), false).await?;
    let mut conn = state.pool.acquire().await?;
    let view = view::operation(&mut conn, operation)
        .await?
        .ok_or_else(|| ApiError::not_found("operation"))?;
    Ok((StatusCode::ACCEPTED, Json(view)))
}
