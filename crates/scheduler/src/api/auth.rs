//! Bearer tokens with roles. Only a SHA-256 of each token is stored.

use super::error::ApiError;
use super::AppState;
use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use cairn_common::digest::sha256_hex;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads runs, journals, candidates and status.
    Viewer,
    /// Also submits and cancels runs.
    Operator,
    /// Also changes the policy, admits continuations and manages tokens.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

/// The authenticated caller of a request.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub token_id: Uuid,
    pub role: Role,
}

impl Caller {
    /// Fails with 403 unless the caller has at least `role`.
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.role >= role {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "this needs the {} role; the token has {}",
                role.as_str(),
                self.role.as_str()
            )))
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(ApiError::unauthorized)?;
        let row: Option<(Uuid, String)> = sqlx::query_as(
            "SELECT id, role FROM api_tokens WHERE token_hash = $1 AND revoked_at IS NULL",
        )
        .bind(hash(token))
        .fetch_optional(&state.pool)
        .await?;
        let (token_id, role) = row.ok_or_else(ApiError::unauthorized)?;
        let role = Role::parse(&role).ok_or_else(ApiError::unauthorized)?;
        Ok(Caller { token_id, role })
    }
}

pub fn hash(token: &str) -> Vec<u8> {
    hex::decode(sha256_hex(token.as_bytes())).unwrap_or_default()
}

/// A new random token: `cairn_` and 64 hex characters.
pub fn generate() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("cairn_{}", hex::encode(bytes))
}

/// Stores a token (its hash) with a role; returns its id.
pub async fn insert(
    pool: &PgPool,
    name: &str,
    role: Role,
    token: &str,
) -> Result<Uuid, sqlx::Error> {
    let id = Uuid::new_v4();
    sqlx::query("INSERT INTO api_tokens (id, name, role, token_hash) VALUES ($1, $2, $3, $4)")
        .bind(id)
        .bind(name)
        .bind(role.as_str())
        .bind(hash(token))
        .execute(pool)
        .await?;
    Ok(id)
}

/// Makes the bootstrap admin token usable; a no-op when it already exists.
pub async fn bootstrap_admin(pool: &PgPool, token: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO api_tokens (id, name, role, token_hash) VALUES ($1, 'bootstrap-admin', 'admin', $2)
         ON CONFLICT (token_hash) DO NOTHING",
    )
    .bind(Uuid::new_v4())
    .bind(hash(token))
    .execute(pool)
    .await?;
    Ok(())
}
