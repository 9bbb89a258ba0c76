//! Tenants (projects): created by a platform admin; each tenant's tokens reach only what
//! belongs to it.

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::json::StrictJson;
use super::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use cairn_common::{policy, tenant};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantRequest {
    /// 1 to 63 characters: lowercase letters, digits and `-`, not starting with `-`.
    #[schema(min_length = 1, max_length = 63, pattern = "^[a-z0-9][a-z0-9-]{0,62}$")]
    pub tenant_id: String,
}

#[derive(Debug, Serialize, ToSchema, sqlx::FromRow)]
pub struct TenantView {
    #[sqlx(rename = "id")]
    pub tenant_id: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantList {
    pub tenants: Vec<TenantView>,
}

/// Create a tenant (platform admin). Its recovery policy starts from the defaults.
#[utoipa::path(post, operation_id = "create_tenant", tag = "tenants", path = "/api/v1/tenants",
    request_body = TenantRequest,
    responses((status = 201, body = TenantView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, description = "The tenant exists", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    StrictJson(request): StrictJson<TenantRequest>,
) -> Result<(StatusCode, Json<TenantView>), ApiError> {
    caller.require(Role::Admin)?;
    caller.require_platform()?;
    if !cairn_common::ids::valid_tenant_id(&request.tenant_id) {
        return Err(ApiError::unprocessable(
            "tenant_id",
            "1 to 63 characters: lowercase letters, digits and '-', not starting with '-'",
        ));
    }
    let mut tx = state.pool.begin().await?;
    if !tenant::create(&mut tx, &request.tenant_id, caller.token_id).await? {
        return Err(ApiError::conflict(
            "tenant_exists",
            "a tenant with this id exists already",
        ));
    }
    policy::create_for(&mut tx, &request.tenant_id).await?;
    let created: TenantView = sqlx::query_as("SELECT id, created_at FROM tenants WHERE id = $1")
        .bind(&request.tenant_id)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// List tenants: every tenant for a platform token, the token's own otherwise.
#[utoipa::path(get, operation_id = "list_tenants", tag = "tenants", path = "/api/v1/tenants",
    responses((status = 200, body = TenantList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<TenantList>, ApiError> {
    caller.require(Role::Viewer)?;
    let tenants: Vec<TenantView> = sqlx::query_as(
        "SELECT id, created_at FROM tenants WHERE ($1::text IS NULL OR id = $1) ORDER BY id",
    )
    .bind(caller.scope())
    .fetch_all(&state.pool)
    .await?;
    Ok(Json(TenantList { tenants }))
}
