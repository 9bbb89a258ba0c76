//! The scheduler: the HTTP API and the outbox relay.
//!
//! - [`api`]: admission of runs and reviewed continuations, policy, tokens.
//! - [`config`]: its settings.
//! - [`console`]: the operator console's static files, served at `/`.
//! - [`sweeper`]: the lease sweeper (one leader at a time).
//! - [`gate`]: the flow-control gate (one leader at a time).
//! - [`overview`]: the fleet overview's sampler (one leader at a time).
//! - [`sandbox_sweep`]: sandboxes whose owner's lease lapsed.
//! - [`sandbox_expiry`]: sandbox timeouts (idle-anchored stop or destroy).
//! - [`run`]: runs until the shutdown token is cancelled, then drains.

pub mod api;
pub mod config;
pub mod console;
pub mod gate;
pub mod overview;
pub mod parked;
pub mod sandbox_expiry;
pub mod sandbox_sweep;
pub mod sweeper;

use anyhow::Context;
use cairn_common::health::{self, AmqpStatus, Readiness};
use cairn_common::metrics::{self, OutboxMetrics};
use cairn_common::outbox::Relay;
use cairn_common::queue::Topology;
use cairn_common::{component, redis_conn};
pub use config::Config;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What the scheduler records before it serves: the bootstrap admin token, and on an
/// install's first start the source profile of the release it runs (after an upgrade
/// that changes the profile, an admin qualifies the new one).
async fn bootstrap(pool: &sqlx::PgPool, config: &Config) -> anyhow::Result<()> {
    if let Some(token) = &config.bootstrap_admin_token {
        api::auth::bootstrap_admin(pool, token.trim())
            .await
            .context("saving the bootstrap admin token")?;
    }
    if cairn_common::qualification::register_first(pool)
        .await
        .context("registering the source profile")?
    {
        tracing::info!(profile = %cairn_common::qualification::current(), "registered this release's source profile as qualified");
    }
    Ok(())
}

/// The loops that one scheduler at a time leads: the flow-control gate, the overview's
/// sampler and the lease sweeper.
fn spawn_leaders(
    tasks: &TaskTracker,
    pool: &sqlx::PgPool,
    config: &Config,
    gate_metrics: gate::GateMetrics,
    sweeper_metrics: sweeper::SweeperMetrics,
    shutdown: &CancellationToken,
) {
    tasks.spawn(gate::run(
        pool.clone(),
        Duration::from_secs_f64(config.gate_interval_seconds),
        gate_metrics,
        shutdown.clone(),
    ));
    tasks.spawn(overview::run(
        pool.clone(),
        config.overview_interval_seconds,
        shutdown.clone(),
    ));
    tasks.spawn(sweeper::run(
        pool.clone(),
        Duration::from_secs_f64(config.sweep_interval_seconds),
        sweeper_metrics,
        shutdown.clone(),
    ));
}

/// Connects to every service, serves HTTP on `config.listen` and relays the outbox until
/// `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let pool_size = config.database.pool_size(10);
    let pool = component::database(&config.database, pool_size, None, config.migrate).await?;
    // Only its readiness report reads Redis: an outage must not hold the API's start.
    let redis = redis_conn::connect_lazily(&config.redis.redis_url).context("configuring Redis")?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;

    bootstrap(&pool, &config).await?;

    let mut registry = metrics::registry();
    let outbox_metrics = OutboxMetrics::register(&mut registry);
    let api_metrics = api::ApiMetrics::register(&mut registry);
    let sweeper_metrics = sweeper::SweeperMetrics::register(&mut registry);
    let gate_metrics = gate::GateMetrics::register(&mut registry);
    let dependency_gauge = health::DependencyGauge::register(&mut registry);
    let registry = Arc::new(registry);
    let amqp_status = AmqpStatus::default();
    let topology = Topology::new(&config.amqp.queue_prefix, config.amqp.delivery_limit);

    let tasks = TaskTracker::new();
    let relay = Relay::new(
        pool.clone(),
        &config.amqp.amqp_url,
        topology,
        outbox_metrics,
        amqp_status.clone(),
    )
    .with_batch_size(config.outbox_batch_size);
    tasks.spawn(relay.run(shutdown.clone()));
    spawn_leaders(
        &tasks,
        &pool,
        &config,
        gate_metrics,
        sweeper_metrics,
        &shutdown,
    );

    let readiness = Readiness {
        postgres: Some(pool.clone()),
        redis: Some(redis),
        amqp: Some(amqp_status),
        // The API reads and writes PostgreSQL only: a Redis or RabbitMQ outage shows in
        // `checks` and the gauge, while the relay and the sweeper retry on their own.
        needs: health::Needs {
            postgres: true,
            ..Default::default()
        },
        gauge: dependency_gauge,
        ..Default::default()
    };
    let router = api::router(api::AppState {
        pool: pool.clone(),
        metrics: api_metrics,
    })
    .merge(health::router(readiness, registry))
    .merge(console::router());
    tracing::info!(listen = %config.listen, "scheduler listening");
    health::serve(listener, router, shutdown.clone())
        .await
        .context("serving HTTP")?;

    tasks.close();
    let drain = Duration::from_secs(config.drain_seconds);
    if tokio::time::timeout(drain, tasks.wait()).await.is_err() {
        tracing::warn!(
            ?drain,
            "background tasks did not stop within the drain time"
        );
    }
    pool.close().await;
    tracing::info!("scheduler stopped");
    Ok(())
}
