//! Tokens and roles guard every route.

use axum::http::StatusCode;
use serde_json::json;

use super::harness::*;

#[tokio::test]
async fn tokens_and_roles_guard_every_route() {
    let api = Api::new().await;
    let (status, body) = api.call("GET", "/api/v1/runs", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(&body), "unauthorized");
    let (status, _) = api
        .call("GET", "/api/v1/runs", Some("cairn_not-a-token"), None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let before = api.footprint().await;
    let (status, body) = api
        .post("/api/v1/runs", &api.viewer, Some(run_spec("a")))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _) = api
        .put_policy(&api.operator, json!({"enabled": true}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = api
        .post(
            "/api/v1/tokens",
            &api.operator,
            Some(json!({"name": "x", "role": "admin"})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        api.footprint().await,
        before,
        "a refused request writes nothing"
    );

    // An admin creates a token; it works; once revoked it does not.
    let (status, created) = api
        .post(
            "/api/v1/tokens",
            &api.admin,
            Some(json!({"name": "ci", "role": "viewer"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let token = created["token"].as_str().expect("token").to_string();
    assert_eq!(api.get("/api/v1/runs", &token).await.0, StatusCode::OK);
    let stored: Vec<u8> = sqlx::query_scalar("SELECT token_hash FROM api_tokens WHERE name = 'ci'")
        .fetch_one(api.pool())
        .await
        .expect("stored");
    assert_ne!(stored, token.as_bytes(), "only a hash is stored");
    let id = created["token_id"].as_str().expect("id");
    let (status, _) = api
        .post(&format!("/api/v1/tokens/{id}/revoke"), &api.admin, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        api.get("/api/v1/runs", &token).await.0,
        StatusCode::UNAUTHORIZED
    );
}
