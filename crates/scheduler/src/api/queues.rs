//! How the runs' queue and flow control stand: runs held by flow control, queued for a
//! worker and executing; the workers' free run slots; and each concurrency or rate key.

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::AppState;
use axum::extract::State;
use axum::Json;
use cairn_common::request::gate::{self, KeyStanding};
use serde::Serialize;
use utoipa::ToSchema;

/// The runs' requests by where they stand.
#[derive(Debug, Serialize, ToSchema, sqlx::FromRow)]
pub struct RunQueue {
    /// Held by flow control (concurrency key, rate limit or priority).
    pub held: i64,
    /// Released to the workers, not yet claimed.
    pub queued: i64,
    pub executing: i64,
    /// The live workers' run slots.
    pub slots: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Queues {
    pub runs: RunQueue,
    /// Each key with runs waiting or in flight.
    pub keys: Vec<KeyStanding>,
}

/// The runs' queue and flow control, across tenants (platform tokens only).
#[utoipa::path(get, operation_id = "get_queues", tag = "workers", path = "/api/v1/queues",
    responses((status = 200, body = Queues), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(State(state): State<AppState>, caller: Caller) -> Result<Json<Queues>, ApiError> {
    caller.require(Role::Viewer)?;
    caller.require_platform()?;
    let mut conn = state.pool.acquire().await?;
    let runs: RunQueue = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE held_by_gate AND state = 'queued') AS held,
                count(*) FILTER (WHERE NOT held_by_gate AND state = 'queued') AS queued,
                count(*) FILTER (WHERE state = 'executing') AS executing,
                (SELECT COALESCE(sum(run_slots), 0) FROM worker_heartbeats
                  WHERE beat_at > now() - make_interval(secs => $1))::bigint AS slots
           FROM execution_requests WHERE kind = 'run' AND state IN ('queued', 'executing')",
    )
    .bind(cairn_common::heartbeat::LAPSE.as_secs_f64())
    .fetch_one(&mut *conn)
    .await?;
    let keys = gate::standings(&mut conn).await?;
    Ok(Json(Queues { runs, keys }))
}
