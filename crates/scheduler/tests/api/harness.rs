//! The API under test: a router on a fresh database, with a token of each role.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use cairn_common::testing::TestDb;
use cairn_scheduler::api::{self, auth, auth::Role, AppState};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use sqlx::PgPool;
use tower::ServiceExt;

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

pub fn error_field(body: &Value) -> &str {
    body["error"]["field"].as_str().unwrap_or("")
}
