//! The reaper's settings: flags and `CAIRN_*` environment variables.

use cairn_common::config::{DatabaseArgs, LogArgs};
use clap::Parser;
use std::net::SocketAddr;

/// Cairn's reaper: retention and reclamation of snapshots and holds.
#[derive(Debug, Clone, Parser)]
#[command(name = "cairn-reaper", version, about)]
pub struct Config {
    #[command(flatten)]
    pub database: DatabaseArgs,

    #[command(flatten)]
    pub log: LogArgs,
    /// Address of the probes (`/healthz`, `/readyz`) and `/metrics`.
    #[arg(long, env = "CAIRN_METRICS_LISTEN", default_value = "127.0.0.1:9092")]
    pub metrics_listen: SocketAddr,
    /// Apply pending migrations at start (they serialize on an advisory lock).
    #[arg(long, env = "CAIRN_MIGRATE", default_value_t = true, action = clap::ArgAction::Set)]
    pub migrate: bool,
    /// Seconds to let running work finish after SIGTERM before stopping it.
    #[arg(long, env = "CAIRN_DRAIN_SECONDS", default_value_t = 30)]
    pub drain_seconds: u64,
}

impl Config {
    /// Checks what clap cannot: the service URLs.
    pub fn validate(&self) -> Result<(), String> {
        cairn_common::component::validate_urls(Some(&self.database), None, None)
    }
}
