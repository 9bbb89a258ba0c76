//! `/healthz` (the process is up), `/readyz` (what it needs to serve answers; every
//! dependency's status in `checks`) and `/metrics`.

use crate::metrics::{render, SharedRegistry};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
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

/// The dependencies whose outage makes a component unready (out of its Service, and
/// unavailable to its PodDisruptionBudget): only those it cannot serve without.
#[derive(Clone, Copy, Default, Debug)]
pub struct Needs {
    pub postgres: bool,
    pub redis: bool,
    pub amqp: bool,
}

/// What `/readyz` checks. Every dependency given is checked and reported, in `checks`
/// and the `cairn_dependency_up` gauge; only those in `needs` decide readiness, so that
/// a blip of one the component serves without never empties its Service.
#[derive(Clone, Default)]
pub struct Readiness {
    pub postgres: Option<PgPool>,
    pub redis: Option<ConnectionManager>,
    pub amqp: Option<AmqpStatus>,
    pub needs: Needs,
    /// Facts about the process shown with the checks (the worker's sandbox).
    pub details: serde_json::Map<String, serde_json::Value>,
    pub gauge: DependencyGauge,
    /// Why this process takes no work at all (a worker told to require a sandbox its
    /// host cannot give): never ready, and the reason is in `checks`.
    pub refused: Option<String>,
}

/// `cairn_dependency_up{dependency}`: 1 while the dependency answered its last check.
#[derive(Clone, Default)]
pub struct DependencyGauge(Family<Vec<(String, String)>, Gauge>);

impl DependencyGauge {
    pub fn register(registry: &mut Registry) -> Self {
        let gauge = Self::default();
        registry.register(
            "dependency_up",
            "Whether a service this process uses answered its last check (1) or not (0)",
            gauge.0.clone(),
        );
        gauge
    }

    fn set(&self, dependency: &str, up: bool) {
        self.0
            .get_or_create(&vec![("dependency".to_string(), dependency.to_string())])
            .set(i64::from(up));
    }
}

const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the gauge is refreshed between probes.
const MONITOR_INTERVAL: Duration = Duration::from_secs(10);

impl Readiness {
    /// Runs every check; returns whether the needed ones passed and each one's result.
    pub async fn check(&self) -> (bool, serde_json::Map<String, serde_json::Value>) {
        let mut checks = serde_json::Map::new();
        let mut ready = true;
        let mut record = |name: &str, ok: bool, needed: bool| {
            ready &= ok || !needed;
            self.gauge.set(name, ok);
            checks.insert(name.into(), status(ok));
        };
        if let Some(pool) = &self.postgres {
            let ok = matches!(
                tokio::time::timeout(CHECK_TIMEOUT, sqlx::query("SELECT 1").execute(pool)).await,
                Ok(Ok(_))
            );
            record("postgres", ok, self.needs.postgres);
        }
        if let Some(redis) = &self.redis {
            let mut conn = redis.clone();
            let cmd = redis::cmd("PING");
            let ping = cmd.query_async::<String>(&mut conn);
            let ok = matches!(tokio::time::timeout(CHECK_TIMEOUT, ping).await, Ok(Ok(_)));
            record("redis", ok, self.needs.redis);
        }
        if let Some(amqp) = &self.amqp {
            record("rabbitmq", amqp.is_up(), self.needs.amqp);
        }
        if let Some(why) = &self.refused {
            ready = false;
            checks.insert("work".into(), json!({"status": "refused", "reason": why}));
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
    /// Stops the monitor once the last copy of the router is gone.
    _monitor: Arc<tokio_util::sync::DropGuard>,
}

/// The probe routes, to merge into a component's router or serve alone. The checks
/// also run every [`MONITOR_INTERVAL`], so the gauge shows an outage without probes.
pub fn router(readiness: Readiness, registry: SharedRegistry) -> Router {
    let monitored = readiness.clone();
    let monitor = CancellationToken::new();
    let stopped = monitor.clone();
    tokio::spawn(async move {
        let watch = async {
            loop {
                monitored.check().await;
                tokio::time::sleep(MONITOR_INTERVAL).await;
            }
        };
        tokio::select! {
            _ = watch => {}
            _ = stopped.cancelled() => {}
        }
    });
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(ProbeState {
            readiness,
            registry,
            _monitor: Arc::new(monitor.drop_guard()),
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
