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

/// Every operation has one operationId, unique, in one style (`verb_noun`, snake case),
/// and one tag the document declares; every error code is listed with its meaning.
#[tokio::test]
async fn every_operation_is_named_tagged_and_its_errors_listed() {
    let api = Api::new().await;
    let (_, doc) = api.call("GET", "/api/v1/openapi.json", None, None).await;
    let declared: Vec<&str> = doc["tags"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    let verbs = [
        "get", "list", "count", "create", "submit", "cancel", "pause", "resume", "set", "clear",
        "request", "adopt", "revoke", "rotate", "stop", "destroy", "extend", "exec", "read",
        "write", "fork", "delete", "restore", "send", "resize", "kill",
    ];
    let mut ids = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        for (method, operation) in item.as_object().into_iter().flatten() {
            let id = operation["operationId"].as_str().unwrap_or_default();
            let (verb, noun) = id.split_once('_').unwrap_or((id, ""));
            assert!(
                verbs.contains(&verb)
                    && !noun.is_empty()
                    && noun.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{method} {path}: operationId {id:?} is not verb_noun"
            );
            assert!(ids.insert(id.to_string()), "{id} names two operations");
            let tags: Vec<&str> = operation["tags"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str())
                .collect();
            assert!(
                tags.len() == 1 && declared.contains(&tags[0]),
                "{method} {path}: tags {tags:?}"
            );
        }
    }
    let codes = doc["x-error-codes"].as_object().expect("x-error-codes");
    for code in [
        "not_found",
        "action_id_conflict",
        "candidate_held",
        "validation_failed",
        "unauthorized",
    ] {
        assert!(
            codes[code]["description"].is_string() && codes[code]["status"].is_u64(),
            "{code}"
        );
    }
    let example = &doc["components"]["schemas"]["FinalOutcomeContinuationInputV1"]["examples"][0];
    assert_eq!(
        example["acknowledge_already_consumed_final_output"], true,
        "{example}"
    );
}
