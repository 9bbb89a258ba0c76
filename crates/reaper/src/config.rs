//! The reaper's settings: flags and `CAIRN_*` environment variables. Every duration is
//! configuration with the product's default.

use cairn_common::component::Settings;
use cairn_common::config::{DatabaseArgs, LogArgs, LogFormat};
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
    /// Seconds to let a running sweep finish after SIGTERM.
    #[arg(long, env = "CAIRN_DRAIN_SECONDS", default_value_t = 30)]
    pub drain_seconds: u64,
    /// Seconds between sweeps of the leader (and between a standby's leadership tries).
    #[arg(long, env = "CAIRN_REAPER_INTERVAL_SECONDS", default_value_t = 60.0)]
    pub interval_seconds: f64,
    /// The node this reaper runs on (the chart: the pod's node). It reads back the
    /// sandbox snapshots other nodes wrote: one it reads whole is off-host. Unset: it
    /// reads none back.
    #[arg(long, env = "CAIRN_NODE_NAME")]
    pub node_name: Option<String>,
    /// Rows per batch (one transaction each).
    #[arg(long, env = "CAIRN_REAPER_BATCH", default_value_t = 1000,
          value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub batch: i64,
    /// Checkpoint heads neither captured nor restored for this long are retired.
    #[arg(long, env = "CAIRN_IDLE_HEAD_SECONDS", default_value_t = 14 * 86_400)]
    pub idle_head_seconds: i64,
    /// Retired, superseded and failed snapshots lose their bytes after this long.
    #[arg(long, env = "CAIRN_RECLAIM_AFTER_SECONDS", default_value_t = 7 * 86_400)]
    pub reclaim_after_seconds: i64,
    /// Snapshots of a destroyed workspace are deleted after this grace.
    #[arg(long, env = "CAIRN_DESTROYED_GRACE_SECONDS", default_value_t = 86_400)]
    pub destroyed_grace_seconds: i64,
    /// Memory checkpoints expire this long after their pause.
    #[arg(long, env = "CAIRN_MEMORY_CHECKPOINT_SECONDS", default_value_t = 72 * 3_600)]
    pub memory_checkpoint_seconds: i64,
    /// A capture still `creating` or `uploading` after this long was interrupted,
    /// whoever its owner: it is failed, so it no longer defers reclamation in its store.
    #[arg(long, env = "CAIRN_STALE_CAPTURE_SECONDS", default_value_t = 6 * 3_600)]
    pub stale_capture_seconds: i64,
    /// A capture whose owner can no longer commit it (its lease lapsed, or another worker
    /// took the request over) is failed once it is this old.
    #[arg(long, env = "CAIRN_ABANDONED_CAPTURE_SECONDS", default_value_t = 60)]
    pub abandoned_capture_seconds: i64,
    /// A quarantined snapshot's bytes are kept this long after its quarantine, for
    /// investigation.
    #[arg(long, env = "CAIRN_QUARANTINE_KEEP_SECONDS", default_value_t = 30 * 86_400)]
    pub quarantine_keep_seconds: i64,
    /// Print what one sweep would do, change nothing, and exit.
    #[arg(long)]
    pub dry_run: bool,
    /// Run one sweep (as leader) and exit.
    #[arg(long)]
    pub once: bool,
}

impl Config {
    pub fn durations(&self) -> crate::retention::Durations {
        use chrono::Duration;
        crate::retention::Durations {
            idle_head: Duration::seconds(self.idle_head_seconds),
            reclaim_after: Duration::seconds(self.reclaim_after_seconds),
            destroyed_grace: Duration::seconds(self.destroyed_grace_seconds),
            memory_checkpoint: Duration::seconds(self.memory_checkpoint_seconds),
            stale_capture: Duration::seconds(self.stale_capture_seconds),
            abandoned_capture: Duration::seconds(self.abandoned_capture_seconds),
            quarantine_kept: Duration::seconds(self.quarantine_keep_seconds),
            ..Default::default()
        }
    }
}

impl Settings for Config {
    /// Checks what clap cannot.
    fn validate(&self) -> Result<(), String> {
        cairn_common::component::validate_urls(Some(&self.database), None, None)?;
        if !(0.05..=86_400.0).contains(&self.interval_seconds) {
            return Err("CAIRN_REAPER_INTERVAL_SECONDS: from 0.05 to 86400".into());
        }
        for (name, value) in [
            ("CAIRN_IDLE_HEAD_SECONDS", self.idle_head_seconds),
            ("CAIRN_RECLAIM_AFTER_SECONDS", self.reclaim_after_seconds),
            (
                "CAIRN_DESTROYED_GRACE_SECONDS",
                self.destroyed_grace_seconds,
            ),
            (
                "CAIRN_MEMORY_CHECKPOINT_SECONDS",
                self.memory_checkpoint_seconds,
            ),
            (
                "CAIRN_ABANDONED_CAPTURE_SECONDS",
                self.abandoned_capture_seconds,
            ),
            (
                "CAIRN_QUARANTINE_KEEP_SECONDS",
                self.quarantine_keep_seconds,
            ),
        ] {
            if value < 0 {
                return Err(format!("{name}: must not be negative"));
            }
        }
        Ok(())
    }

    fn log_format(&self) -> LogFormat {
        self.log.log_format
    }
}
