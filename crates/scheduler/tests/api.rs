//! The admission API against a real PostgreSQL, through the real router.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use cairn_common::journal;
use cairn_common::testing::TestDb;
use cairn_scheduler::api::{self, auth, auth::Role, AppState};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sqlx::PgPool;
use tower::ServiceExt;
use uuid::Uuid;

struct Api {
    db: TestDb,
    app: Router,
    admin: String,
    operator: String,
    viewer: String,
}

impl Api {
    async fn new() -> Api {
        let db = TestDb::new().await;
        let app = api::router(AppState {
            pool: db.pool.clone(),
            metrics: Default::default(),
        });
        let admin = auth::generate();
        auth::insert(&db.pool, "admin", Role::Admin, &admin)
            .await
            .expect("admin");
        let operator = auth::generate();
        auth::insert(&db.pool, "operator", Role::Operator, &operator)
            .await
            .expect("operator");
        let viewer = auth::generate();
        auth::insert(&db.pool, "viewer", Role::Viewer, &viewer)
            .await
            .expect("viewer");
        Api {
            db,
            app,
            admin,
            operator,
            viewer,
        }
    }

    fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.call_with(method, path, token, body.map(|b| b.to_string()), &[])
            .await
    }

    async fn call_with(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<String>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(body.map(Body::from).unwrap_or_else(Body::empty))
            .expect("request");
        let response = self.app.clone().oneshot(request).await.expect("response");
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, value)
    }

    async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(self.pool())
            .await
            .expect("count")
    }

    /// A snapshot of every table admission writes, to prove a rejection changed nothing.
    async fn footprint(&self) -> Vec<i64> {
        let mut counts = Vec::new();
        for table in [
            "runs",
            "execution_requests",
            "outbox",
            "continuation_actions",
            "api_tokens",
            "verification_adoptions",
        ] {
            counts.push(self.count(table).await);
        }
        let revision: i64 = sqlx::query_scalar("SELECT revision FROM recovery_policy")
            .fetch_one(self.pool())
            .await
            .expect("policy");
        counts.push(revision);
        counts
    }
}

fn run_spec(agent: &str) -> Value {
    json!({
        "agent": agent,
        "steps": [
            {"key": "build", "argv": ["make"], "timeout_seconds": 60},
            {"key": "test", "argv": ["make", "test"], "idempotent": true}
        ],
        "budgets": {"max_commands": 10, "max_wall_seconds": 600}
    })
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

fn error_field(body: &Value) -> &str {
    body["error"]["field"].as_str().unwrap_or("")
}

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
        .call(
            "POST",
            "/api/v1/runs",
            Some(&api.viewer),
            Some(run_spec("a")),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _) = api
        .call(
            "PUT",
            "/api/v1/invalid-read-continuity/policy",
            Some(&api.operator),
            Some(json!({"enabled": true})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = api
        .call(
            "POST",
            "/api/v1/tokens",
            Some(&api.operator),
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
        .call(
            "POST",
            "/api/v1/tokens",
            Some(&api.admin),
            Some(json!({"name": "ci", "role": "viewer"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let token = created["token"].as_str().expect("token").to_string();
    assert_eq!(
        api.call("GET", "/api/v1/runs", Some(&token), None).await.0,
        StatusCode::OK
    );
    let stored: Vec<u8> = sqlx::query_scalar("SELECT token_hash FROM api_tokens WHERE name = 'ci'")
        .fetch_one(api.pool())
        .await
        .expect("stored");
    assert_ne!(stored, token.as_bytes(), "only a hash is stored");
    let id = created["token_id"].as_str().expect("id");
    let (status, _) = api
        .call(
            "POST",
            &format!("/api/v1/tokens/{id}/revoke"),
            Some(&api.admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        api.call("GET", "/api/v1/runs", Some(&token), None).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn admission_writes_run_request_and_outbox_together() {
    let api = Api::new().await;
    let (status, run) = api
        .call(
            "POST",
            "/api/v1/runs",
            Some(&api.operator),
            Some(run_spec("coder")),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    assert_eq!(run["state"], "queued");
    assert_eq!(run["attempt"], 1);
    assert_eq!(run["max_attempts"], 3);
    let run_id = run["run_id"].as_str().expect("run id");
    assert_eq!(run_id.len(), 32);
    assert_eq!(
        (
            api.count("runs").await,
            api.count("execution_requests").await,
            api.count("outbox").await
        ),
        (1, 1, 1)
    );
    let payload: Value = sqlx::query_scalar("SELECT payload FROM outbox")
        .fetch_one(api.pool())
        .await
        .expect("outbox");
    assert_eq!(payload["kind"], "run");
    assert_eq!(
        payload["request_id"].as_str().map(|s| s.replace('-', "")),
        run["request_id"].as_str().map(String::from)
    );

    let (status, shown) = api
        .call(
            "GET",
            &format!("/api/v1/runs/{run_id}"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(shown["steps"][1]["idempotent"], true);
    let (status, requests) = api
        .call(
            "GET",
            &format!("/api/v1/runs/{run_id}/execution-requests"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(requests["execution_requests"][0]["lease_epoch"], 0);
    let (status, journal) = api
        .call(
            "GET",
            &format!("/api/v1/runs/{run_id}/journal"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(journal["steps"], json!([]));
}

#[tokio::test]
async fn an_idempotency_key_replays_the_same_run_or_conflicts() {
    let api = Api::new().await;
    let body = run_spec("coder").to_string();
    let key = [("idempotency-key", "submit-42")];
    let (first, a) = api
        .call_with(
            "POST",
            "/api/v1/runs",
            Some(&api.operator),
            Some(body.clone()),
            &key,
        )
        .await;
    let (second, b) = api
        .call_with(
            "POST",
            "/api/v1/runs",
            Some(&api.operator),
            Some(body),
            &key,
        )
        .await;
    assert_eq!((first, second), (StatusCode::CREATED, StatusCode::OK));
    assert_eq!(a["run_id"], b["run_id"]);
    assert_eq!(api.count("runs").await, 1);

    let other = run_spec("someone-else").to_string();
    let (status, error) = api
        .call_with(
            "POST",
            "/api/v1/runs",
            Some(&api.operator),
            Some(other),
            &key,
        )
        .await;
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
            json!({"agent": "a", "steps": [], "budgets": {"max_commands": 1, "max_wall_seconds": 1}, "max_attempts": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "max_attempts",
        ),
    ];
    for (body, status, field) in cases {
        let (got, error) = api
            .call(
                "POST",
                "/api/v1/runs",
                Some(&api.operator),
                Some(body.clone()),
            )
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
    for path in [
        "/api/v1/runs/XYZ",
        "/api/v1/runs/0123456789ABCDEF0123456789abcdef",
        "/api/v1/runs/0123456789abcdef0123456789abcde",
    ] {
        let (status, error) = api.call("GET", path, Some(&api.viewer), None).await;
        assert_eq!(
            (status, error_code(&error), error_field(&error)),
            (StatusCode::BAD_REQUEST, "invalid_id", "run_id"),
            "{path}"
        );
    }
    let (status, error) = api
        .call(
            "GET",
            &format!("/api/v1/runs/{}", Uuid::new_v4().simple()),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::NOT_FOUND, "not_found")
    );
    assert_eq!(api.footprint().await, before);
}

#[tokio::test]
async fn a_batch_is_admitted_whole_or_not_at_all() {
    let api = Api::new().await;
    let runs: Vec<Value> = (0..1000).map(|i| run_spec(&format!("agent-{i}"))).collect();
    let (status, body) = api
        .call(
            "POST",
            "/api/v1/runs/batch",
            Some(&api.operator),
            Some(json!({"runs": runs})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body["run_ids"].as_array().map(Vec::len), Some(1000));
    assert_eq!(
        (
            api.count("runs").await,
            api.count("execution_requests").await,
            api.count("outbox").await
        ),
        (1000, 1000, 1000)
    );

    let too_many: Vec<Value> = (0..1001).map(|i| run_spec(&format!("b-{i}"))).collect();
    let (status, error) = api
        .call(
            "POST",
            "/api/v1/runs/batch",
            Some(&api.operator),
            Some(json!({"runs": too_many})),
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::UNPROCESSABLE_ENTITY, "runs")
    );
    let mut one_bad: Vec<Value> = (0..5).map(|i| run_spec(&format!("c-{i}"))).collect();
    one_bad[3]["steps"][0]["timeout_seconds"] = json!(0);
    let (status, error) = api
        .call(
            "POST",
            "/api/v1/runs/batch",
            Some(&api.operator),
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
    let runs: Vec<Value> = (0..7).map(|i| run_spec(&format!("agent-{i}"))).collect();
    api.call(
        "POST",
        "/api/v1/runs/batch",
        Some(&api.operator),
        Some(json!({"runs": runs})),
    )
    .await;
    let (_, first) = api
        .call("GET", "/api/v1/runs?limit=3", Some(&api.viewer), None)
        .await;
    let mut seen: Vec<String> = first["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["run_id"].to_string())
        .collect();
    let mut cursor = first["next_cursor"].as_str().map(String::from);
    while let Some(c) = cursor {
        let (status, page) = api
            .call(
                "GET",
                &format!("/api/v1/runs?limit=3&cursor={c}"),
                Some(&api.viewer),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        seen.extend(
            page["runs"]
                .as_array()
                .expect("runs")
                .iter()
                .map(|r| r["run_id"].to_string()),
        );
        cursor = page["next_cursor"].as_str().map(String::from);
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 7, "every run once across pages");

    let (_, one) = api
        .call("GET", "/api/v1/runs?limit=1", Some(&api.viewer), None)
        .await;
    let id = one["runs"][0]["run_id"].as_str().expect("id").to_string();
    let (status, cancelled) = api
        .call(
            "POST",
            &format!("/api/v1/runs/{id}/cancel"),
            Some(&api.operator),
            None,
        )
        .await;
    assert_eq!(
        (status, cancelled["state"].as_str()),
        (StatusCode::OK, Some("cancelled"))
    );
    let (status, _) = api
        .call(
            "POST",
            &format!("/api/v1/runs/{id}/cancel"),
            Some(&api.operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "cancelling twice is harmless");
    let (_, page) = api
        .call(
            "GET",
            "/api/v1/runs?state=cancelled",
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(page["runs"].as_array().map(Vec::len), Some(1));
    let (_, page) = api
        .call("GET", "/api/v1/runs?state=queued", Some(&api.viewer), None)
        .await;
    assert_eq!(page["runs"].as_array().map(Vec::len), Some(6));
    let (status, error) = api
        .call(
            "GET",
            "/api/v1/runs?state=sleeping",
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::BAD_REQUEST, "state")
    );
    let (status, _) = api
        .call(
            "GET",
            "/api/v1/runs?cursor=garbage",
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    sqlx::query("UPDATE execution_requests SET state = 'completed'")
        .execute(api.pool())
        .await
        .expect("complete");
    let (_, other) = api
        .call(
            "GET",
            "/api/v1/runs?state=queued&limit=1",
            Some(&api.viewer),
            None,
        )
        .await;
    let other = other["runs"][0]["run_id"].as_str().expect("id").to_string();
    let (status, error) = api
        .call(
            "POST",
            &format!("/api/v1/runs/{other}/cancel"),
            Some(&api.operator),
            None,
        )
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "run_finished")
    );
}

#[tokio::test]
async fn the_policy_preserves_what_a_put_does_not_name() {
    let api = Api::new().await;
    let (status, policy) = api
        .call(
            "GET",
            "/api/v1/invalid-read-continuity/policy",
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(policy["allow_checkpoint_continuation"], false);
    assert_eq!(policy["allow_final_outcome_continuation"], false);
    let path = "/api/v1/invalid-read-continuity/policy";
    let (_, saved) = api
        .call(
            "PUT",
            path,
            Some(&api.admin),
            Some(json!({"maximum_window_seconds": 900})),
        )
        .await;
    let (status, saved2) = api
        .call(
            "PUT",
            path,
            Some(&api.admin),
            Some(json!({"enabled": true, "allow_checkpoint_continuation": true})),
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
        let (got, error) = api
            .call("PUT", path, Some(&api.admin), Some(body.clone()))
            .await;
        assert_eq!(
            (got, error_field(&error)),
            (status, field),
            "{body}: {error}"
        );
    }
    assert_eq!(api.footprint().await, before);
}

/// Puts a submitted run where a lapsed lease with spent attempts leaves it: stopped at
/// its retained checkpoint, with one completed step.
async fn stop_at_checkpoint(api: &Api, run_id: &str) -> (Uuid, Uuid) {
    let run_id = Uuid::parse_str(run_id).expect("uuid");
    let request_id: Uuid =
        sqlx::query_scalar("SELECT id FROM execution_requests WHERE run_id = $1")
            .bind(run_id)
            .fetch_one(api.pool())
            .await
            .expect("request");
    // One step ran and has its receipt, under epoch 1; then the lease lapsed with the
    // attempts spent and the sweeper stopped the request at its checkpoint.
    let lease = cairn_common::lease::Lease {
        request_id,
        owner: "w1".into(),
        epoch: 1,
        deadline: chrono::Utc::now(),
    };
    let mut conn = api.pool().acquire().await.expect("conn");
    journal::write_intent(&mut conn, &lease, 1, "build", 0, false)
        .await
        .expect("intent");
    let outcome = journal::Outcome {
        exit_code: Some(0),
        signal: None,
        timed_out: false,
        wall_ms: 1200,
        cpu_ms: 800,
        output_digest: "abc".into(),
        stdout_tail: String::new(),
        stderr_tail: String::new(),
        output_artifact: String::new(),
    };
    let receipt = journal::Receipt {
        step_key: "build",
        attempt: 1,
        outcome: &outcome,
        tier: None,
    };
    journal::record_receipt(&mut conn, &lease, &receipt, None)
        .await
        .expect("receipt");
    // The source a worker observed (what a changed source is compared with).
    sqlx::query(
        "UPDATE execution_requests SET lease_epoch = 1, source_digest = 'src-1' WHERE id = $1",
    )
    .bind(request_id)
    .execute(&mut *conn)
    .await
    .expect("observed source");
    cairn_common::request::stop_at_checkpoint(&mut conn, request_id, "attempts_exhausted")
        .await
        .expect("stop");
    (run_id, request_id)
}

fn action_body(digest: &str) -> Value {
    json!({
        "version": 1,
        "candidate_digest": digest,
        "valid_for_seconds": 60,
        "acknowledge_retained_response_consumed_once": true,
        "acknowledge_no_completed_effect_replay": true,
        "acknowledge_same_request_attempt_and_budgets": true,
        "acknowledge_finite_ownership_lease": true
    })
}

fn hold_reasons(candidate: &Value) -> Vec<String> {
    candidate["holds"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter_map(|h| h["reason"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_checkpoint_continuation_is_admitted_once_on_the_same_ticket() {
    let api = Api::new().await;
    let (_, run) = api
        .call(
            "POST",
            "/api/v1/runs",
            Some(&api.operator),
            Some(run_spec("coder")),
        )
        .await;
    let (run_id, request_id) = stop_at_checkpoint(&api, run["run_id"].as_str().expect("id")).await;
    let base = format!(
        "/api/v1/runs/{}/checkpoint-continuations/requests/{}",
        run_id.simple(),
        request_id.simple()
    );

    // Policy off: held, and nothing can be admitted.
    let (status, held) = api
        .call("GET", &format!("{base}/candidate"), Some(&api.viewer), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(held["kind"], "checkpoint_continuation_candidate");
    assert_eq!(held["admission"], "HELD");
    assert_eq!(hold_reasons(&held), ["policy_disabled"]);
    let action = Uuid::new_v4().simple().to_string();
    let before = api.footprint().await;
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.admin),
            Some(action_body(held["candidate_digest"].as_str().expect("d"))),
        )
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "candidate_held")
    );
    assert_eq!(
        api.footprint().await,
        before,
        "a held candidate admits nothing"
    );

    api.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&api.admin),
        Some(json!({"enabled": true, "allow_checkpoint_continuation": true, "maximum_window_seconds": 600})),
    )
    .await;
    let (_, ready) = api
        .call("GET", &format!("{base}/candidate"), Some(&api.viewer), None)
        .await;
    assert_eq!(ready["admission"], "READY", "{ready}");
    assert_eq!(ready["attempt"], 1);
    assert_eq!(ready["charged_usage"]["commands"], 1);
    assert_eq!(ready["limits"]["max_commands"], 10);
    assert_eq!(ready["maximum_window_seconds"], 600);
    let digest = ready["candidate_digest"]
        .as_str()
        .expect("digest")
        .to_string();
    assert_eq!(digest.len(), 64);
    assert_ne!(
        digest,
        held["candidate_digest"].as_str().unwrap_or_default(),
        "the digest binds the policy"
    );

    // Every rejection rule of the body, none of which writes anything.
    let before = api.footprint().await;
    let mut cases: Vec<(Value, StatusCode, &str)> = Vec::new();
    let mut extra = action_body(&digest);
    extra["note"] = json!("hi");
    cases.push((extra, StatusCode::BAD_REQUEST, "note"));
    for (field, bad) in [
        ("acknowledge_finite_ownership_lease", json!(1)),
        ("acknowledge_no_completed_effect_replay", json!("true")),
        ("valid_for_seconds", json!("60")),
        ("version", json!("1")),
    ] {
        let mut body = action_body(&digest);
        body[field] = bad;
        cases.push((body, StatusCode::BAD_REQUEST, field));
    }
    let mut missing = action_body(&digest);
    missing
        .as_object_mut()
        .expect("object")
        .remove("acknowledge_same_request_attempt_and_budgets");
    cases.push((missing, StatusCode::BAD_REQUEST, ""));
    for (field, bad) in [
        ("acknowledge_retained_response_consumed_once", json!(false)),
        ("version", json!(2)),
        ("valid_for_seconds", json!(0)),
        ("valid_for_seconds", json!(601)),
        ("valid_for_seconds", json!(7201)),
        ("candidate_digest", json!("abc")),
    ] {
        let mut body = action_body(&digest);
        body[field] = bad;
        cases.push((body, StatusCode::UNPROCESSABLE_ENTITY, field));
    }
    let stale = "0".repeat(64);
    cases.push((
        action_body(&stale),
        StatusCode::CONFLICT,
        "candidate_digest",
    ));
    for (body, status, field) in cases {
        let (got, error) = api
            .call(
                "POST",
                &format!("{base}/actions/{action}"),
                Some(&api.admin),
                Some(body.clone()),
            )
            .await;
        assert_eq!(got, status, "{body}: {error}");
        if !field.is_empty() {
            assert_eq!(error_field(&error), field, "{body}: {error}");
        }
    }
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/actions/NOT-AN-ID"),
            Some(&api.admin),
            Some(action_body(&digest)),
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::BAD_REQUEST, "action_id")
    );
    let (status, _) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.operator),
            Some(action_body(&digest)),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "admission is for admins");
    assert_eq!(api.footprint().await, before);

    let (_, status_before) = api
        .call("GET", &format!("{base}/status"), Some(&api.viewer), None)
        .await;
    assert_eq!(status_before["status"], "not_recovered");

    // Admit it.
    let (status, receipt) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.admin),
            Some(action_body(&digest)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{receipt}");
    assert_eq!(receipt["action_id"], action);
    assert_eq!(receipt["status"], "queued");
    assert_eq!(receipt["lease"]["valid_for_seconds"], 60);
    let outbox: Vec<(String, Value)> = sqlx::query_as(
        "SELECT routing_key, payload FROM outbox WHERE routing_key = 'continuations'",
    )
    .fetch_all(api.pool())
    .await
    .expect("outbox");
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].1["kind"], "checkpoint_continuation");
    let (state, attempt, used, epoch): (String, i32, i32, i64) = sqlx::query_as(
        "SELECT state, attempt, used_commands, lease_epoch FROM execution_requests WHERE id = $1",
    )
    .bind(request_id)
    .fetch_one(api.pool())
    .await
    .expect("request");
    assert_eq!(
        (state.as_str(), attempt, used, epoch),
        ("queued", 1, 1, 2),
        "same ticket, same attempt, usage kept"
    );

    // The same id and input: the same receipt, nothing more admitted.
    let (status, again) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.admin),
            Some(action_body(&digest)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(again, receipt);
    assert_eq!(
        (
            api.count("continuation_actions").await,
            api.count("outbox").await
        ),
        (1, 2)
    );
    // The same id with changed input: 409.
    let mut changed = action_body(&digest);
    changed["valid_for_seconds"] = json!(61);
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.admin),
            Some(changed),
        )
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "action_id_conflict")
    );
    // Another action for the same checkpoint: 409.
    let other = Uuid::new_v4().simple().to_string();
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/actions/{other}"),
            Some(&api.admin),
            Some(action_body(&digest)),
        )
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "checkpoint_already_admitted")
    );
    assert_eq!(
        (
            api.count("continuation_actions").await,
            api.count("outbox").await
        ),
        (1, 2)
    );

    let (_, read) = api
        .call("GET", &format!("{base}/status"), Some(&api.viewer), None)
        .await;
    assert_eq!(read["kind"], "checkpoint_continuation_status");
    assert_eq!(read["status"], "queued");
    assert_eq!(read["action_id"], action);
    assert_eq!(read["witness_digest"], receipt["witness_digest"]);
    assert_eq!(read["admission_seal"], receipt["admission_seal"]);
    assert!(read["lease"]["window_ends_at"].is_string());
}

#[tokio::test]
async fn each_hold_reason_keeps_a_checkpoint_candidate_held() {
    let api = Api::new().await;
    api.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&api.admin),
        Some(json!({"enabled": true, "allow_checkpoint_continuation": true})),
    )
    .await;
    let cases: [(&str, &str); 6] = [
        ("live_owner", "UPDATE execution_requests SET lease_owner = 'w', lease_deadline = now() + interval '1 minute' WHERE id = $1"),
        ("changed_source", "UPDATE execution_requests SET source_digest = 'src-2' WHERE id = $1"),
        ("missing_custody", "UPDATE execution_requests SET checkpoint = NULL WHERE id = $1"),
        ("unknown_effect", "INSERT INTO journal_intents (request_id, step_key, step_index, idempotent, lease_epoch, attempt) VALUES ($1, 'test', 1, false, 2, 1)"),
        ("exhausted_limits", "UPDATE execution_requests SET used_commands = max_commands WHERE id = $1"),
        ("revoked_access", "UPDATE api_tokens SET revoked_at = now() WHERE id = (SELECT operator_id FROM runs r JOIN execution_requests e ON e.run_id = r.id WHERE e.id = $1)"),
    ];
    for (reason, change) in cases {
        let submitter = auth::generate();
        auth::insert(api.pool(), reason, Role::Operator, &submitter)
            .await
            .expect("token");
        let (_, run) = api
            .call(
                "POST",
                "/api/v1/runs",
                Some(&submitter),
                Some(run_spec("coder")),
            )
            .await;
        let (run_id, request_id) =
            stop_at_checkpoint(&api, run["run_id"].as_str().expect("id")).await;
        let base = format!(
            "/api/v1/runs/{}/checkpoint-continuations/requests/{}",
            run_id.simple(),
            request_id.simple()
        );
        let (_, ready) = api
            .call("GET", &format!("{base}/candidate"), Some(&api.viewer), None)
            .await;
        assert_eq!(ready["admission"], "READY", "{reason}: {ready}");
        sqlx::query(change)
            .bind(request_id)
            .execute(api.pool())
            .await
            .expect("change");
        let (_, held) = api
            .call("GET", &format!("{base}/candidate"), Some(&api.viewer), None)
            .await;
        assert_eq!(held["admission"], "HELD", "{reason}");
        assert!(
            hold_reasons(&held).contains(&reason.to_string()),
            "{reason}: {held}"
        );
        let action = Uuid::new_v4().simple().to_string();
        let (status, error) = api
            .call(
                "POST",
                &format!("{base}/actions/{action}"),
                Some(&api.admin),
                Some(action_body(ready["candidate_digest"].as_str().expect("d"))),
            )
            .await;
        assert_eq!(
            (status, error_code(&error)),
            (StatusCode::CONFLICT, "candidate_held"),
            "{reason}"
        );
    }
    assert_eq!(api.count("continuation_actions").await, 0);
}

fn final_body(digest: &str) -> Value {
    json!({
        "version": 1,
        "candidate_digest": digest,
        "valid_for_seconds": 60,
        "acknowledge_already_consumed_final_output": true,
        "acknowledge_no_completed_effect_replay": true,
        "acknowledge_same_request_attempt_and_budgets": true,
        "acknowledge_finite_ownership_lease": true
    })
}

#[tokio::test]
async fn only_the_original_operator_as_admin_accepts_a_retained_report() {
    let api = Api::new().await;
    api.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&api.admin),
        Some(json!({"enabled": true, "allow_final_outcome_continuation": true})),
    )
    .await;
    // The admin submitted the run; its report was saved but never accepted.
    let (_, run) = api
        .call(
            "POST",
            "/api/v1/runs",
            Some(&api.admin),
            Some(run_spec("coder")),
        )
        .await;
    let run_id = Uuid::parse_str(run["run_id"].as_str().expect("id")).expect("uuid");
    let request_id: Uuid =
        sqlx::query_scalar("SELECT id FROM execution_requests WHERE run_id = $1")
            .bind(run_id)
            .fetch_one(api.pool())
            .await
            .expect("request");
    sqlx::query("UPDATE execution_requests SET state = 'needs_reconciliation', lease_epoch = 1 WHERE id = $1")
        .bind(request_id)
        .execute(api.pool())
        .await
        .expect("state");
    sqlx::query("INSERT INTO final_reports (request_id, outcome, followup_kind, body, lease_epoch) VALUES ($1, 'blocked', 'verification', '{\"question\": \"run the tests?\"}', 1)")
        .bind(request_id)
        .execute(api.pool())
        .await
        .expect("report");
    let base = format!(
        "/api/v1/runs/{}/final-outcome-continuations/requests/{}",
        run_id.simple(),
        request_id.simple()
    );

    let (_, candidate) = api
        .call("GET", &format!("{base}/candidate"), Some(&api.admin), None)
        .await;
    assert_eq!(candidate["kind"], "final_outcome_continuation_candidate");
    assert_eq!(candidate["admission"], "READY", "{candidate}");
    assert_eq!(candidate["admission_window_purpose"], "claim_only");
    assert_eq!(candidate["retained_outcome"]["outcome"], "blocked");
    assert_eq!(
        candidate["retained_outcome"]["followup_kind"],
        "verification"
    );
    let digest = candidate["candidate_digest"]
        .as_str()
        .expect("digest")
        .to_string();

    // Another admin: held for access, and a POST is refused.
    let other_admin = auth::generate();
    auth::insert(api.pool(), "other-admin", Role::Admin, &other_admin)
        .await
        .expect("token");
    let (_, theirs) = api
        .call(
            "GET",
            &format!("{base}/candidate"),
            Some(&other_admin),
            None,
        )
        .await;
    assert!(
        hold_reasons(&theirs).contains(&"revoked_access".to_string()),
        "{theirs}"
    );
    let action = Uuid::new_v4().simple().to_string();
    let (status, _) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&other_admin),
            Some(final_body(&digest)),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The checkpoint body is not this route's body.
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.admin),
            Some(action_body(&digest)),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    let (_, read) = api
        .call("GET", &format!("{base}/status"), Some(&api.viewer), None)
        .await;
    assert_eq!(read["status"], "not_recovered");
    assert_eq!(api.count("continuation_actions").await, 0);

    let (status, receipt) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.admin),
            Some(final_body(&digest)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{receipt}");
    assert_eq!(receipt["kind"], "final_outcome_continuation_status");
    assert_eq!(receipt["lease"]["admission_window_purpose"], "claim_only");
    let (_, read) = api
        .call("GET", &format!("{base}/status"), Some(&api.viewer), None)
        .await;
    assert_eq!(
        (read["status"].as_str(), read["action_id"].as_str()),
        (Some("queued"), Some(action.as_str()))
    );
    let consumed = api.count("report_consumptions").await;
    assert_eq!(
        consumed, 0,
        "admission does not accept the report; a worker does, once"
    );
}

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

#[tokio::test]
async fn rotating_an_agents_credentials_retires_its_snapshots() {
    let api = Api::new().await;
    for (agent, kind) in [
        ("coder", "checkpoint"),
        ("coder", "baseline"),
        ("other", "checkpoint"),
    ] {
        sqlx::query(
            "INSERT INTO project_snapshots (id, kind, status, agent, backend, store_url) VALUES ($1, $2, 'ready', $3, 'local', 'file:///x')",
        )
        .bind(Uuid::new_v4())
        .bind(kind)
        .bind(agent)
        .execute(api.pool())
        .await
        .expect("snapshot");
    }
    let (status, _) = api
        .call(
            "POST",
            "/api/v1/agents/coder/credentials/rotate",
            Some(&api.operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, rotation) = api
        .call(
            "POST",
            "/api/v1/agents/coder/credentials/rotate",
            Some(&api.admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{rotation}");
    assert_eq!(
        (
            rotation["generation"].as_i64(),
            rotation["snapshots_retired"].as_i64()
        ),
        (Some(1), Some(2))
    );
    let current: i64 =
        sqlx::query_scalar("SELECT count(*) FROM project_snapshots WHERE retention = 'current'")
            .fetch_one(api.pool())
            .await
            .expect("count");
    assert_eq!(current, 1, "another agent's snapshots are untouched");
    let (status, error) = api
        .call(
            "POST",
            "/api/v1/agents/bad%20name/credentials/rotate",
            Some(&api.admin),
            None,
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::UNPROCESSABLE_ENTITY, "agent")
    );
}

/// Puts a submitted run where an accepted report asking for verification leaves it:
/// awaiting verification with a pending handoff of three frozen checks.
async fn awaiting_verification(api: &Api) -> (String, Uuid) {
    let (status, run) = api
        .call(
            "POST",
            "/api/v1/runs",
            Some(&api.operator),
            Some(run_spec("coder")),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let run_id = run["run_id"].as_str().expect("run id").to_string();
    let run_uuid = Uuid::parse_str(&run_id).expect("uuid");
    let request_id: Uuid =
        sqlx::query_scalar("SELECT id FROM execution_requests WHERE run_id = $1")
            .bind(run_uuid)
            .fetch_one(api.pool())
            .await
            .expect("request");
    sqlx::query("UPDATE execution_requests SET state = 'awaiting_verification', used_commands = 2 WHERE id = $1")
        .bind(request_id)
        .execute(api.pool())
        .await
        .expect("awaiting");
    let commands = json!([
        {"argv": ["cargo", "build"], "purpose": "source_build"},
        {"argv": ["cargo", "test"], "purpose": "test", "env": {"RUST_LOG": "info"}},
        {"argv": ["./db-suite"], "purpose": "database_integration"}
    ]);
    let frozen: Vec<cairn_common::verification::CheckCommand> =
        serde_json::from_value(commands.clone()).expect("checks");
    sqlx::query(
        "INSERT INTO verification_handoffs (id, run_id, request_id, commands, commands_digest, state, agent, source_digest)
         VALUES ($1, $2, $3, $4, $5, 'pending', 'coder', $6)",
    )
    .bind(Uuid::new_v4())
    .bind(run_uuid)
    .bind(request_id)
    .bind(&commands)
    .bind(cairn_common::verification::commands_digest(&frozen))
    .bind("a".repeat(64))
    .execute(api.pool())
    .await
    .expect("handoff");
    (run_id, request_id)
}

fn adoption_body(candidate: &Value, request_id: &str, reusable: &[usize]) -> Value {
    let checks: Vec<Value> = reusable
        .iter()
        .map(|i| {
            json!({
                "command_digest": candidate["commands"][i - 1]["command_digest"],
                "purpose": "source_build",
                "independent_of_time_and_external_state": true
            })
        })
        .collect();
    json!({
        "request_id": request_id,
        "agent": candidate["agent"],
        "pending_request_digest": candidate["pending_request_digest"],
        "source_digest": candidate["source_digest"],
        "commands_digest": candidate["commands_digest"],
        "policy_digest": candidate["policy_digest"],
        "provider_digest": candidate["provider_digest"],
        "reusable_build_checks": checks
    })
}

#[tokio::test]
async fn a_verification_handoff_is_adopted_once_and_every_bad_adoption_changes_nothing() {
    let api = Api::new().await;
    let (run_id, request_id) = awaiting_verification(&api).await;
    let base = format!("/api/v1/runs/{run_id}/verification-handoffs");

    let (status, error) = api
        .call(
            "GET",
            &format!("{base}/candidates"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::BAD_REQUEST, "agent")
    );
    let (status, error) = api
        .call(
            "GET",
            &format!("{base}/candidates?agent=other"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::UNPROCESSABLE_ENTITY, "agent")
    );
    let (status, candidate) = api
        .call(
            "GET",
            &format!("{base}/candidates?agent=coder"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{candidate}");
    assert_eq!(candidate["admission"], "READY");
    for field in [
        "pending_request_digest",
        "source_digest",
        "commands_digest",
        "policy_digest",
        "provider_digest",
    ] {
        assert!(
            candidate[field]
                .as_str()
                .is_some_and(cairn_common::digest::is_digest),
            "{field}: {candidate}"
        );
    }
    let reusable = candidate["reusable_build_candidates"]
        .as_array()
        .expect("candidates");
    assert_eq!(
        reusable.len(),
        2,
        "the database check is never offered: {candidate}"
    );
    assert_eq!(reusable[0]["index"], 1);
    assert_eq!(reusable[0]["arguments"], json!(["cargo", "build"]));
    assert_eq!(reusable[1]["index"], 2);
    assert_eq!(candidate["budget"]["remaining_commands"], 8);

    let id = "0123456789abcdef0123456789abcdef";
    let good = adoption_body(&candidate, id, &[1]);
    let before = api.footprint().await;
    let mut rejections: Vec<(Value, StatusCode, &str, &str)> = Vec::new();
    // Shape: ids, digests, the acknowledgement, duplicates, unknown fields, coercion.
    let mut bad_id = good.clone();
    bad_id["request_id"] = json!("0123456789ABCDEF0123456789ABCDEF");
    rejections.push((bad_id, StatusCode::BAD_REQUEST, "invalid_id", "request_id"));
    let mut bad_digest = good.clone();
    bad_digest["policy_digest"] = json!("abc");
    rejections.push((
        bad_digest,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "policy_digest",
    ));
    let mut unacknowledged = good.clone();
    unacknowledged["reusable_build_checks"][0]["independent_of_time_and_external_state"] =
        json!(false);
    rejections.push((
        unacknowledged,
        StatusCode::UNPROCESSABLE_ENTITY,
        "acknowledgement_required",
        "reusable_build_checks[0].independent_of_time_and_external_state",
    ));
    let mut coerced = good.clone();
    coerced["reusable_build_checks"][0]["independent_of_time_and_external_state"] = json!("true");
    rejections.push((
        coerced,
        StatusCode::BAD_REQUEST,
        "invalid_body",
        "reusable_build_checks[0].independent_of_time_and_external_state",
    ));
    let mut wrong_purpose = good.clone();
    wrong_purpose["reusable_build_checks"][0]["purpose"] = json!("test");
    rejections.push((
        wrong_purpose,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "reusable_build_checks[0].purpose",
    ));
    let mut duplicate = adoption_body(&candidate, id, &[1, 1]);
    duplicate["request_id"] = json!(id);
    rejections.push((
        duplicate,
        StatusCode::UNPROCESSABLE_ENTITY,
        "duplicate_selection",
        "reusable_build_checks[1].command_digest",
    ));
    let mut unknown_field = good.clone();
    unknown_field["reuse_everything"] = json!(true);
    rejections.push((
        unknown_field,
        StatusCode::BAD_REQUEST,
        "invalid_body",
        "reuse_everything",
    ));
    // Against the candidate: changed digests, unknown and never-reusable checks.
    for field in [
        "pending_request_digest",
        "source_digest",
        "commands_digest",
        "policy_digest",
        "provider_digest",
    ] {
        let mut changed = good.clone();
        changed[field] = json!("b".repeat(64));
        rejections.push((changed, StatusCode::CONFLICT, "stale_candidate", field));
    }
    let mut unknown_command = good.clone();
    unknown_command["reusable_build_checks"][0]["command_digest"] = json!("c".repeat(64));
    rejections.push((
        unknown_command,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_command_digest",
        "reusable_build_checks[0].command_digest",
    ));
    let database = adoption_body(&candidate, id, &[3]);
    rejections.push((
        database,
        StatusCode::UNPROCESSABLE_ENTITY,
        "not_reusable",
        "reusable_build_checks[0].command_digest",
    ));
    let mut other_agent = good.clone();
    other_agent["agent"] = json!("other");
    rejections.push((
        other_agent,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "agent",
    ));
    for (body, status, code, field) in rejections {
        let (got, error) = api
            .call(
                "POST",
                &format!("{base}/adoptions"),
                Some(&api.operator),
                Some(body.clone()),
            )
            .await;
        assert_eq!(
            (got, error_code(&error), error_field(&error)),
            (status, code, field),
            "{body} -> {error}"
        );
    }
    // A viewer cannot adopt.
    let (status, _) = api
        .call(
            "POST",
            &format!("{base}/adoptions"),
            Some(&api.viewer),
            Some(good.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        api.footprint().await,
        before,
        "no rejection changed anything"
    );

    // Admitted once: the ticket is queued again through the outbox, same attempt.
    let (status, receipt) = api
        .call(
            "POST",
            &format!("{base}/adoptions"),
            Some(&api.operator),
            Some(good.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{receipt}");
    assert_eq!(receipt["status"], "queued");
    assert_eq!(receipt["request_id"], id);
    assert_eq!(receipt["handoff_state"], "adopted");
    assert_eq!(
        receipt["reusable_build_checks"],
        json!([candidate["commands"][0]["command_digest"]])
    );
    let (state, attempt): (String, i32) =
        sqlx::query_as("SELECT state, attempt FROM execution_requests WHERE id = $1")
            .bind(request_id)
            .fetch_one(api.pool())
            .await
            .expect("request");
    assert_eq!((state.as_str(), attempt), ("queued", 1));
    let message: Value = sqlx::query_scalar(
        "SELECT payload FROM outbox WHERE routing_key = 'verifications' ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(api.pool())
    .await
    .expect("outbox");
    assert_eq!(message["kind"], "verification");
    assert_eq!(
        message["action_id"],
        json!(Uuid::parse_str(id).expect("id"))
    );

    // The same id and input: the same receipt, nothing more admitted.
    let after = api.footprint().await;
    let (status, again) = api
        .call(
            "POST",
            &format!("{base}/adoptions"),
            Some(&api.operator),
            Some(good.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(again, receipt);
    assert_eq!(api.footprint().await, after);
    // The same id with other input: 409, and nothing changes.
    let other = adoption_body(&candidate, id, &[]);
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/adoptions"),
            Some(&api.operator),
            Some(other),
        )
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "request_id_conflict")
    );
    assert_eq!(api.footprint().await, after);
    // A new id finds no pending handoff any more.
    let fresh = adoption_body(&candidate, "fedcba9876543210fedcba9876543210", &[]);
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/adoptions"),
            Some(&api.operator),
            Some(fresh),
        )
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "no_pending_handoff")
    );
    assert_eq!(api.footprint().await, after);

    let (status, read) = api
        .call(
            "GET",
            &format!("{base}/adoptions/{id}"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!((status, read), (StatusCode::OK, receipt));
    let (status, _) = api
        .call(
            "GET",
            &format!("{base}/adoptions/fedcba9876543210fedcba9876543210"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, error) = api
        .call(
            "GET",
            &format!("{base}/adoptions/nope"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::BAD_REQUEST, "request_id")
    );
}
