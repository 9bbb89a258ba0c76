//! A tenant's layer of the step egress policy: read by the tenant's tokens, set by a
//! platform admin (a tenant cannot widen what the platform gave it).

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::json::StrictJson;
use super::AppState;
use axum::extract::{Path, State};
use axum::Json;
use cairn_common::egress::NetworkSpec;
use cairn_common::network_policy::{self, TenantNetwork};
use serde::Deserialize;
use utoipa::ToSchema;

/// `PUT` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicyUpdate {
    /// `true`: the operator's policy as it is; `false`: no network for any step or
    /// sandbox of the tenant; `{"allow": [...]}`: the operator's policy narrowed to
    /// these (1 to 64 `HOST:PORT`, `IP[/PREFIX][:PORT]` or `[IPV6[/PREFIX]]:PORT`).
    pub network: NetworkSpec,
}

/// Read a tenant's network policy (its own tokens, or a platform token).
#[utoipa::path(get, operation_id = "get_tenant_network_policy", tag = "tenants", path = "/api/v1/tenants/{tenant_id}/network-policy",
    params(("tenant_id" = String, Path, description = "The tenant")),
    responses((status = 200, body = TenantNetwork), (status = 401, body = ErrorBody),
        (status = 404, description = "No such tenant", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant_id): Path<String>,
) -> Result<Json<TenantNetwork>, ApiError> {
    caller.require(Role::Viewer)?;
    network_policy::load(&state.pool, &tenant_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("tenant"))
}

/// Set a tenant's network policy (platform admin). It applies to every step claimed and
/// every sandbox started or resumed after it is saved; a run's or sandbox's own
/// `network` narrows it further.
#[utoipa::path(put, operation_id = "set_tenant_network_policy", tag = "tenants", path = "/api/v1/tenants/{tenant_id}/network-policy",
    params(("tenant_id" = String, Path, description = "The tenant")),
    request_body = NetworkPolicyUpdate,
    responses((status = 200, body = TenantNetwork), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No such tenant", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn set(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant_id): Path<String>,
    StrictJson(update): StrictJson<NetworkPolicyUpdate>,
) -> Result<Json<TenantNetwork>, ApiError> {
    caller.require(Role::Admin)?;
    caller.require_platform()?;
    if let Some(problem) = update.network.problem() {
        return Err(ApiError::unprocessable("network.allow", problem));
    }
    network_policy::save(&state.pool, &tenant_id, &update.network, caller.token_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("tenant"))
}
