//! The scheduler's settings: flags and `CAIRN_*` environment variables.

use cairn_common::component::Settings;
use cairn_common::config::{AmqpArgs, DatabaseArgs, LogArgs, LogFormat, RedisArgs};
use clap::Parser;
use std::net::SocketAddr;

/// Cairn's scheduler: admission API and outbox relay.
#[derive(Debug, Clone, Parser)]
#[command(name = "cairn-scheduler", version, about)]
pub struct Config {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub amqp: AmqpArgs,
    #[command(flatten)]
    pub log: LogArgs,
    /// Address of the HTTP API, probes and metrics.
    #[arg(long, env = "CAIRN_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Apply pending migrations at start (they serialize on an advisory lock).
    #[arg(long, env = "CAIRN_MIGRATE", default_value_t = true, action = clap::ArgAction::Set)]
    pub migrate: bool,
    /// Outbox rows published per batch.
    #[arg(long, env = "CAIRN_OUTBOX_BATCH_SIZE", default_value_t = 500,
          value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub outbox_batch_size: i64,
    /// A token that becomes an admin token at start (for the first admin); at least 16
    /// characters. Create the others with `cairnctl token create`.
    #[arg(long, env = "CAIRN_BOOTSTRAP_ADMIN_TOKEN", hide_env_values = true)]
    pub bootstrap_admin_token: Option<String>,
    /// Print the OpenAPI document and exit.
    #[arg(long)]
    pub print_openapi: bool,
    /// Seconds between lease sweeps (lapsed leases, silent workers, ended continuation
    /// windows). Part of the takeover time after a worker dies.
    #[arg(long, env = "CAIRN_SWEEP_INTERVAL_SECONDS", default_value_t = 1.0)]
    pub sweep_interval_seconds: f64,
    /// Seconds between passes of the flow-control gate, which releases runs held by
    /// their concurrency key, rate limit or priority.
    #[arg(long, env = "CAIRN_GATE_INTERVAL_SECONDS", default_value_t = 0.05)]
    pub gate_interval_seconds: f64,
    /// Seconds per sample of the fleet overview (`GET /api/v1/overview`, the console's
    /// charts): runs ended, queue depth, admission→start latency, workers.
    #[arg(long, env = "CAIRN_OVERVIEW_INTERVAL_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=300))]
    pub overview_interval_seconds: u32,
    /// Seconds to let background work finish after SIGTERM.
    #[arg(long, env = "CAIRN_DRAIN_SECONDS", default_value_t = 10)]
    pub drain_seconds: u64,
}

impl Settings for Config {
    /// Checks what clap cannot: the service URLs.
    fn validate(&self) -> Result<(), String> {
        if !(0.05..=3600.0).contains(&self.sweep_interval_seconds) {
            return Err("CAIRN_SWEEP_INTERVAL_SECONDS: from 0.05 to 3600".into());
        }
        if !(0.01..=60.0).contains(&self.gate_interval_seconds) {
            return Err("CAIRN_GATE_INTERVAL_SECONDS: from 0.01 to 60".into());
        }
        if let Some(token) = &self.bootstrap_admin_token {
            if token.trim().len() < 16 {
                return Err("CAIRN_BOOTSTRAP_ADMIN_TOKEN: at least 16 characters".into());
            }
        }
        cairn_common::component::validate_urls(
            Some(&self.database),
            Some(&self.redis),
            Some(&self.amqp),
        )
    }

    fn log_format(&self) -> LogFormat {
        self.log.log_format
    }
}
