//! The saved-work recovery policy: whether reviewed continuations may be admitted at all,
//! and the longest window one may have. Every kind is off by default.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use sqlx::{PgConnection, PgPool};
use utoipa::ToSchema;
use uuid::Uuid;

/// The hard ceiling on any continuation window.
pub const MAX_WINDOW_SECONDS: i32 = 7_200;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct Policy {
    /// Master switch of saved-work recovery.
    pub enabled: bool,
    /// Permits review and admission of checkpoint continuations.
    pub allow_checkpoint_continuation: bool,
    /// Permits review and admission of final-outcome continuations.
    pub allow_final_outcome_continuation: bool,
    /// Longest window an action may ask for, 1..=7200 seconds.
    pub maximum_window_seconds: i32,
    /// Grows with every saved change.
    pub revision: i64,
    pub updated_at: DateTime<Utc>,
}

/// `PUT` body: only the named settings change; unknown fields and `null` are rejected.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyUpdate {
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub enabled: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub allow_checkpoint_continuation: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false)]
    pub allow_final_outcome_continuation: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    #[schema(nullable = false, minimum = 1, maximum = 7200)]
    pub maximum_window_seconds: Option<i32>,
}

/// A field that is present must hold a value: `null` is an error, not "unchanged".
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

impl Policy {
    pub fn allows_checkpoint_continuation(&self) -> bool {
        self.enabled && self.allow_checkpoint_continuation
    }

    pub fn allows_final_outcome_continuation(&self) -> bool {
        self.enabled && self.allow_final_outcome_continuation
    }

    /// The window a candidate may offer.
    pub fn window_limit(&self) -> i32 {
        self.maximum_window_seconds.clamp(1, MAX_WINDOW_SECONDS)
    }
}

const SELECT: &str =
    "SELECT enabled, allow_checkpoint_continuation, allow_final_outcome_continuation,
                maximum_window_seconds, revision, updated_at
           FROM recovery_policy";

/// The tenant of a run, for an admission on it; an unknown run reads the default
/// tenant's policy and is then refused as unknown.
const OF_RUN: &str =
    "WHERE tenant_id = COALESCE((SELECT tenant_id FROM runs WHERE id = $1), 'default')";

/// A tenant's policy as it stands, for reading.
pub async fn load(pool: &PgPool, tenant: &str) -> Result<Policy, sqlx::Error> {
    sqlx::query_as(&format!("{SELECT} WHERE tenant_id = $1"))
        .bind(tenant)
        .fetch_one(pool)
        .await
}

/// The policy of the run's tenant, for reading.
pub async fn load_of_run(pool: &PgPool, run_id: Uuid) -> Result<Policy, sqlx::Error> {
    sqlx::query_as(&format!("{SELECT} {OF_RUN}"))
        .bind(run_id)
        .fetch_one(pool)
        .await
}

/// The policy an admission on the run decides on (its tenant's), read under a share
/// lock held until the admission commits: a change saved meanwhile waits for it, and a
/// change saved before it is what it reads. So once a `PUT` returns, no admission decides
/// on the old policy.
pub async fn load_locked(conn: &mut PgConnection, run_id: Uuid) -> Result<Policy, sqlx::Error> {
    sqlx::query_as(&format!("{SELECT} {OF_RUN} FOR SHARE"))
        .bind(run_id)
        .fetch_one(conn)
        .await
}

/// Gives a new tenant its policy, every setting at its default.
pub async fn create_for(conn: &mut PgConnection, tenant: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO recovery_policy (tenant_id) VALUES ($1)")
        .bind(tenant)
        .execute(conn)
        .await?;
    Ok(())
}

/// Saves the named settings and preserves the others.
pub async fn update(
    pool: &PgPool,
    tenant: &str,
    change: &PolicyUpdate,
    by: Uuid,
) -> Result<Policy, sqlx::Error> {
    sqlx::query_as(
        "UPDATE recovery_policy
            SET enabled = COALESCE($1, enabled),
                allow_checkpoint_continuation = COALESCE($2, allow_checkpoint_continuation),
                allow_final_outcome_continuation = COALESCE($3, allow_final_outcome_continuation),
                maximum_window_seconds = COALESCE($4, maximum_window_seconds),
                revision = revision + 1,
                updated_at = now(),
                updated_by = $5
          WHERE tenant_id = $6
      RETURNING enabled, allow_checkpoint_continuation, allow_final_outcome_continuation,
                maximum_window_seconds, revision, updated_at",
    )
    .bind(change.enabled)
    .bind(change.allow_checkpoint_continuation)
    .bind(change.allow_final_outcome_continuation)
    .bind(change.maximum_window_seconds)
    .bind(by)
    .bind(tenant)
    .fetch_one(pool)
    .await
}
