//! A tenant's layer of the step egress policy, and the one writer of its table. It sits
//! between the operator's policy (the worker's settings) and a run's or sandbox's own
//! `network`, and like them it only narrows ([`crate::egress::Effective`]). Workers read
//! it when they claim a job or place a sandbox, so a saved change applies to every step
//! claimed and every sandbox started after it.

use crate::egress::NetworkSpec;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::types::Json;
use sqlx::PgPool;
use utoipa::ToSchema;
use uuid::Uuid;

/// The SQL expression of the layer of the tenant in `tenant_column`, for a reader that
/// reads it in its own query; `NULL` where the tenant has none (it narrows nothing).
pub fn of_tenant(tenant_column: &str) -> String {
    format!("(SELECT np.network FROM network_policy np WHERE np.tenant_id = {tenant_column})")
}

/// A tenant's network policy as it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct TenantNetwork {
    pub tenant_id: String,
    /// `true`: the operator's policy as it is; `false`: no network for any step or
    /// sandbox of the tenant; `{"allow": [...]}`: the operator's policy narrowed to these.
    pub network: NetworkSpec,
    /// Grows with every saved change; 0 before the first.
    pub revision: i64,
    /// `null` before the first change.
    pub updated_at: Option<DateTime<Utc>>,
}

type Row = (
    String,
    Option<Json<NetworkSpec>>,
    Option<i64>,
    Option<DateTime<Utc>>,
);

impl TenantNetwork {
    fn from_row((tenant_id, network, revision, updated_at): Row) -> TenantNetwork {
        TenantNetwork {
            tenant_id,
            network: network.map_or(NetworkSpec::On(true), |n| n.0),
            revision: revision.unwrap_or(0),
            updated_at,
        }
    }
}

/// The policy of `tenant`; `None` for an unknown tenant.
pub async fn load(pool: &PgPool, tenant: &str) -> Result<Option<TenantNetwork>, sqlx::Error> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT t.id, np.network, np.revision, np.updated_at
           FROM tenants t LEFT JOIN network_policy np ON np.tenant_id = t.id
          WHERE t.id = $1",
    )
    .bind(tenant)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(TenantNetwork::from_row))
}

/// Saves `network` as `tenant`'s policy; `None` for an unknown tenant. The caller has
/// checked it ([`NetworkSpec::problem`]).
pub async fn save(
    pool: &PgPool,
    tenant: &str,
    network: &NetworkSpec,
    by: Uuid,
) -> Result<Option<TenantNetwork>, sqlx::Error> {
    let row: Option<Row> = sqlx::query_as(
        "INSERT INTO network_policy (tenant_id, network, updated_by)
         SELECT id, $2, $3 FROM tenants WHERE id = $1
         ON CONFLICT (tenant_id) DO UPDATE
            SET network = EXCLUDED.network, updated_by = EXCLUDED.updated_by,
                revision = network_policy.revision + 1, updated_at = now()
         RETURNING tenant_id, network, revision, updated_at",
    )
    .bind(tenant)
    .bind(Json(network))
    .bind(by)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(TenantNetwork::from_row))
}
