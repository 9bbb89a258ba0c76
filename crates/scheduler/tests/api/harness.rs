//! The API under test: a router on a fresh database, with a token of each role, and
//! the fixtures that put a run where a worker would have left it.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use cairn_common::journal::{self, Outcome, Receipt};
use cairn_common::lease::Lease;
use cairn_common::testing::{self, TestDb};
use cairn_scheduler::api::{self, auth, auth::Role, AppState};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};
use tower::ServiceExt;
use uuid::Uuid;

pub const POLICY: &str = "/api/v1/invalid-read-continuity/policy";

pub struct Api {
    pub db: TestDb,
    pub app: Router,
    pub admin: String,
    pub operator: String,
    pub viewer: String,
}

impl Api {
    pub async fn new() -> Api {
        let db = TestDb::new().await;
        // As the scheduler does on an install's first start.
        cairn_common::qualification::register_first(&db.pool)
            .await
            .expect("the source profile");
        let app = api::router(AppState {
            pool: db.pool.clone(),
            metrics: Default::default(),
        });
        let admin = auth::generate();
        auth::insert(&db.pool, "admin", Role::Admin, None, &admin)
            .await
            .expect("admin");
        let operator = auth::generate();
        auth::insert(
            &db.pool,
            "operator",
            Role::Operator,
            Some("default"),
            &operator,
        )
        .await
        .expect("operator");
        let viewer = auth::generate();
        auth::insert(&db.pool, "viewer", Role::Viewer, Some("default"), &viewer)
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

    pub fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.call_with(method, path, token, body.map(|b| b.to_string()), &[])
            .await
    }

    pub async fn call_with(
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

    pub async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call("GET", path, Some(token), None).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.call("POST", path, Some(token), body).await
    }

    pub async fn put_policy(&self, token: &str, body: Value) -> (StatusCode, Value) {
        self.call("PUT", POLICY, Some(token), Some(body)).await
    }

    /// Submits `run_spec("coder")` as `token`; returns the new run's id.
    pub async fn submit(&self, token: &str) -> String {
        self.submit_for(token, "coder").await
    }

    /// Submits a run of `agent`; returns its id.
    pub async fn submit_for(&self, token: &str, agent: &str) -> String {
        let (status, run) = self
            .post("/api/v1/runs", token, Some(run_spec(agent)))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{run}");
        run["run_id"].as_str().expect("run id").to_string()
    }

    /// The ids of a submitted run and of the one execution request admission wrote for it.
    pub async fn request_of(&self, run_id: &str) -> (Uuid, Uuid) {
        let run_id = Uuid::parse_str(run_id).expect("uuid");
        let request_id = sqlx::query_scalar("SELECT id FROM execution_requests WHERE run_id = $1")
            .bind(run_id)
            .fetch_one(self.pool())
            .await
            .expect("request");
        (run_id, request_id)
    }

    pub async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(self.pool())
            .await
            .expect("count")
    }

    /// A snapshot of every table admission writes, to prove a rejection changed nothing.
    pub async fn footprint(&self) -> Vec<i64> {
        let mut counts = Vec::new();
        for table in [
            "runs",
            "execution_requests",
            "outbox",
            "continuation_actions",
            "api_tokens",
            "verification_adoptions",
            "sandboxes",
            "sandbox_operations",
            "publications",
            "delivery_holds",
            "source_profiles",
            "sandbox_templates",
        ] {
            counts.push(self.count(table).await);
        }
        for moved in [
            "SELECT sum(revision)::bigint FROM recovery_policy",
            "SELECT count(*) FROM api_tokens WHERE revoked_at IS NOT NULL",
            "SELECT count(*) FROM sandboxes WHERE desired <> 'running'",
            "SELECT count(*) FROM runs WHERE cancel_requested_at IS NOT NULL",
            "SELECT count(*) FROM project_snapshots WHERE retention <> 'current'",
        ] {
            let value: i64 = sqlx::query_scalar(moved)
                .fetch_one(self.pool())
                .await
                .expect("footprint");
            counts.push(value);
        }
        counts
    }
}

pub fn run_spec(agent: &str) -> Value {
    json!({
        "agent": agent,
        "steps": [
            {"key": "build", "argv": ["make"], "timeout_seconds": 60},
            {"key": "test", "argv": ["make", "test"], "idempotent": true}
        ],
        "budgets": {"max_commands": 10, "max_wall_seconds": 600}
    })
}

pub fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

pub fn error_message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or("")
}

pub fn error_field(body: &Value) -> &str {
    body["error"]["field"].as_str().unwrap_or("")
}

/// The lease a worker held on its first claim of a request (epoch 1).
pub fn first_lease(request_id: Uuid) -> Lease {
    Lease {
        of: cairn_common::lease::Leased::Request,
        request_id,
        owner: "w1".into(),
        epoch: 1,
        deadline: chrono::Utc::now(),
    }
}

pub use cairn_common::testing::exited_zero;

/// Journals `steps` in order as a worker does (intent, then receipt), each ended with
/// `outcome` under `lease`, attempt 1.
pub async fn journal_steps(
    conn: &mut PgConnection,
    lease: &Lease,
    steps: &[&str],
    outcome: &Outcome,
) {
    // The receipts stand on a checkpoint of the run's tree, as a worker's would.
    let tree = format!("tree-{}", lease.request_id.simple());
    let snapshot = testing::commit_tree(conn, lease.request_id, &tree).await;
    for (index, &step_key) in steps.iter().enumerate() {
        journal::write_intent(conn, lease, 1, step_key, index, false, None)
            .await
            .expect("intent");
        let receipt = Receipt {
            step_key,
            attempt: 1,
            outcome,
            tier: None,
        };
        journal::record_receipt(conn, lease, &receipt, Some(snapshot))
            .await
            .expect("receipt");
    }
}
