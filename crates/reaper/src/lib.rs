//! The reaper. It connects to PostgreSQL and serves its probes and metrics; the
//! retention sweeps are not built yet.
//!
//! - [`config`]: its settings.
//! - [`run`]: runs until the shutdown token is cancelled.

pub mod config;

use anyhow::Context;
use cairn_common::health::{self, Readiness};
use cairn_common::{db, metrics};
pub use config::Config;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

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
    let listener = tokio::net::TcpListener::bind(config.metrics_listen)
        .await
        .with_context(|| format!("binding {}", config.metrics_listen))?;
    let registry = Arc::new(metrics::registry());
    let readiness = Readiness {
        postgres: Some(pool.clone()),
        ..Default::default()
    };
    tracing::info!(listen = %config.metrics_listen, "reaper probes listening");
    health::serve(listener, health::router(readiness, registry), shutdown)
        .await
        .context("serving probes")?;
    pool.close().await;
    tracing::info!("reaper stopped");
    Ok(())
}
