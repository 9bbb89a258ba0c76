//! The scheduler's HTTP API (JSON, bearer tokens).
//!
//! - [`error`]: the error body every route shares.
//! - [`json`]: the strict JSON extractor.
//! - [`auth`]: tokens and roles.
//! - [`runs`], [`policy`], [`continuation`], [`verification`], [`tokens`], [`credentials`]:
//!   the routes.
//! - [`openapi`]: the generated OpenAPI document.

pub mod auth;
pub mod continuation;
pub mod credentials;
pub mod error;
pub mod json;
pub mod openapi;
pub mod pause;
pub mod policy;
pub mod runs;
pub mod tokens;
pub mod verification;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use cairn_common::ids::Id;
use error::ApiError;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use sqlx::PgPool;
use uuid::Uuid;

/// The API's counters.
#[derive(Clone, Default)]
pub struct ApiMetrics {
    pub runs_admitted: Counter,
    pub continuations_admitted: Counter,
    pub verifications_adopted: Counter,
}

impl ApiMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "runs_admitted",
            "Runs admitted (each with its ticket and outbox message)",
            metrics.runs_admitted.clone(),
        );
        registry.register(
            "continuations_admitted",
            "Reviewed continuation actions admitted",
            metrics.continuations_admitted.clone(),
        );
        registry.register(
            "verifications_adopted",
            "Verification handoffs adopted (each queued on the same ticket)",
            metrics.verifications_adopted.clone(),
        );
        metrics
    }
}

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub metrics: ApiMetrics,
}

/// Parses a path id, or a 400 naming it.
pub fn path_id(text: &str, field: &str) -> Result<Uuid, ApiError> {
    text.parse::<Id>()
        .map(Id::uuid)
        .map_err(|_| ApiError::invalid_id(field))
}

async fn not_found() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "no_such_route",
        "no such route",
    )
}

/// Every route of the API.
pub fn router(state: AppState) -> Router {
    let checkpoint = "/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}";
    let final_outcome = "/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}";
    Router::new()
        .route(
            "/api/v1/openapi.json",
            get(|| async { ([("content-type", "application/json")], openapi::json()) }),
        )
        .route("/api/v1/runs", post(runs::submit).get(runs::list))
        .route("/api/v1/runs/batch", post(runs::submit_batch))
        .route("/api/v1/runs/{run_id}", get(runs::show))
        .route("/api/v1/runs/{run_id}/cancel", post(runs::cancel))
        .route(
            "/api/v1/runs/{run_id}/pause",
            post(pause::pause).get(pause::show),
        )
        .route("/api/v1/runs/{run_id}/resume", post(pause::resume))
        .route(
            "/api/v1/runs/{run_id}/execution-requests",
            get(runs::execution_requests),
        )
        .route("/api/v1/runs/{run_id}/journal", get(runs::journal))
        .route(
            "/api/v1/invalid-read-continuity/policy",
            get(policy::get_policy).put(policy::put_policy),
        )
        .route(
            &format!("{checkpoint}/candidate"),
            get(continuation::checkpoint_candidate),
        )
        .route(
            &format!("{checkpoint}/actions/{{action_id}}"),
            post(continuation::checkpoint_action),
        )
        .route(
            &format!("{checkpoint}/status"),
            get(continuation::checkpoint_status),
        )
        .route(
            &format!("{final_outcome}/candidate"),
            get(continuation::final_candidate),
        )
        .route(
            &format!("{final_outcome}/actions/{{action_id}}"),
            post(continuation::final_action),
        )
        .route(
            &format!("{final_outcome}/status"),
            get(continuation::final_status),
        )
        .route(
            "/api/v1/runs/{run_id}/verification-handoffs/candidates",
            get(verification::candidates),
        )
        .route(
            "/api/v1/runs/{run_id}/verification-handoffs/adoptions",
            post(verification::adopt),
        )
        .route(
            "/api/v1/runs/{run_id}/verification-handoffs/adoptions/{request_id}",
            get(verification::adoption),
        )
        .route(
            "/api/v1/agents/{agent}/credentials/rotate",
            post(credentials::rotate),
        )
        .route("/api/v1/tokens", post(tokens::create))
        .route("/api/v1/tokens/{token_id}/revoke", post(tokens::revoke))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(8 * 1024 * 1024))
        .with_state(state)
}
