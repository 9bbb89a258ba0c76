//! Admission (single, batch, idempotent), bad bodies, and listing runs.

use axum::http::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use super::harness::*;

/// (runs, execution requests, outbox messages): what admission writes together.
async fn admitted(api: &Api) -> (i64, i64, i64) {
    (
        api.count("runs").await,
        api.count("execution_requests").await,
        api.count("outbox").await,
    )
}

/// Submits one run spec per agent `{prefix}-{i}` for `i` in `0..count` as one batch.
async fn submit_batch(api: &Api, prefix: &str, count: usize) -> (StatusCode, Value) {
    let runs: Vec<Value> = (0..count)
        .map(|i| run_spec(&format!("{prefix}-{i}")))
        .collect();
    api.post(
        "/api/v1/runs/batch",
        &api.operator,
        Some(json!({"runs": runs})),
    )
    .await
}

/// The ids of the runs a listing shows.
fn run_ids(page: &Value) -> Vec<String> {
    page["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["run_id"].to_string())
        .collect()
}

async fn cancel(api: &Api, run_id: &str) -> (StatusCode, Value) {
    api.post(
        &format!("/api/v1/runs/{run_id}/cancel"),
        &api.operator,
        None,
    )
    .await
}

#[tokio::test]
async fn admission_writes_run_request_and_outbox_together() {
    let api = Api::new().await;
    let (status, run) = api
        .post("/api/v1/runs", &api.operator, Some(run_spec("coder")))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    assert_eq!(run["state"], "queued");
    assert_eq!(run["attempt"], 1);
    assert_eq!(run["max_attempts"], 3);
    let run_id = run["run_id"].as_str().expect("run id");
    assert_eq!(run_id.len(), 32);
    assert_eq!(admitted(&api).await, (1, 1, 1));
    let payload: Value = sqlx::query_scalar("SELECT payload FROM outbox")
        .fetch_one(api.pool())
        .await
        .expect("outbox");
    assert_eq!(payload["kind"], "run");
    assert_eq!(
        payload["request_id"].as_str().map(|s| s.replace('-', "")),
        run["request_id"].as_str().map(String::from)
    );

    let run_path = format!("/api/v1/runs/{run_id}");
    for (path, field, expected) in [
        (run_path.clone(), "/steps/1/idempotent", json!(true)),
        (
            format!("{run_path}/execution-requests"),
            "/execution_requests/0/lease_epoch",
            json!(0),
        ),
        (format!("{run_path}/journal"), "/steps", json!([])),
    ] {
        let (status, shown) = api.get(&path, &api.viewer).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(shown.pointer(field), Some(&expected), "{path}: {shown}");
    }
}

#[tokio::test]
async fn an_idempotency_key_replays_the_same_run_or_conflicts() {
    let api = Api::new().await;
    let key = [("idempotency-key", "submit-42")];
    let submit = |agent: &str| {
        let body = run_spec(agent).to_string();
        let api = &api;
        async move {
            api.call_with(
                "POST",
                "/api/v1/runs",
                Some(&api.operator),
                Some(body),
                &key,
            )
            .await
        }
    };
    let (first, a) = submit("coder").await;
    let (second, b) = submit("coder").await;
    assert_eq!((first, second), (StatusCode::CREATED, StatusCode::OK));
    assert_eq!(a["run_id"], b["run_id"]);
    assert_eq!(api.count("runs").await, 1);

    let (status, error) = submit("someone-else").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(error_code(&error), "idempotency_key_conflict");
    assert_eq!((api.count("runs").await, api.count("outbox").await), (1, 1));
}

#[tokio::test]
async fn malformed_bodies_are_rejected_and_change_nothing() {
    let api = Api::new().await;
    let before = api.footprint().await;
    let cases = [
        (
            json!({"agent": "a", "steps": [], "budgets": {"max_commands": 1, "max_wall_seconds": 1}, "extra": true}),
            StatusCode::BAD_REQUEST,
            "extra",
        ),
        (
            json!({"agent": "a", "steps": [], "budgets": {"max_commands": "1", "max_wall_seconds": 1}}),
            StatusCode::BAD_REQUEST,
            "budgets.max_commands",
        ),
        (
            json!({"agent": "a", "steps": [{"key": "k", "argv": ["x"], "idempotent": "true"}], "budgets": {"max_commands": 1, "max_wall_seconds": 1}}),
            StatusCode::BAD_REQUEST,
            "steps[0].idempotent",
        ),
        (
            json!({"agent": "a", "steps": [{"key": "k", "argv": []}], "budgets": {"max_commands": 1, "max_wall_seconds": 1}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "steps[0].argv",
        ),
        (
            json!({"agent": "", "steps": [], "budgets": {"max_commands": 1, "max_wall_seconds": 1}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "agent",
        ),
        (
            json!({"agent": "a", "steps": [{"key": "k", "argv": ["x"], "cwd": "../../etc"}], "budgets": {"max_commands": 1, "max_wall_seconds": 1}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "steps[0].cwd",
        ),
        (
            json!({"agent": "a", "steps": [{"key": "k", "argv": ["x"]}], "budgets": {"max_commands": 1, "max_wall_seconds": 1}, "max_attempts": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "max_attempts",
        ),
        (
            json!({"agent": "a", "steps": []}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "steps",
        ),
    ];
    for (body, status, field) in cases {
        let (got, error) = api
            .post("/api/v1/runs", &api.operator, Some(body.clone()))
            .await;
        assert_eq!(got, status, "{body} -> {error}");
        assert_eq!(error_field(&error), field, "{body} -> {error}");
        assert!(error["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    let (status, error) = api
        .call_with(
            "POST",
            "/api/v1/runs",
            Some(&api.operator),
            Some("{\"agent\": ".into()),
            &[],
        )
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::BAD_REQUEST, "malformed_json")
    );
    let (status, _) = api
        .call_with(
            "POST",
            "/api/v1/runs",
            Some(&api.operator),
            None,
            &[("content-type", "text/plain")],
        )
        .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(api.footprint().await, before);
}

/// Client input the database cannot hold is a 4xx naming the field, never a 503: a NUL
/// in any string, a cursor out of PostgreSQL's range. A body is exactly one JSON value,
/// and a route's wrong method answers the documented error body.
#[tokio::test]
async fn input_the_database_cannot_hold_is_refused_by_field() {
    let api = Api::new().await;
    let before = api.footprint().await;
    let mut nul_repository = run_spec("a");
    nul_repository["repository"] = json!("r\u{0}");
    let mut nul_argv = run_spec("a");
    nul_argv["steps"] = json!([{"key": "k", "argv": ["echo", "a\u{0}b"]}]);
    for (path, body, field) in [
        ("/api/v1/runs", nul_repository, "repository"),
        ("/api/v1/runs", nul_argv, "steps[0].argv[1]"),
        (
            "/api/v1/tokens",
            json!({"name": "a\u{0}b", "role": "viewer"}),
            "name",
        ),
    ] {
        let token = if path == "/api/v1/tokens" {
            &api.admin
        } else {
            &api.operator
        };
        let (status, error) = api.post(path, token, Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {error}");
        assert_eq!(error_field(&error), field, "{body} -> {error}");
    }
    let body = run_spec("a").to_string();
    for trailing in [" this is not json", "{}"] {
        let (status, error) = api
            .call_with(
                "POST",
                "/api/v1/runs",
                Some(&api.operator),
                Some(format!("{body}{trailing}")),
                &[],
            )
            .await;
        assert_eq!(
            (status, error_code(&error)),
            (StatusCode::BAD_REQUEST, "malformed_json")
        );
    }
    let far = format!("-8000000000000000000_{}", "0".repeat(32));
    let (status, error) = api
        .get(&format!("/api/v1/runs?cursor={far}"), &api.viewer)
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::BAD_REQUEST, "cursor")
    );
    let (status, error) = api
        .call("DELETE", "/api/v1/runs", Some(&api.admin), None)
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
    );
    assert_eq!(api.footprint().await, before);
}

#[tokio::test]
async fn malformed_run_ids_are_bad_requests_and_unknown_ones_not_found() {
    let api = Api::new().await;
    let before = api.footprint().await;
    for path in [
        "/api/v1/runs/XYZ",
        "/api/v1/runs/0123456789ABCDEF0123456789abcdef",
        "/api/v1/runs/0123456789abcdef0123456789abcde",
    ] {
        let (status, error) = api.get(path, &api.viewer).await;
        assert_eq!(
            (status, error_code(&error), error_field(&error)),
            (StatusCode::BAD_REQUEST, "invalid_id", "run_id"),
            "{path}"
        );
    }
    let unknown = format!("/api/v1/runs/{}", Uuid::new_v4().simple());
    let (status, error) = api.get(&unknown, &api.viewer).await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::NOT_FOUND, "not_found")
    );
    assert_eq!(api.footprint().await, before);
}

#[tokio::test]
async fn a_batch_is_admitted_whole_or_not_at_all() {
    let api = Api::new().await;
    let (status, body) = submit_batch(&api, "agent", 1000).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body["run_ids"].as_array().map(Vec::len), Some(1000));
    assert_eq!(admitted(&api).await, (1000, 1000, 1000));

    let (status, error) = submit_batch(&api, "b", 1001).await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::UNPROCESSABLE_ENTITY, "runs")
    );
    let mut one_bad: Vec<Value> = (0..5).map(|i| run_spec(&format!("c-{i}"))).collect();
    one_bad[3]["steps"][0]["timeout_seconds"] = json!(0);
    let (status, error) = api
        .post(
            "/api/v1/runs/batch",
            &api.operator,
            Some(json!({"runs": one_bad})),
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            "runs[3].steps[0].timeout_seconds"
        )
    );
    assert_eq!(
        api.count("runs").await,
        1000,
        "a rejected batch admits nothing"
    );
}

#[tokio::test]
async fn runs_list_by_state_with_cursor_pagination() {
    let api = Api::new().await;
    submit_batch(&api, "agent", 7).await;
    let (_, first) = api.get("/api/v1/runs?limit=3", &api.viewer).await;
    let mut seen = run_ids(&first);
    let mut cursor = first["next_cursor"].as_str().map(String::from);
    while let Some(c) = cursor {
        let (status, page) = api
            .get(&format!("/api/v1/runs?limit=3&cursor={c}"), &api.viewer)
            .await;
        assert_eq!(status, StatusCode::OK);
        seen.extend(run_ids(&page));
        cursor = page["next_cursor"].as_str().map(String::from);
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 7, "every run once across pages");

    let (_, one) = api.get("/api/v1/runs?limit=1", &api.viewer).await;
    let id = one["runs"][0]["run_id"].as_str().expect("id").to_string();
    let (status, cancelled) = cancel(&api, &id).await;
    assert_eq!(
        (status, cancelled["state"].as_str()),
        (StatusCode::OK, Some("cancelled"))
    );
    let (status, _) = cancel(&api, &id).await;
    assert_eq!(status, StatusCode::OK, "cancelling twice is harmless");
    for (state, count) in [("cancelled", 1), ("queued", 6)] {
        let (_, page) = api
            .get(&format!("/api/v1/runs?state={state}"), &api.viewer)
            .await;
        assert_eq!(
            page["runs"].as_array().map(Vec::len),
            Some(count),
            "{state}"
        );
    }
    let (status, error) = api.get("/api/v1/runs?state=sleeping", &api.viewer).await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::BAD_REQUEST, "state")
    );
    let (status, _) = api.get("/api/v1/runs?cursor=garbage", &api.viewer).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    sqlx::query("UPDATE execution_requests SET state = 'completed'")
        .execute(api.pool())
        .await
        .expect("complete");
    let (_, other) = api
        .get("/api/v1/runs?state=queued&limit=1", &api.viewer)
        .await;
    let other = other["runs"][0]["run_id"].as_str().expect("id").to_string();
    let (status, error) = cancel(&api, &other).await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "run_finished")
    );
}

/// A step's network is `false`, `true` or `{"allow": [...]}`: a list a worker cannot
/// apply is a 422 naming it, and the accepted form is stored as sent.
#[tokio::test]
async fn a_steps_network_allow_list_is_checked_at_admission() {
    let api = Api::new().await;
    let with = |network: Value| {
        let mut spec = run_spec("coder");
        spec["steps"][0]["network"] = network;
        spec
    };
    let before = api.footprint().await;
    for bad in [
        json!({"allow": []}),
        json!({"allow": ["pypi.org:70000"]}),
        json!({"allow": ["two words:80"]}),
        json!({"allow": (0..65).map(|i| format!("10.0.0.{i}:80")).collect::<Vec<_>>()}),
    ] {
        let (status, body) = api
            .post("/api/v1/runs", &api.operator, Some(with(bad.clone())))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
        assert_eq!(error_field(&body), "steps[0].network.allow", "{body}");
    }
    for bad in [json!({"allow": ["a:1"], "deny": []}), json!("yes")] {
        let (status, body) = api
            .post("/api/v1/runs", &api.operator, Some(with(bad.clone())))
            .await;
        assert!(status.is_client_error(), "{bad}: {body}");
    }
    assert_eq!(api.footprint().await, before);
    let allow = json!({"allow": ["pypi.org:443", "10.2.0.0/16:5432", "[2001:db8::/32]:443"]});
    let (status, run) = api
        .post("/api/v1/runs", &api.operator, Some(with(allow.clone())))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    assert_eq!(run["steps"][0]["network"], allow, "{run}");
}
