//! `/healthz` (the process is up), `/readyz` (its dependencies answer) and `/metrics`.

use crate::metrics::{render, SharedRegistry};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use redis::aio::ConnectionManager;
use serde_json::json;
use sqlx::PgPool;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Whether a component's AMQP connection is up, as its owner last saw it.
#[derive(Clone, Default)]
pub struct AmqpStatus(Arc<AtomicBool>);

impl AmqpStatus {
    pub fn set(&self, up: bool) {
        self.0.store(up, Ordering::Relaxed);
    }

    pub fn is_up(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What `/readyz` checks: every dependency the process uses.
#[derive(Clone, Default)]
pub struct Readiness {
    pub postgres: Option<PgPool>,
    pub redis: Option<ConnectionManager>,
    pub amqp: Option<AmqpStatus>,
    /// Facts about the process shown with the checks (the worker's sandbox).
    pub details: serde_json::Map<String, serde_json::Value>,
}

const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

impl Readiness {
    /// Runs every check; returns whether all passed and each one's result.
    pub async fn check(&self) -> (bool, serde_json::Map<String, serde_json::Value>) {
        let mut checks = serde_json::Map::new();
        let mut ready = true;
        if let Some(pool) = &self.postgres {
            let ok = matches!(
                tokio::time::timeout(CHECK_TIMEOUT, sqlx::query("SELECT 1").execute(pool)).await,
                Ok(Ok(_))
            );
            ready &= ok;
            checks.insert("postgres".into(), status(ok));
        }
        if let Some(redis) = &self.redis {
            let mut conn = redis.clone();
            let cmd = redis::cmd("PING");
            let ping = cmd.query_async::<String>(&mut conn);
            let ok = matches!(tokio::time::timeout(CHECK_TIMEOUT, ping).await, Ok(Ok(_)));
            ready &= ok;
            checks.insert("redis".into(), status(ok));
        }
        if let Some(amqp) = &self.amqp {
            let ok = amqp.is_up();
            ready &= ok;
            checks.insert("rabbitmq".into(), status(ok));
        }
        (ready, checks)
    }
}

fn status(ok: bool) -> serde_json::Value {
    json!(if ok { "ok" } else { "unavailable" })
}

#[derive(Clone)]
struct ProbeState {
    readiness: Readiness,
    registry: SharedRegistry,
}

/// The probe routes, to merge into a component's router or serve alone.
pub fn router(readiness: Readiness, registry: SharedRegistry) -> Router {
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(ProbeState {
            readiness,
            registry,
        })
}

async fn readyz(State(state): State<ProbeState>) -> Response {
    let (ready, checks) = state.readiness.check().await;
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = json!({"status": if ready { "ready" } else { "not_ready" }, "checks": checks});
    if !state.readiness.details.is_empty() {
        body["details"] = serde_json::Value::Object(state.readiness.details.clone());
    }
    (code, Json(body)).into_response()
}

async fn metrics(State(state): State<ProbeState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        render(&state.registry),
    )
        .into_response()
}

/// Serves a router until `shutdown` is cancelled, then lets in-flight requests finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}
