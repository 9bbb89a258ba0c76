//! Every route of the API, in groups, each behind the tenancy guard.

use super::error::ApiError;
use super::{
    continuation, credentials, network_policy, openapi, overview, pause, policy, publication,
    qualification, queues, reaper, runs, sandboxes, session, tenancy, tenants, tokens,
    verification, workers, AppState,
};
use axum::extract::DefaultBodyLimit;
use axum::routing::{any, get, post, put};
use axum::Router;

async fn not_found() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "no_such_route",
        "no such route",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}

/// Every route of the API.
pub fn router(state: AppState) -> Router {
    let guarded = Router::new()
        .merge(run_routes())
        .merge(continuation_routes())
        .merge(sandbox_routes())
        .merge(platform_routes())
        // Every route with a bearer token passes the guard before its handler.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            tenancy::guard,
        ));
    Router::new()
        .route(
            "/api/v1/openapi.json",
            get(|| async { ([("content-type", "application/json")], openapi::json()) }),
        )
        .merge(guarded)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Outside the guard, so that its refusals on a preview route are marked too.
        .layer(axum::middleware::from_fn(sandboxes::preview::mark_refusals))
        .layer(DefaultBodyLimit::max(8 * 1024 * 1024))
        .with_state(state)
}

/// Runs: admission, views, their journal and output, cancel and pause.
fn run_routes() -> Router<AppState> {
    Router::new()
        .route(
            "/api/v1/runs",
            post(runs::admission::submit).get(runs::view::list),
        )
        .route("/api/v1/runs/batch", post(runs::admission::submit_batch))
        .route("/api/v1/runs/bulk", post(runs::bulk::bulk))
        .route("/api/v1/runs/counts", get(runs::view::counts))
        .route("/api/v1/runs/events", get(runs::events::events))
        .route("/api/v1/runs/{run_id}", get(runs::view::show))
        .route("/api/v1/runs/{run_id}/cancel", post(runs::cancel))
        .route("/api/v1/runs/{run_id}/rerun", post(runs::rerun::rerun))
        .route(
            "/api/v1/runs/{run_id}/pause",
            post(pause::pause).get(pause::show),
        )
        .route("/api/v1/runs/{run_id}/resume", post(pause::resume))
        .route(
            "/api/v1/runs/{run_id}/execution-requests",
            get(runs::view::execution_requests),
        )
        .route("/api/v1/runs/{run_id}/journal", get(runs::journal::journal))
        .route(
            "/api/v1/runs/{run_id}/reconciliation",
            get(runs::reconciliation::show),
        )
        .route(
            "/api/v1/runs/{run_id}/reconciliation/decisions",
            get(runs::reconciliation::list),
        )
        .route(
            "/api/v1/runs/{run_id}/reconciliation/decisions/{decision_id}",
            post(runs::reconciliation::decide).get(runs::reconciliation::read),
        )
        .route(
            "/api/v1/runs/{run_id}/publications",
            post(publication::request),
        )
        .route(
            "/api/v1/runs/{run_id}/publications/{request_id}",
            get(publication::show),
        )
        .route(
            "/api/v1/runs/{run_id}/delivery-hold",
            get(publication::hold)
                .put(publication::set_hold)
                .delete(publication::clear_hold),
        )
        .route(
            "/api/v1/runs/{run_id}/steps/{step_key}/output",
            get(runs::output::output),
        )
}

/// Saved-work recovery: the policy, reviewed continuations and verification handoffs.
fn continuation_routes() -> Router<AppState> {
    let checkpoint = "/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}";
    let final_outcome = "/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}";
    Router::new()
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
            post(verification::adopt).get(verification::adoptions),
        )
        .route(
            "/api/v1/runs/{run_id}/verification-handoffs/adoptions/{request_id}",
            get(verification::adoption),
        )
}

/// Sandboxes, their operations and snapshots.
/// Previews: every method, at a port's root (with or without its `/`) and beneath it.
fn preview_routes() -> Router<AppState> {
    let root = any(sandboxes::preview::preview_root);
    Router::new()
        .route(
            "/api/v1/sandboxes/{sandbox_id}/preview/{port}",
            root.clone(),
        )
        .route("/api/v1/sandboxes/{sandbox_id}/preview/{port}/", root)
        .route(
            "/api/v1/sandboxes/{sandbox_id}/preview/{port}/{*path}",
            any(sandboxes::preview::preview),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/services/{name}",
            put(sandboxes::services::set).delete(sandboxes::services::delete),
        )
}

/// Volumes, and the calls a running exec takes.
fn volume_routes() -> Router<AppState> {
    Router::new()
        .route(
            "/api/v1/sandboxes/{sandbox_id}/operations/{operation_id}/input",
            post(sandboxes::control::input),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/operations/{operation_id}/resize",
            post(sandboxes::control::resize),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/operations/{operation_id}/kill",
            post(sandboxes::control::kill),
        )
        .route(
            "/api/v1/volumes",
            post(sandboxes::volumes::create).get(sandboxes::volumes::list),
        )
        .route(
            "/api/v1/volumes/{volume_id}",
            get(sandboxes::volumes::show).delete(sandboxes::volumes::delete),
        )
}

fn sandbox_routes() -> Router<AppState> {
    Router::new()
        .merge(preview_routes())
        .merge(volume_routes())
        .route(
            "/api/v1/sandboxes",
            post(sandboxes::create::create).get(sandboxes::view::list),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}",
            get(sandboxes::view::show).delete(sandboxes::lifecycle::destroy),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/stop",
            post(sandboxes::lifecycle::stop),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/resume",
            post(sandboxes::lifecycle::resume),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/pause",
            post(sandboxes::lifecycle::pause),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/extend",
            post(sandboxes::lifecycle::extend),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/exec",
            post(sandboxes::operations::exec),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/files",
            get(sandboxes::operations::list),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/files/content",
            get(sandboxes::operations::read).put(sandboxes::operations::write),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/operations",
            get(sandboxes::view::operations),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/operations/{operation_id}",
            get(sandboxes::view::show_operation),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/operations/{operation_id}/output",
            get(sandboxes::output::output),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/fork",
            post(sandboxes::fork::fork),
        )
        .route(
            "/api/v1/sandboxes/{sandbox_id}/snapshots",
            post(sandboxes::snapshots::create),
        )
        .route("/api/v1/snapshots", get(sandboxes::snapshots::list))
        .route(
            "/api/v1/templates",
            post(sandboxes::templates::create).get(sandboxes::templates::list),
        )
        .route(
            "/api/v1/templates/{template_id}",
            get(sandboxes::templates::show),
        )
        .route(
            "/api/v1/snapshots/{snapshot_id}",
            get(sandboxes::snapshots::show).delete(sandboxes::snapshots::delete),
        )
        .route(
            "/api/v1/snapshots/{snapshot_id}/restore",
            post(sandboxes::snapshots::restore),
        )
}

/// Who is calling, workers, the reaper, tokens, tenants and credentials.
fn platform_routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/workers", get(workers::list))
        .route("/api/v1/queues", get(queues::show))
        .route("/api/v1/reaper", get(reaper::show))
        .route("/api/v1/overview", get(overview::show))
        .route("/api/v1/session", get(session::show))
        .route(
            "/api/v1/agents/{agent}/credentials/rotate",
            post(credentials::rotate),
        )
        .route("/api/v1/tokens", post(tokens::create).get(tokens::list))
        .route("/api/v1/tokens/{token_id}/revoke", post(tokens::revoke))
        .route("/api/v1/tenants", post(tenants::create).get(tenants::list))
        .route(
            "/api/v1/tenants/{tenant_id}/network-policy",
            get(network_policy::show).put(network_policy::set),
        )
        .route("/api/v1/qualification", get(qualification::show))
        .route(
            "/api/v1/qualification/profiles/{profile_digest}",
            put(qualification::set),
        )
}
