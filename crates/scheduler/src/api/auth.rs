//! Bearer tokens with roles, each in one tenant or a platform token. Only a SHA-256 of
//! each token is stored.

use super::error::ApiError;
use super::AppState;
use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use subtle::ConstantTimeEq;
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

/// The tenant that what a platform token creates belongs to.
pub const DEFAULT_TENANT: &str = "default";

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub token_id: Uuid,
    pub role: Role,
    /// The tenant the token belongs to; `None` for a platform token, which reaches every
    /// tenant.
    pub tenant: Option<String>,
}

impl Caller {
    /// Whether the caller reaches what belongs to `tenant`.
    pub fn reaches(&self, tenant: &str) -> bool {
        self.tenant.as_deref().is_none_or(|own| own == tenant)
    }

    /// The tenant what the caller creates belongs to.
    pub fn home(&self) -> &str {
        self.tenant.as_deref().unwrap_or(DEFAULT_TENANT)
    }

    /// The tenant a list is narrowed to; `None` lists every tenant's.
    pub fn scope(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// Fails with 403 unless this is a platform token.
    pub fn require_platform(&self) -> Result<(), ApiError> {
        match self.tenant {
            None => Ok(()),
            Some(_) => Err(ApiError::forbidden(
                "this needs a platform token; the token belongs to a tenant",
            )),
        }
    }

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
        // The tenancy guard authenticated the request already on routes with ids.
        if let Some(caller) = parts.extensions.get::<Caller>() {
            return Ok(caller.clone());
        }
        let caller = authenticate(parts, &state.pool).await?;
        parts.extensions.insert(caller.clone());
        Ok(caller)
    }
}

/// The caller a request's bearer token names, or 401.
pub async fn authenticate(parts: &Parts, pool: &PgPool) -> Result<Caller, ApiError> {
    let token = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(ApiError::unauthorized)?;
    let presented = hash(token);
    let row: Option<(Uuid, String, Option<String>, Vec<u8>)> = sqlx::query_as(
        "SELECT id, role, tenant_id, token_hash FROM api_tokens
          WHERE token_hash = $1 AND revoked_at IS NULL",
    )
    .bind(&presented)
    .fetch_optional(pool)
    .await?;
    let (token_id, role, tenant, stored) = row.ok_or_else(ApiError::unauthorized)?;
    // The lookup is by the secret's SHA-256, so its timing tells nothing of the secret;
    // the comparison that decides is constant-time all the same.
    if !bool::from(stored.ct_eq(&presented)) {
        return Err(ApiError::unauthorized());
    }
    let role = Role::parse(&role).ok_or_else(ApiError::unauthorized)?;
    Ok(Caller {
        token_id,
        role,
        tenant,
    })
}

pub use cairn_common::token::{bootstrap_admin, hash};

/// A new random token: `cairn_` and 64 hex characters.
pub fn generate() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("cairn_{}", hex::encode(bytes))
}

/// Stores a token (its hash) with a role, in `tenant` (`None`: a platform token);
/// returns its id.
pub async fn insert(
    pool: &PgPool,
    name: &str,
    role: Role,
    tenant: Option<&str>,
    token: &str,
) -> Result<Uuid, sqlx::Error> {
    cairn_common::token::insert(pool, name, role.as_str(), tenant, token).await
}
