//! The workers that beat: which are alive, since when, and whether they are waiting for
//! work. A client tells from it that a queued run has nobody to take it.

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::AppState;
use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

/// A worker is alive while its beats (one a second) are this recent.
const ALIVE_WITHIN_SECONDS: f64 = 5.0;

#[derive(Debug, Serialize, ToSchema, sqlx::FromRow)]
pub struct WorkerView {
    pub worker_id: String,
    /// Its last beat.
    pub beat_at: DateTime<Utc>,
    /// The start of its current run of beats without a gap.
    pub beating_since: DateTime<Utc>,
    /// Beat within the last 5 seconds.
    pub alive: bool,
    /// Since when it has had a free slot and no delivery to fill it, if it has.
    pub starved_since: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WorkerList {
    pub workers: Vec<WorkerView>,
}

/// Workers that beat in the last hour, alive ones first.
#[utoipa::path(get, path = "/api/v1/workers", tag = "workers", operation_id = "list_workers",
    responses((status = 200, body = WorkerList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<WorkerList>, ApiError> {
    caller.require(Role::Viewer)?;
    let workers: Vec<WorkerView> = sqlx::query_as(
        "SELECT worker_id, beat_at, beating_since,
                beat_at > now() - make_interval(secs => $1) AS alive, starved_since
           FROM worker_heartbeats
          WHERE beat_at > now() - interval '1 hour'
          ORDER BY alive DESC, worker_id",
    )
    .bind(ALIVE_WITHIN_SECONDS)
    .fetch_all(&state.pool)
    .await?;
    Ok(Json(WorkerList { workers }))
}
