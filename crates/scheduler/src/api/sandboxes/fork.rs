//! Fork: one capture of a running sandbox (it takes no operation meanwhile, so the
//! capture is consistent), then `count` new sandboxes from that capture, each with its
//! own id and a tree scrubbed of the source's identity. The source keeps running,
//! unchanged.

use super::lifecycle::optional_body;
use super::operations::MARGIN;
use super::snapshots::{receipt, submit_once};
use super::view::{self, OperationView, SandboxView};
use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::path_id;
use crate::api::AppState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::ids::Id;
use cairn_common::sandbox::{ForkSpec, Operation};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

/// What a fork made: the new sandbox (the first, when `count` made several), with the
/// capture it started from and every sandbox the fork made.
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkView {
    #[serde(flatten)]
    pub sandbox: SandboxView,
    /// The one capture every fork starts from.
    #[schema(value_type = String)]
    pub snapshot_id: Id,
    /// How long the source took no operation while it was captured.
    pub source_frozen_ms: i64,
    /// The new sandboxes, `creating` until a worker has restored each.
    pub sandboxes: Vec<SandboxView>,
}

/// Fork a running sandbox into `count` new ones (default 1) from one capture. Honours
/// `Idempotency-Key`: retry a branch with the same key; use a new key per branch.
#[utoipa::path(post, operation_id = "fork_sandbox", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}/fork",
    request_body(content = Option<ForkSpec>, description = "Optional"),
    params(("sandbox_id" = String, Path, description = "32 hex characters"),
        ("Idempotency-Key" = Option<String>, Header, description = "Same key and body: the same forks; same key, other body: 409")),
    responses((status = 201, description = "Captured: the new sandbox (queued for placement), its capture, and every sandbox the fork made", body = ForkView),
        (status = 202, description = "Still capturing: read the operation", body = OperationView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Not running, a disk shrink, the capture failed, or the key reused", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn fork(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(sandbox_id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    let spec: ForkSpec = optional_body(&body)?;
    spec.validate()?;
    if let Some(disk) = spec.disk_mb {
        let current: Option<i32> =
            sqlx::query_scalar("SELECT disk_mb FROM sandboxes WHERE id = $1")
                .bind(id)
                .fetch_optional(&state.pool)
                .await?;
        let current = current.ok_or_else(|| ApiError::not_found("sandbox"))?;
        if i64::from(disk) < i64::from(current) {
            return Err(ApiError::conflict(
                "disk_shrink",
                format!("the source's disk is {current} MiB; a fork's never shrinks"),
            )
            .with_field("disk_mb"));
        }
    }
    let (status, operation, replay) =
        submit_once(&state, &caller, &headers, id, Operation::Fork(spec), MARGIN).await?;
    let mut response = if status == StatusCode::ACCEPTED {
        (status, Json(operation)).into_response()
    } else {
        let result = receipt(&operation)?;
        let snapshot = result["snapshot_id"]
            .as_str()
            .and_then(|s| Uuid::parse_str(s).ok())
            .ok_or_else(|| ApiError::conflict("not_captured", "the fork left no snapshot"))?;
        let mut conn = state.pool.acquire().await?;
        let mut sandboxes = Vec::new();
        for fork in result["sandbox_ids"].as_array().into_iter().flatten() {
            if let Some(fork) = fork.as_str().and_then(|s| Uuid::parse_str(s).ok()) {
                sandboxes.push(view::require(&mut conn, fork).await?);
            }
        }
        if !replay {
            state
                .metrics
                .sandboxes_created
                .inc_by(sandboxes.len() as u64);
        }
        let first = sandboxes
            .first()
            .cloned()
            .ok_or_else(|| ApiError::conflict("not_captured", "the fork made no sandbox"))?;
        let made = ForkView {
            sandbox: first,
            snapshot_id: snapshot.into(),
            source_frozen_ms: result["frozen_ms"].as_i64().unwrap_or_default(),
            sandboxes,
        };
        (StatusCode::CREATED, Json(made)).into_response()
    };
    if replay {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}
