//! The reaper: an independent process, one active leader at a time (a PostgreSQL
//! advisory lock on a dedicated connection; a standby retries and takes over when the
//! leader's connection dies), sweeping retention rules in batches.
//!
//! - [`config`]: its settings.
//! - [`retention`]: the rules, each batched, resumable and idempotent.
//! - [`durability`]: sandbox snapshots read back from another node than their writer's.
//! - [`status`]: what operators read (the last sweeps, what waits for repair); it lives
//!   in `cairn_common::reaper_status`, since the scheduler's API reads it too.
//! - [`run`]: leadership, the sweep loop, probes and metrics.

pub mod config;
pub mod durability;
mod outputs;
mod reclaim;
pub mod retention;
pub use cairn_common::reaper_status as status;

use anyhow::Context;
use cairn_common::health::{self, Readiness};
use cairn_common::leader::{pause, Leadership};
use cairn_common::{component, metrics};
pub use config::Config;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The advisory lock key of the reaper leader ("cairnrpr").
const LEADER_LOCK: i64 = 0x6361_6972_6e72_7072;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub rule: String,
    pub outcome: String,
}

#[derive(Clone)]
pub struct ReaperMetrics {
    pub items: Family<RuleLabels, Counter>,
    pub bytes_reclaimed: Counter,
    pub sweeps: Counter,
    pub sweep_duration_seconds: Histogram,
    pub leader: Gauge,
}

impl ReaperMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = ReaperMetrics {
            items: Family::default(),
            bytes_reclaimed: Counter::default(),
            sweeps: Counter::default(),
            sweep_duration_seconds: Histogram::new([
                0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
            leader: Gauge::default(),
        };
        cairn_common::register_metrics!(registry;
            "reaper_items", "Items handled per rule and outcome" => m.items;
            "reaper_bytes_reclaimed", "Bytes of snapshot artifacts deleted" => m.bytes_reclaimed;
            "reaper_sweeps", "Sweeps completed" => m.sweeps;
            "reaper_sweep_duration_seconds", "Duration of a sweep" => m.sweep_duration_seconds;
            "reaper_leader", "1 while this instance leads" => m.leader;
        );
        m
    }

    fn count(&self, rule: &str, outcome: &str, n: u64) {
        if n > 0 {
            self.items
                .get_or_create(&RuleLabels {
                    rule: rule.into(),
                    outcome: outcome.into(),
                })
                .inc_by(n);
        }
    }

    pub fn observe(&self, report: &retention::SweepReport, took: Duration) {
        self.count("idle_heads", "retired", report.idle_heads_retired);
        self.count("reclaim", "reclaimed", report.snapshots_reclaimed);
        self.count("reclaim", "deferred", report.reclaim_deferred);
        self.count("reclaim", "failed", report.reclaim_failed);
        self.count("holds", "ended", report.holds_ended);
        self.count("credentials", "retired", report.credential_retired);
        self.count("sandbox_retention", "retired", report.sandbox_retired);
        self.count("stale_captures", "failed", report.stale_captures_failed);
        self.count("outputs", "reclaimed", report.outputs_reclaimed);
        self.count("outputs", "failed", report.outputs_failed);
        self.count("durability", "verified", report.snapshots_verified);
        self.count("durability", "failed", report.verify_failed);
        self.bytes_reclaimed.inc_by(report.bytes_reclaimed);
        self.sweeps.inc();
        self.sweep_duration_seconds.observe(took.as_secs_f64());
    }
}

/// One sweep with the configuration's rules and the current time.
pub async fn sweep(
    pool: &PgPool,
    config: &Config,
    dry_run: bool,
) -> Result<retention::SweepReport, sqlx::Error> {
    let durations = config.durations();
    // One clock for every rule: the database's, which the workers' holds and leases use.
    let now: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let mut report = retention::Sweep {
        pool,
        now,
        durations: &durations,
        batch: config.batch,
        dry_run,
    }
    .run()
    .await?;
    // Reading back changes only what durability reports: a dry run does not. Without
    // a node name, nothing is read back (see `durability`).
    if let (false, Some(node)) = (
        dry_run,
        cairn_common::component::node_name(config.node_name.as_deref()),
    ) {
        let done = durability::verify(pool, &node, config.batch).await?;
        report.snapshots_verified = done.verified;
        report.verify_failed = done.failed;
    }
    Ok(report)
}

pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    if config.dry_run {
        // A dry run creates no database and migrates nothing: it reads what is there.
        let pool = cairn_common::db::open_existing(&config.database.database_url, 2)
            .await
            .context("connecting to PostgreSQL for a dry run")?;
        let report = sweep(&pool, &config, true).await.context("dry-run sweep")?;
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
        return Ok(());
    }
    let pool_size = config.database.pool_size(10);
    let pool = component::database(&config.database, pool_size, None, config.migrate).await?;
    let listener = tokio::net::TcpListener::bind(config.metrics_listen)
        .await
        .with_context(|| format!("binding {}", config.metrics_listen))?;
    let mut registry = metrics::registry();
    let reaper_metrics = ReaperMetrics::register(&mut registry);
    let dependency_gauge = health::DependencyGauge::register(&mut registry);
    let readiness = Readiness {
        postgres: Some(pool.clone()),
        needs: health::Needs {
            postgres: true,
            ..Default::default()
        },
        gauge: dependency_gauge,
        ..Default::default()
    };
    let probes_stop = CancellationToken::new();
    let probes = tokio::spawn(health::serve(
        listener,
        health::router(readiness, Arc::new(registry)),
        probes_stop.clone(),
    ));
    tracing::info!(listen = %config.metrics_listen, "reaper started");
    let identity = format!(
        "{}-{}",
        nix_hostname().unwrap_or_else(|| "reaper".into()),
        std::process::id()
    );
    lead(&pool, &config, &reaper_metrics, &identity, &shutdown).await;
    probes_stop.cancel();
    let _ = probes.await;
    pool.close().await;
    tracing::info!("reaper stopped");
    Ok(())
}

fn nix_hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
}

/// Competes for leadership; sweeps every interval while leader.
async fn lead(
    pool: &PgPool,
    config: &Config,
    metrics: &ReaperMetrics,
    identity: &str,
    shutdown: &CancellationToken,
) {
    let interval = Duration::from_secs_f64(config.interval_seconds);
    while !shutdown.is_cancelled() {
        let Some(mut leadership) = Leadership::try_acquire(pool, LEADER_LOCK).await else {
            if config.once {
                tracing::info!("another reaper leads; nothing to do");
                return;
            }
            pause(interval, shutdown).await;
            continue;
        };
        metrics.leader.set(1);
        tracing::info!(identity, "this reaper leads");
        while !shutdown.is_cancelled() {
            let started = chrono::Utc::now();
            let clock = Instant::now();
            // A sweep commits batch by batch; past the drain time after SIGTERM it is
            // dropped mid-batch (that batch rolls back) and the next leader redoes it.
            let drain = Duration::from_secs(config.drain_seconds);
            let outcome = tokio::select! {
                outcome = sweep(pool, config, false) => Some(outcome),
                _ = async { shutdown.cancelled().await; tokio::time::sleep(drain).await } => None,
            };
            let Some(outcome) = outcome else {
                tracing::warn!(?drain, "sweep stopped by shutdown; the next one resumes");
                break;
            };
            match outcome {
                Ok(report) => {
                    metrics.observe(&report, clock.elapsed());
                    tracing::info!(?report, took = ?clock.elapsed(), "sweep done");
                    if let Err(e) = retention::record_sweep(pool, started, &report, identity).await
                    {
                        tracing::warn!(error = %e, "sweep not recorded");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "sweep failed; the next one resumes"),
            }
            if config.once {
                break;
            }
            if !leadership.still_held().await {
                tracing::warn!("reaper lost its leader connection");
                break;
            }
            pause(interval, shutdown).await;
        }
        metrics.leader.set(0);
        leadership.release().await;
        if config.once {
            return;
        }
    }
}
