//! Credential rotation: snapshots taken under an agent's older credentials are retired
//! from reuse, because shell code may have copied a token into a tree. Rotation does not
//! revoke the token at its issuer.

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::AppState;
use axum::extract::{Path, State};
use axum::Json;
use cairn_common::lineage;
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, Serialize, ToSchema)]
pub struct Rotation {
    pub agent: String,
    /// The new credential generation.
    pub generation: i64,
    /// Snapshots retired from reuse by this rotation.
    pub snapshots_retired: i64,
}

/// Rotate an agent's credential generation (a platform admin).
#[utoipa::path(post, operation_id = "rotate_agent_credentials", tag = "credentials", path = "/api/v1/agents/{agent}/credentials/rotate",
    params(("agent" = String, Path)),
    responses((status = 200, body = Rotation), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn rotate(
    State(state): State<AppState>,
    caller: Caller,
    Path(agent): Path<String>,
) -> Result<Json<Rotation>, ApiError> {
    caller.require(Role::Admin)?;
    // An agent's credential generation retires its snapshots in every tenant.
    caller.require_platform()?;
    let valid = !agent.is_empty()
        && agent.len() <= 128
        && agent
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !valid {
        return Err(ApiError::unprocessable(
            "agent",
            "1 to 128 characters of letters, digits, '.', '_' or '-'",
        ));
    }
    let mut tx = state.pool.begin().await?;
    let before: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM project_snapshots WHERE agent = $1 AND retention = 'current'",
    )
    .bind(&agent)
    .fetch_one(&mut *tx)
    .await?;
    let generation = lineage::rotate_credentials(&mut tx, &agent).await?;
    let after: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM project_snapshots WHERE agent = $1 AND retention = 'current'",
    )
    .bind(&agent)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Json(Rotation {
        agent,
        generation,
        snapshots_retired: before - after,
    }))
}
