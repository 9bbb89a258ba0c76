//! The saved-work recovery policy.

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::json::StrictJson;
use super::AppState;
use axum::extract::State;
use axum::Json;
use cairn_common::policy::{self, Policy, PolicyUpdate, MAX_WINDOW_SECONDS};

/// Read the recovery policy of the caller's tenant (a platform token: the default
/// tenant's).
#[utoipa::path(get, operation_id = "get_continuation_policy", tag = "policy", path = "/api/v1/invalid-read-continuity/policy",
    responses((status = 200, body = Policy), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_policy(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Policy>, ApiError> {
    caller.require(Role::Viewer)?;
    Ok(Json(policy::load(&state.pool, caller.home()).await?))
}

/// Save the named settings of the caller's tenant's policy (admin); every setting not
/// named keeps its value.
#[utoipa::path(put, operation_id = "set_continuation_policy", tag = "policy", path = "/api/v1/invalid-read-continuity/policy",
    request_body = PolicyUpdate,
    responses((status = 200, body = Policy), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put_policy(
    State(state): State<AppState>,
    caller: Caller,
    StrictJson(change): StrictJson<PolicyUpdate>,
) -> Result<Json<Policy>, ApiError> {
    caller.require(Role::Admin)?;
    if let Some(window) = change.maximum_window_seconds {
        if !(1..=MAX_WINDOW_SECONDS).contains(&window) {
            return Err(ApiError::unprocessable(
                "maximum_window_seconds",
                "from 1 to 7200",
            ));
        }
    }
    Ok(Json(
        policy::update(&state.pool, caller.home(), &change, caller.token_id).await?,
    ))
}
