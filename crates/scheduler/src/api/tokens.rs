//! API tokens: created and revoked by admins, each in one tenant (a platform admin may
//! also make platform tokens); the secret is shown once.

use super::auth::{self, Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::json::StrictJson;
use super::path_id;
use super::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use cairn_common::ids::Id;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"name": "ci-operator", "role": "operator"})))]
pub struct TokenRequest {
    /// A label for people, 1 to 128 characters.
    #[schema(min_length = 1, max_length = 128)]
    pub name: String,
    pub role: Role,
    /// The tenant the token belongs to. A tenant's admin makes tokens of its own tenant
    /// (the default); a platform admin names one, or omits it for a platform token.
    #[serde(default)]
    pub tenant: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedToken {
    #[schema(value_type = String)]
    pub token_id: Id,
    pub name: String,
    pub role: Role,
    /// Absent for a platform token.
    pub tenant: Option<String>,
    /// The bearer secret. It is not stored and cannot be shown again.
    pub token: String,
}

/// Create a token (admin).
#[utoipa::path(post, operation_id = "create_token", tag = "tokens", path = "/api/v1/tokens", request_body = TokenRequest,
    responses((status = 201, body = CreatedToken), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, description = "The named tenant does not exist or is not the caller's", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    StrictJson(request): StrictJson<TokenRequest>,
) -> Result<(StatusCode, Json<CreatedToken>), ApiError> {
    caller.require(Role::Admin)?;
    let name = request.name.trim();
    if name.is_empty() || name.len() > 128 {
        return Err(ApiError::unprocessable("name", "1 to 128 characters"));
    }
    let tenant = match (caller.scope(), request.tenant) {
        (None, None) => None,
        (Some(own), None) => Some(own.to_string()),
        (_, Some(named)) => {
            if !cairn_common::ids::valid_tenant_id(&named) {
                return Err(ApiError::unprocessable(
                    "tenant",
                    "a tenant id: 1 to 63 lowercase letters, digits and '-'",
                ));
            }
            // Another tenant is as unknown to a tenant's admin as a tenant that is not.
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM tenants WHERE id = $1)")
                    .bind(&named)
                    .fetch_one(&state.pool)
                    .await?;
            if !exists || !caller.reaches(&named) {
                return Err(ApiError::not_found("tenant").with_field("tenant"));
            }
            Some(named)
        }
    };
    let token = auth::generate();
    let id = auth::insert(&state.pool, name, request.role, tenant.as_deref(), &token).await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            token_id: id.into(),
            name: name.to_string(),
            role: request.role,
            tenant,
            token,
        }),
    ))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TokenView {
    #[schema(value_type = String)]
    pub token_id: Id,
    pub name: String,
    pub role: Role,
    /// Absent for a platform token.
    pub tenant: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When it was revoked; absent while it is usable.
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct TokenRow {
    id: uuid::Uuid,
    name: String,
    role: String,
    tenant_id: Option<String>,
    created_at: DateTime<Utc>,
    revoked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

/// List tokens (admin) of the caller's tenant (every token for a platform admin), newest
/// first. Secrets are never shown again.
#[utoipa::path(get, operation_id = "list_tokens", tag = "tokens", path = "/api/v1/tokens",
    responses((status = 200, body = TokenList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<TokenList>, ApiError> {
    caller.require(Role::Admin)?;
    let rows: Vec<TokenRow> = sqlx::query_as(
        "SELECT id, name, role, tenant_id, created_at, revoked_at FROM api_tokens
          WHERE ($1::text IS NULL OR tenant_id = $1)
          ORDER BY created_at DESC, id",
    )
    .bind(caller.scope())
    .fetch_all(&state.pool)
    .await?;
    let tokens = rows
        .into_iter()
        .filter_map(|row| {
            Some(TokenView {
                token_id: row.id.into(),
                name: row.name,
                role: Role::parse(&row.role)?,
                tenant: row.tenant_id,
                created_at: row.created_at,
                revoked_at: row.revoked_at,
            })
        })
        .collect();
    Ok(Json(TokenList { tokens }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RevokedToken {
    #[schema(value_type = String)]
    pub token_id: Id,
    pub revoked: bool,
}

/// Revoke a token (admin). Runs it submitted keep their history; their continuations
/// are held for revoked access.
#[utoipa::path(post, operation_id = "revoke_token", tag = "tokens", path = "/api/v1/tokens/{token_id}/revoke",
    params(("token_id" = String, Path)),
    responses((status = 200, body = RevokedToken), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn revoke(
    State(state): State<AppState>,
    caller: Caller,
    Path(token_id): Path<String>,
) -> Result<Json<RevokedToken>, ApiError> {
    caller.require(Role::Admin)?;
    let token_id = path_id(&token_id, "token_id")?;
    if !cairn_common::token::revoke(&state.pool, token_id).await? {
        return Err(ApiError::not_found("token"));
    }
    Ok(Json(RevokedToken {
        token_id: token_id.into(),
        revoked: true,
    }))
}
