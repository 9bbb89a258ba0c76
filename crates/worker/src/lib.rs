//! The worker. It connects to PostgreSQL, Redis and RabbitMQ (declaring the topology),
//! and serves its probes and metrics; claiming and running jobs is not built yet.
//!
//! - [`config`]: its settings.
//! - [`run`]: runs until the shutdown token is cancelled, then drains.

pub mod config;

use anyhow::Context;
use cairn_common::health::{self, AmqpStatus, Readiness};
use cairn_common::queue::{self, Topology};
use cairn_common::{db, metrics, redis_conn};
pub use config::Config;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let pool = db::connect(
        &config.database.database_url,
        config.database.database_max_connections,
    )
    .await
    .context("connecting to PostgreSQL")?;
    if config.migrate {
        db::migrate(&pool).await.context("migrating the database")?;
    }
    let redis = redis_conn::connect(&config.redis.redis_url)
        .await
        .context("connecting to Redis")?;
    let listener = tokio::net::TcpListener::bind(config.metrics_listen)
        .await
        .with_context(|| format!("binding {}", config.metrics_listen))?;
    let registry = Arc::new(metrics::registry());
    let amqp_status = AmqpStatus::default();
    let topology = Topology::new(&config.amqp.queue_prefix, config.amqp.delivery_limit);

    let tasks = TaskTracker::new();
    {
        let (url, status, shutdown) = (
            config.amqp.amqp_url.clone(),
            amqp_status.clone(),
            shutdown.clone(),
        );
        tasks.spawn(async move { queue::maintain(&url, &topology, &status, &shutdown).await });
    }
    let readiness = Readiness {
        postgres: Some(pool.clone()),
        redis: Some(redis),
        amqp: Some(amqp_status),
    };
    tracing::info!(listen = %config.metrics_listen, "worker probes listening");
    health::serve(
        listener,
        health::router(readiness, registry),
        shutdown.clone(),
    )
    .await
    .context("serving probes")?;

    tasks.close();
    let drain = Duration::from_secs(config.drain_seconds);
    if tokio::time::timeout(drain, tasks.wait()).await.is_err() {
        tracing::warn!(?drain, "tasks did not stop within the drain time");
    }
    pool.close().await;
    tracing::info!("worker stopped");
    Ok(())
}
