//! The fleet over time, for the console's charts: the samples the overview sampler
//! recorded ([`cairn_common::overview`]). They span every tenant, so a platform token
//! reads them.

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::AppState;
use axum::extract::{Query, State};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OverviewQuery {
    /// How far back, in minutes: 1 to 1440 (default 60).
    #[param(minimum = 1, maximum = 1440)]
    pub minutes: Option<i32>,
}

/// The fleet over one interval, ending at `at`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SampleView {
    pub at: DateTime<Utc>,
    /// Runs that ended in the interval, per second: all, completed and failed
    /// (cancelled runs count in `runs_per_second` only).
    pub runs_per_second: f64,
    pub completed_per_second: f64,
    pub failed_per_second: f64,
    /// Runs queued at the interval's end, flow-control holds included.
    pub queued: i32,
    /// Of the queued runs, those held by flow control.
    pub held: i32,
    pub running: i32,
    /// Runs waiting for a person: reconciliation, a checkpoint's review, a verification.
    pub needs_person: i32,
    /// Live workers (a beat in the last 5 s).
    pub workers: i32,
    /// From admission to a worker's claim, of the requests claimed in the interval; absent
    /// when none was.
    pub admission_to_start_p50_ms: Option<f64>,
    pub admission_to_start_p95_ms: Option<f64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OverviewView {
    /// Seconds per sample (`CAIRN_OVERVIEW_INTERVAL_SECONDS` of the sampling scheduler).
    pub interval_seconds: i32,
    pub now: DateTime<Utc>,
    /// Oldest first; an interval no scheduler sampled is missing, not zero.
    pub samples: Vec<SampleView>,
}

impl From<cairn_common::overview::Sample> for SampleView {
    fn from(s: cairn_common::overview::Sample) -> Self {
        let per_second = |n: i32| f64::from(n) / f64::from(s.interval_seconds.max(1));
        SampleView {
            at: s.at,
            runs_per_second: per_second(s.completed + s.failed + s.cancelled),
            completed_per_second: per_second(s.completed),
            failed_per_second: per_second(s.failed),
            queued: s.queued,
            held: s.held,
            running: s.running,
            needs_person: s.needs_person,
            workers: s.workers,
            admission_to_start_p50_ms: s.admission_to_start_p50_ms,
            admission_to_start_p95_ms: s.admission_to_start_p95_ms,
        }
    }
}

/// The fleet's samples over the last `minutes` (a platform token): runs ended per
/// second, queue depth, admission→start latency, runs waiting for a person, workers.
#[utoipa::path(get, operation_id = "get_overview", tag = "overview", path = "/api/v1/overview",
    params(OverviewQuery),
    responses((status = 200, body = OverviewView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, description = "A tenant's token: the samples span every tenant", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<OverviewQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<OverviewView>, ApiError> {
    caller.require(Role::Viewer)?;
    caller.require_platform()?;
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let minutes = query.minutes.unwrap_or(60);
    if !(1..=1440).contains(&minutes) {
        return Err(
            ApiError::bad_request("invalid_query", "minutes is from 1 to 1440")
                .with_field("minutes"),
        );
    }
    let samples = cairn_common::overview::since(&state.pool, minutes).await?;
    let interval_seconds = samples.last().map_or(10, |s| s.interval_seconds);
    Ok(Json(OverviewView {
        interval_seconds,
        now: Utc::now(),
        samples: samples.into_iter().map(SampleView::from).collect(),
    }))
}
