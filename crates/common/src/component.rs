//! What every Cairn process shares at start-up: validated connection settings and
//! migrations on start.

use crate::config::{exit_invalid, parse_or_exit, AmqpArgs, DatabaseArgs, LogFormat, RedisArgs};
use anyhow::Context;
use sqlx::PgPool;

/// A binary's settings: parsed by clap, then checked for what clap cannot check.
pub trait Settings: clap::Parser {
    /// Checks what clap cannot (ranges across fields, URLs); the reason names the variable.
    fn validate(&self) -> Result<(), String>;
    fn log_format(&self) -> LogFormat;
}

/// Parses and validates a binary's settings, or exits with status 2.
pub fn settings<C: Settings>() -> C {
    validated(parse_or_exit())
}

/// Validates parsed settings, or exits with status 2.
pub fn validated<C: Settings>(config: C) -> C {
    if let Err(reason) = config.validate() {
        exit_invalid(reason);
    }
    config
}

/// Connects to PostgreSQL with a pool of `pool_size` (see [`crate::db::connect`] for
/// `idle_in_transaction`; it opens the pool's warm connections) and, when `migrate`,
/// applies pending migrations.
pub async fn database(
    args: &DatabaseArgs,
    pool_size: u32,
    idle_in_transaction: Option<std::time::Duration>,
    migrate: bool,
) -> anyhow::Result<PgPool> {
    let warm = args
        .database_warm_connections
        .unwrap_or(crate::db::WARM_CONNECTIONS);
    let pool = crate::db::connect_warm(&args.database_url, (pool_size, warm), idle_in_transaction)
        .await
        .context("connecting to PostgreSQL")?;
    if migrate {
        crate::db::migrate(&pool)
            .await
            .context("migrating the database")?;
    }
    Ok(pool)
}

/// Checks the URLs of the services a process uses, without connecting.
pub fn validate_urls(
    database: Option<&DatabaseArgs>,
    redis: Option<&RedisArgs>,
    amqp: Option<&AmqpArgs>,
) -> Result<(), String> {
    if let Some(database) = database {
        crate::db::validate_url(&database.database_url)
            .map_err(|e| format!("CAIRN_DATABASE_URL: {e}"))?;
    }
    if let Some(redis) = redis {
        crate::redis_conn::validate_url(&redis.redis_url)
            .map_err(|e| format!("CAIRN_REDIS_URL: {e}"))?;
    }
    if let Some(amqp) = amqp {
        crate::queue::validate_url(&amqp.amqp_url).map_err(|e| format!("CAIRN_AMQP_URL: {e}"))?;
        if amqp.delivery_limit == 0 {
            return Err("CAIRN_DELIVERY_LIMIT: must be at least 1".into());
        }
    }
    Ok(())
}

/// What every binary's `main` does after parsing and validating its configuration:
/// tracing, a shutdown token for SIGTERM/SIGINT, the component's `run`, an exit status.
pub async fn main<C, F, Fut, E>(component: &str, config: C, run: F) -> std::process::ExitCode
where
    C: Settings,
    F: FnOnce(C, tokio_util::sync::CancellationToken) -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    crate::telemetry::init(config.log_format());
    let shutdown = match crate::shutdown::on_signal() {
        Ok(token) => token,
        Err(e) => {
            eprintln!("cannot install signal handlers: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match run(config, shutdown).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "{component} failed");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The node this process runs on, as off-host durability compares them: `configured`
/// (`CAIRN_NODE_NAME`; the chart gives each pod its Kubernetes node's name). None
/// without it: a host name is a container's own, and two containers on one host would
/// pass for two nodes.
pub fn node_name(configured: Option<&str>) -> Option<String> {
    configured
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}
