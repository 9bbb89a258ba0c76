//! The recovery policy.

use axum::http::StatusCode;
use serde_json::json;

use super::harness::*;

#[tokio::test]
async fn the_policy_preserves_what_a_put_does_not_name() {
    let api = Api::new().await;
    let (status, policy) = api.get(POLICY, &api.viewer).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(policy["allow_checkpoint_continuation"], false);
    assert_eq!(policy["allow_final_outcome_continuation"], false);
    let (_, saved) = api
        .put_policy(&api.admin, json!({"maximum_window_seconds": 900}))
        .await;
    let (status, saved2) = api
        .put_policy(
            &api.admin,
            json!({"enabled": true, "allow_checkpoint_continuation": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        saved2["maximum_window_seconds"], 900,
        "unnamed settings are preserved"
    );
    assert_eq!(saved2["allow_final_outcome_continuation"], false);
    assert!(saved2["revision"].as_i64() > saved["revision"].as_i64());

    let before = api.footprint().await;
    for (body, status, field) in [
        (
            json!({"enabled": true, "surprise": 1}),
            StatusCode::BAD_REQUEST,
            "surprise",
        ),
        (json!({"enabled": 1}), StatusCode::BAD_REQUEST, "enabled"),
        (json!({"enabled": null}), StatusCode::BAD_REQUEST, "enabled"),
        (
            json!({"maximum_window_seconds": "60"}),
            StatusCode::BAD_REQUEST,
            "maximum_window_seconds",
        ),
        (
            json!({"maximum_window_seconds": 7201}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "maximum_window_seconds",
        ),
        (
            json!({"maximum_window_seconds": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "maximum_window_seconds",
        ),
    ] {
        let (got, error) = api.put_policy(&api.admin, body.clone()).await;
        assert_eq!(
            (got, error_field(&error)),
            (status, field),
            "{body}: {error}"
        );
    }
    assert_eq!(api.footprint().await, before);
}
