//! The workers that beat: which are alive, since when, and whether they are waiting for
//! work, and which leases each holds. A client tells from it that a queued run has
//! nobody to take it.

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::AppState;
use axum::extract::State;
use axum::Json;
use cairn_common::ids::Id;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::HashMap;
use utoipa::ToSchema;
use uuid::Uuid;

/// A worker is alive while its beats (one a second) are this recent.
const ALIVE_WITHIN_SECONDS: f64 = 5.0;

#[derive(Debug, Serialize, ToSchema)]
pub struct LeaseView {
    #[schema(value_type = String)]
    pub request_id: Id,
    #[schema(value_type = String)]
    pub run_id: Id,
    /// The fence: the epoch of this lease.
    pub lease_epoch: i64,
    /// It lapses then unless renewed.
    pub lease_deadline: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
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
    /// Jobs (runs, continuations, verifications) it runs at once (absent: a worker of
    /// an earlier version, whose sandboxes took job slots).
    pub run_slots: Option<i32>,
    /// Sandboxes it hosts at once, apart from its job slots.
    pub sandbox_slots: Option<i32>,
    /// The sandboxes it hosts now (of the caller's tenant, unless a platform token asks).
    pub sandboxes_hosted: i64,
    /// The execution requests it holds now.
    pub leases: Vec<LeaseView>,
}

#[derive(sqlx::FromRow)]
struct WorkerRow {
    worker_id: String,
    beat_at: DateTime<Utc>,
    beating_since: DateTime<Utc>,
    alive: bool,
    starved_since: Option<DateTime<Utc>>,
    run_slots: Option<i32>,
    sandbox_slots: Option<i32>,
    sandboxes_hosted: i64,
}

#[derive(sqlx::FromRow)]
struct LeaseRow {
    owner: String,
    request_id: Uuid,
    run_id: Uuid,
    lease_epoch: i64,
    lease_deadline: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WorkerList {
    pub workers: Vec<WorkerView>,
}

/// Workers that beat in the last hour, alive ones first, with the leases they hold (of
/// the caller's tenant's runs only, unless a platform token asks).
#[utoipa::path(get, operation_id = "list_workers", tag = "workers", path = "/api/v1/workers",
    responses((status = 200, body = WorkerList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<WorkerList>, ApiError> {
    caller.require(Role::Viewer)?;
    let workers: Vec<WorkerRow> = sqlx::query_as(
        "SELECT w.worker_id, w.beat_at, w.beating_since,
                w.beat_at > now() - make_interval(secs => $1) AS alive, w.starved_since,
                w.run_slots, w.sandbox_slots,
                (SELECT count(*) FROM sandboxes s
                  WHERE s.lease_owner = w.worker_id AND s.state IN ('creating', 'running', 'paused')
                    AND ($2::text IS NULL OR s.tenant_id = $2)) AS sandboxes_hosted
           FROM worker_heartbeats w
          WHERE w.beat_at > now() - interval '1 hour'
          ORDER BY alive DESC, w.worker_id",
    )
    .bind(ALIVE_WITHIN_SECONDS)
    .bind(caller.scope())
    .fetch_all(&state.pool)
    .await?;
    let leases: Vec<LeaseRow> = sqlx::query_as(
        "SELECT e.lease_owner AS owner, e.id AS request_id, e.run_id, e.lease_epoch, e.lease_deadline
           FROM execution_requests e JOIN runs r ON r.id = e.run_id
          WHERE e.lease_owner IS NOT NULL AND e.state = 'executing'
            AND ($1::text IS NULL OR r.tenant_id = $1)
          ORDER BY e.lease_deadline",
    )
    .bind(caller.scope())
    .fetch_all(&state.pool)
    .await?;
    let mut held: HashMap<String, Vec<LeaseView>> = HashMap::new();
    for lease in leases {
        held.entry(lease.owner).or_default().push(LeaseView {
            request_id: lease.request_id.into(),
            run_id: lease.run_id.into(),
            lease_epoch: lease.lease_epoch,
            lease_deadline: lease.lease_deadline,
        });
    }
    let workers = workers
        .into_iter()
        .map(|w| WorkerView {
            leases: held.remove(&w.worker_id).unwrap_or_default(),
            worker_id: w.worker_id,
            beat_at: w.beat_at,
            beating_since: w.beating_since,
            alive: w.alive,
            starved_since: w.starved_since,
            run_slots: w.run_slots,
            sandbox_slots: w.sandbox_slots,
            sandboxes_hosted: w.sandboxes_hosted,
        })
        .collect();
    Ok(Json(WorkerList { workers }))
}
