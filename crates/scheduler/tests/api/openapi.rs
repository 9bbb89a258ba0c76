//! The OpenAPI document.

use axum::http::StatusCode;

use super::harness::*;

#[tokio::test]
async fn the_openapi_document_lists_every_route() {
    let api = Api::new().await;
    let (status, doc) = api.call("GET", "/api/v1/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
    let routes = [
        ("post", "/api/v1/runs"),
        ("get", "/api/v1/runs"),
        ("post", "/api/v1/runs/batch"),
        ("get", "/api/v1/runs/{run_id}"),
        ("post", "/api/v1/runs/{run_id}/cancel"),
        ("get", "/api/v1/runs/{run_id}/execution-requests"),
        ("get", "/api/v1/runs/{run_id}/journal"),
        ("get", "/api/v1/invalid-read-continuity/policy"),
        ("put", "/api/v1/invalid-read-continuity/policy"),
        ("get", "/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}/candidate"),
        ("post", "/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}/actions/{action_id}"),
        ("get", "/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}/status"),
        ("get", "/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}/candidate"),
        ("post", "/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}/actions/{action_id}"),
        ("get", "/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}/status"),
        ("post", "/api/v1/tokens"),
        ("post", "/api/v1/tokens/{token_id}/revoke"),
        ("post", "/api/v1/agents/{agent}/credentials/rotate"),
        ("get", "/api/v1/runs/{run_id}/verification-handoffs/candidates"),
        ("post", "/api/v1/runs/{run_id}/verification-handoffs/adoptions"),
        ("get", "/api/v1/runs/{run_id}/verification-handoffs/adoptions/{request_id}"),
        ("post", "/api/v1/sandboxes"),
        ("get", "/api/v1/sandboxes"),
        ("get", "/api/v1/sandboxes/{sandbox_id}"),
        ("delete", "/api/v1/sandboxes/{sandbox_id}"),
        ("post", "/api/v1/sandboxes/{sandbox_id}/stop"),
        ("post", "/api/v1/sandboxes/{sandbox_id}/resume"),
        ("post", "/api/v1/sandboxes/{sandbox_id}/pause"),
        ("post", "/api/v1/sandboxes/{sandbox_id}/extend"),
        ("post", "/api/v1/sandboxes/{sandbox_id}/exec"),
        ("get", "/api/v1/sandboxes/{sandbox_id}/files"),
        ("get", "/api/v1/sandboxes/{sandbox_id}/files/content"),
        ("put", "/api/v1/sandboxes/{sandbox_id}/files/content"),
        ("get", "/api/v1/sandboxes/{sandbox_id}/operations"),
        ("post", "/api/v1/sandboxes/{sandbox_id}/fork"),
        ("post", "/api/v1/sandboxes/{sandbox_id}/snapshots"),
        ("get", "/api/v1/snapshots"),
        ("get", "/api/v1/snapshots/{snapshot_id}"),
        ("delete", "/api/v1/snapshots/{snapshot_id}"),
        ("post", "/api/v1/snapshots/{snapshot_id}/restore"),
    ];
    for (method, path) in routes {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} missing from the OpenAPI document"
        );
    }
    let (status, error) = api.call("GET", "/api/v1/nothing-here", None, None).await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::NOT_FOUND, "no_such_route")
    );
}
