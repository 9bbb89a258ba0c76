//! Services: set one (a deploy: it starts now, a stopped or paused persistent sandbox
//! resumed first) or delete it (it ends now). Each change is kept in the sandbox, so
//! every later start and resume starts its services again, and carried out by its owner
//! as an operation of its journal; the reply waits for its receipt, as an exec's does.

use super::lifecycle::{lock, resume_in};
use super::operations::{await_receipt, record, takes, MARGIN};
use super::view::OperationView;
use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::json::StrictJson;
use crate::api::path_id;
use crate::api::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::sandbox::service::{check_service_name, ServiceSpec, MAX_SERVICES};
use cairn_common::sandbox::{Operation, SandboxState};
use std::time::Duration;
use uuid::Uuid;

/// How long the launcher of a service may take (it only starts it).
const LAUNCH: Duration = Duration::from_secs(60);

/// Set a service: kept for every later start and resume, and (re)started now.
#[utoipa::path(put, operation_id = "set_sandbox_service", tag = "sandboxes",
    path = "/api/v1/sandboxes/{sandbox_id}/services/{name}",
    request_body = ServiceSpec,
    params(("sandbox_id" = String, Path, description = "32 hex characters"),
        ("name" = String, Path, description = "1 to 63 of `A-Za-z0-9._-`, not only dots")),
    responses((status = 200, description = "Its start's receipt (`result.started`)", body = OperationView),
        (status = 202, description = "Not started yet; read it from the operations", body = OperationView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "Not running, and not resumable by an operation", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn set(
    State(state): State<AppState>,
    caller: Caller,
    Path((sandbox_id, name)): Path<(String, String)>,
    StrictJson(spec): StrictJson<ServiceSpec>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    spec.validate(&name)?;
    change(&state, id, name, Some(spec)).await
}

/// Delete a service: it ends now and is not started again. On a stopped sandbox, whose
/// processes a stop ended, only the sandbox's record changes (`204`).
#[utoipa::path(delete, operation_id = "delete_sandbox_service", tag = "sandboxes",
    path = "/api/v1/sandboxes/{sandbox_id}/services/{name}",
    params(("sandbox_id" = String, Path, description = "32 hex characters"),
        ("name" = String, Path, description = "1 to 63 of `A-Za-z0-9._-`, not only dots")),
    responses((status = 200, description = "Its end's receipt", body = OperationView),
        (status = 204, description = "Deleted from a stopped sandbox: nothing ran to end"),
        (status = 202, description = "Not ended yet; read it from the operations", body = OperationView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No such sandbox, or no such service", body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path((sandbox_id, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    check_service_name(&name)?;
    change(&state, id, name, None).await
}

async fn change(
    state: &AppState,
    id: Uuid,
    name: String,
    service: Option<ServiceSpec>,
) -> Result<Response, ApiError> {
    let mut tx = state.pool.begin().await?;
    let row = lock(&mut tx, id).await?;
    let (exists, count): (bool, i32) = sqlx::query_as(
        "SELECT services ? $2, (SELECT count(*)::int FROM jsonb_object_keys(services))
           FROM sandboxes WHERE id = $1",
    )
    .bind(id)
    .bind(&name)
    .fetch_one(&mut *tx)
    .await?;
    match (&service, exists) {
        (None, false) => return Err(ApiError::not_found("service")),
        (Some(_), false) if usize::try_from(count).unwrap_or(0) >= MAX_SERVICES => {
            return Err(ApiError::unprocessable("services", "at most 8 services"));
        }
        _ => {}
    }
    if service.is_none() && row.state == SandboxState::Stopped && row.desired == "stopped" {
        cairn_common::sandbox::ask::set_service(&mut tx, id, &name, None).await?;
        tx.commit().await?;
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    if takes(&row)? {
        resume_in(&mut tx, id, &row).await?;
    }
    cairn_common::sandbox::ask::set_service(&mut tx, id, &name, service.as_ref()).await?;
    let operation_id = record(&mut tx, id, &Operation::Service { name, service }).await?;
    tx.commit().await?;
    state.metrics.sandbox_operations.inc();
    let (status, view) = await_receipt(state, operation_id, LAUNCH + MARGIN).await?;
    Ok((status, Json(view)).into_response())
}
