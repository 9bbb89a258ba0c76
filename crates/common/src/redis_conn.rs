//! The Redis connection manager (reconnects by itself).

use backon::{ExponentialBuilder, Retryable};
use redis::aio::ConnectionManager;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum RedisConnError {
    #[error("invalid Redis URL: {0}")]
    InvalidUrl(String),
    #[error("Redis unavailable: {0}")]
    Unavailable(#[from] redis::RedisError),
}

/// Checks a Redis URL without connecting.
pub fn validate_url(url: &str) -> Result<redis::Client, RedisConnError> {
    redis::Client::open(url).map_err(|e| RedisConnError::InvalidUrl(e.to_string()))
}

fn manager_config() -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(5)))
}

/// A manager that connects on its first command, and again after a failure: for a
/// process that serves without Redis and only reports it (the scheduler), so that a
/// Redis outage does not hold its start.
pub fn connect_lazily(url: &str) -> Result<ConnectionManager, RedisConnError> {
    let client = validate_url(url)?;
    Ok(ConnectionManager::new_lazy_with_config(
        client,
        manager_config(),
    )?)
}

/// Connects with retry; the manager reconnects by itself afterwards.
pub async fn connect(url: &str) -> Result<ConnectionManager, RedisConnError> {
    let client = validate_url(url)?;
    let config = manager_config();
    let manager = (|| ConnectionManager::new_with_config(client.clone(), config.clone()))
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(5))
                .with_max_times(12),
        )
        .notify(|e, wait| tracing::warn!(error = %e, ?wait, "Redis not answering, retrying"))
        .await?;
    Ok(manager)
}
