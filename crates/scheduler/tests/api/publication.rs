//! Publication requests and delivery holds through the API: who may, what is refused,
//! and that a refusal changes nothing.

use axum::http::StatusCode;
use serde_json::json;

use super::harness::*;

fn publish(id: &str) -> serde_json::Value {
    json!({"version": 1, "request_id": id, "acknowledge_command_receipts_read": true})
}

const ID: &str = "0123456789abcdef0123456789abcdef";

#[tokio::test]
async fn a_publication_of_a_run_that_has_not_completed_is_held_and_bad_input_is_refused() {
    let api = Api::new().await;
    let run_id = api.submit(&api.operator).await;
    let path = format!("/api/v1/runs/{run_id}/publications");
    let before = api.footprint().await;

    // Release access is an admin's.
    let (status, _) = api.post(&path, &api.operator, Some(publish(ID))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The strict body: every malformed one is refused by field, before anything else.
    let bad = [
        (
            json!({"version": 1, "request_id": ID}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"version": 1, "request_id": "ABC", "acknowledge_command_receipts_read": true}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"version": 1, "request_id": ID, "acknowledge_command_receipts_read": "true"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"version": 1, "request_id": ID, "acknowledge_command_receipts_read": true, "branch": "x"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"version": 2, "request_id": ID, "acknowledge_command_receipts_read": true}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"version": 1, "request_id": ID, "acknowledge_command_receipts_read": false}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (body, expected) in bad {
        let (status, error) = api.post(&path, &api.admin, Some(body.clone())).await;
        assert_eq!(status, expected, "{body}: {error}");
    }
    // A queued run is not completed: held, saying why.
    let (status, held) = api.post(&path, &api.admin, Some(publish(ID))).await;
    assert_eq!(
        (status, error_code(&held)),
        (StatusCode::CONFLICT, "delivery_held"),
        "{held}"
    );
    assert!(error_message(&held).contains("not completed"), "{held}");
    let unknown = "/api/v1/runs/ffffffffffffffffffffffffffffffff/publications";
    let (status, _) = api.post(unknown, &api.admin, Some(publish(ID))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = api.get(&format!("{path}/{ID}"), &api.viewer).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was saved");
    assert_eq!(api.footprint().await, before, "a refusal changes nothing");
}

#[tokio::test]
async fn a_delivery_hold_is_set_and_cleared_by_an_admin_and_says_why() {
    let api = Api::new().await;
    let run_id = api.submit(&api.operator).await;
    let path = format!("/api/v1/runs/{run_id}/delivery-hold");
    let (status, none) = api.get(&path, &api.viewer).await;
    assert_eq!(
        (status, &none["held"]),
        (StatusCode::OK, &json!(false)),
        "{none}"
    );

    let hold = json!({"reason": "legal review"});
    let before = api.footprint().await;
    let (status, _) = api
        .call("PUT", &path, Some(&api.operator), Some(hold.clone()))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for (body, expected) in [
        (json!({"reason": ""}), StatusCode::UNPROCESSABLE_ENTITY),
        (
            json!({"reason": "x".repeat(501)}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (json!({"reason": 1}), StatusCode::BAD_REQUEST),
        (json!({"reason": "r", "until": 1}), StatusCode::BAD_REQUEST),
    ] {
        let (status, error) = api
            .call("PUT", &path, Some(&api.admin), Some(body.clone()))
            .await;
        assert_eq!(status, expected, "{body}: {error}");
    }
    assert_eq!(
        api.footprint().await,
        before,
        "a refused hold changes nothing"
    );
    let (status, held) = api.call("PUT", &path, Some(&api.admin), Some(hold)).await;
    assert_eq!(status, StatusCode::OK, "{held}");
    assert_eq!(
        (&held["held"], &held["reason"]),
        (&json!(true), &json!("legal review"))
    );
    // The hold is one of the reasons a publication is held.
    let publications = format!("/api/v1/runs/{run_id}/publications");
    let (_, refused) = api.post(&publications, &api.admin, Some(publish(ID))).await;
    assert!(
        error_message(&refused).contains("legal review"),
        "{refused}"
    );

    let (status, _) = api.call("DELETE", &path, Some(&api.operator), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, cleared) = api.call("DELETE", &path, Some(&api.admin), None).await;
    assert_eq!(
        (status, &cleared["held"]),
        (StatusCode::OK, &json!(false)),
        "{cleared}"
    );
    let unknown = "/api/v1/runs/ffffffffffffffffffffffffffffffff/delivery-hold";
    let (status, _) = api.get(unknown, &api.viewer).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
