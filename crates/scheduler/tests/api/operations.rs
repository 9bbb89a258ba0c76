//! What the console's Runs and Operations pages read: the caller's session, run counts
//! and the agent filter, workers with their leases, the reaper's sweeps, tokens, and a
//! run's verification adoptions.

use axum::http::StatusCode;
use serde_json::json;

use super::harness::*;

#[tokio::test]
async fn the_session_names_the_token_and_its_role() {
    let api = Api::new().await;
    let (status, me) = api.get("/api/v1/session", &api.viewer).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(
        (me["name"].as_str(), me["role"].as_str()),
        (Some("viewer"), Some("viewer"))
    );
    assert_eq!(me["token_id"].as_str().map(str::len), Some(32));
    let (status, _) = api.call("GET", "/api/v1/session", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn runs_are_counted_per_state_and_filtered_by_agent() {
    let api = Api::new().await;
    api.submit(&api.operator).await;
    let (status, other) = api
        .post("/api/v1/runs", &api.operator, Some(run_spec("reviewer")))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{other}");

    let (status, all) = api.get("/api/v1/runs/counts", &api.viewer).await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(all["counts"]["queued"], 2, "{all}");
    assert_eq!(
        all["counts"]["completed"], 0,
        "every state is listed: {all}"
    );
    // Every state, `paused` included.
    assert_eq!(all["counts"].as_object().map(|m| m.len()), Some(9), "{all}");
    assert_eq!(all["counts"]["paused"], 0, "{all}");
    let (_, one) = api
        .get("/api/v1/runs/counts?agent=reviewer", &api.viewer)
        .await;
    assert_eq!(one["counts"]["queued"], 1, "{one}");

    let (_, page) = api.get("/api/v1/runs?agent=reviewer", &api.viewer).await;
    let runs = page["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1, "{page}");
    assert_eq!(runs[0]["run_id"], other["run_id"]);
    for path in [
        "/api/v1/runs?agent=no%20spaces",
        "/api/v1/runs/counts?agent=",
    ] {
        let (status, body) = api.get(path, &api.viewer).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(error_field(&body), "agent", "{body}");
    }
}

#[tokio::test]
async fn workers_show_the_leases_they_hold() {
    let api = Api::new().await;
    let run_id = api.submit(&api.operator).await;
    let (_, request_id) = api.request_of(&run_id).await;
    sqlx::query(
        "INSERT INTO worker_heartbeats (worker_id, beat_at, beating_since) VALUES ('w7', now(), now())",
    )
    .execute(api.pool())
    .await
    .expect("beat");
    sqlx::query(
        "UPDATE execution_requests SET state = 'executing', lease_owner = 'w7', lease_epoch = 3,
                lease_deadline = now() + interval '10 seconds' WHERE id = $1",
    )
    .bind(request_id)
    .execute(api.pool())
    .await
    .expect("lease");
    let (status, list) = api.get("/api/v1/workers", &api.viewer).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let worker = &list["workers"][0];
    assert_eq!(worker["worker_id"], "w7", "{list}");
    assert_eq!(
        worker["leases"][0]["run_id"].as_str(),
        Some(run_id.as_str()),
        "{list}"
    );
    assert_eq!(worker["leases"][0]["lease_epoch"], 3, "{list}");
}

#[tokio::test]
async fn the_reaper_view_lists_its_sweeps_to_platform_tokens() {
    let api = Api::new().await;
    // Its sweeps and repairs span every tenant's snapshots.
    let (status, refused) = api.get("/api/v1/reaper", &api.viewer).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    let (_, empty) = api.get("/api/v1/reaper", &api.admin).await;
    assert_eq!(empty, json!({"sweeps": [], "pending_repairs": []}));
    sqlx::query(
        "INSERT INTO sweeps (component, started_at, finished_at, dry_run, summary)
         VALUES ('reaper', now(), now(), false, '{\"retired\": 2}')",
    )
    .execute(api.pool())
    .await
    .expect("sweep");
    let (status, view) = api.get("/api/v1/reaper", &api.admin).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["sweeps"][0]["summary"]["retired"], 2, "{view}");
}

#[tokio::test]
async fn admins_list_tokens_without_their_secrets() {
    let api = Api::new().await;
    let (status, _) = api.get("/api/v1/tokens", &api.operator).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, list) = api.get("/api/v1/tokens", &api.admin).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let names: Vec<&str> = list["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names.len(), 3, "{list}");
    for secret in [&api.admin, &api.operator, &api.viewer] {
        assert!(
            !list.to_string().contains(secret.as_str()),
            "a secret is listed"
        );
    }
}

#[tokio::test]
async fn a_runs_adoptions_are_listed() {
    let api = Api::new().await;
    let run_id = api.submit(&api.operator).await;
    let (status, list) = api
        .get(
            &format!("/api/v1/runs/{run_id}/verification-handoffs/adoptions"),
            &api.viewer,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list, json!({"adoptions": []}));
    let missing = uuid::Uuid::new_v4().simple().to_string();
    let (status, _) = api
        .get(
            &format!("/api/v1/runs/{missing}/verification-handoffs/adoptions"),
            &api.viewer,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
