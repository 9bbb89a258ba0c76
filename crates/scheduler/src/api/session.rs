//! Who the bearer token is: the console asks once at sign-in, to show only the actions
//! the token's role may take.

use super::auth::Caller;
use super::error::{ApiError, ErrorBody};
use super::AppState;
use axum::extract::State;
use axum::Json;
use cairn_common::ids::Id;
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionView {
    #[schema(value_type = String)]
    pub token_id: Id,
    /// The token's label.
    pub name: String,
    pub role: super::auth::Role,
    /// The tenant the token belongs to; absent for a platform token, which reaches every
    /// tenant.
    pub tenant: Option<String>,
}

/// The calling token: its id, label, role and tenant.
#[utoipa::path(get, operation_id = "get_session", tag = "session", path = "/api/v1/session",
    responses((status = 200, body = SessionView), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<SessionView>, ApiError> {
    let name: String = sqlx::query_scalar("SELECT name FROM api_tokens WHERE id = $1")
        .bind(caller.token_id)
        .fetch_one(&state.pool)
        .await?;
    Ok(Json(SessionView {
        token_id: caller.token_id.into(),
        name,
        role: caller.role,
        tenant: caller.tenant,
    }))
}
