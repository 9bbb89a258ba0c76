//! What the reaper last did, for operators: its recent sweeps and the snapshots whose
//! bytes wait for an operator's repair. The reaper writes both; the API only reads.

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::AppState;
use axum::extract::State;
use axum::Json;
use cairn_common::ids::Id;
use cairn_common::reaper_status;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

/// How many sweeps the page shows.
const RECENT_SWEEPS: i64 = 20;

#[derive(Debug, Serialize, ToSchema)]
pub struct SweepView {
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub dry_run: bool,
    /// What each rule did, and who led.
    #[schema(value_type = Object)]
    pub summary: serde_json::Value,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RepairView {
    #[schema(value_type = String)]
    pub snapshot_id: Id,
    pub kind: String,
    pub store_url: String,
    pub reason: Option<String>,
    pub attempts: i32,
    pub next_retry_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReaperView {
    /// The last 20 sweeps, newest first.
    pub sweeps: Vec<SweepView>,
    /// Snapshots whose deletion failed and waits for repair, next retry first.
    pub pending_repairs: Vec<RepairView>,
}

/// The reaper's last sweeps and its pending operator repairs (a platform token).
#[utoipa::path(get, operation_id = "get_reaper", tag = "reaper", path = "/api/v1/reaper",
    responses((status = 200, body = ReaperView), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<ReaperView>, ApiError> {
    caller.require(Role::Viewer)?;
    // Sweeps and repairs span every tenant's snapshots.
    caller.require_platform()?;
    let sweeps = reaper_status::recent_sweeps(&state.pool, RECENT_SWEEPS)
        .await?
        .into_iter()
        .map(|s| SweepView {
            started_at: s.started_at,
            finished_at: s.finished_at,
            dry_run: s.dry_run,
            summary: s.summary,
        })
        .collect();
    let pending_repairs = reaper_status::pending_repairs(&state.pool)
        .await?
        .into_iter()
        .map(|r| RepairView {
            snapshot_id: r.snapshot_id.into(),
            kind: r.kind,
            store_url: r.store_url,
            reason: r.reason,
            attempts: r.attempts,
            next_retry_at: r.next_retry_at,
        })
        .collect();
    Ok(Json(ReaperView {
        sweeps,
        pending_repairs,
    }))
}
