//! The flow-control gate's loop: one leader at a time (its own advisory lock) runs a
//! pass ([`cairn_common::request::gate::pass`]) every interval, and publishes how each
//! key stands as metrics about once a second.

use cairn_common::leader::{pause, Leadership};
use cairn_common::request::gate;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sqlx::PgPool;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The advisory lock key of the gate's leader ("cairngat").
const LEADER_LOCK: i64 = 0x6361_6972_6e67_6174;

/// The most held requests one pass looks at.
const BATCH: i64 = 500;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyLabels {
    pub tenant: String,
    pub key: String,
    /// `concurrency` or `rate`.
    pub kind: String,
}

#[derive(Clone, Default)]
pub struct GateMetrics {
    pub released: Counter,
    pub waiting: Family<KeyLabels, Gauge>,
    pub in_flight: Family<KeyLabels, Gauge>,
}

impl GateMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        cairn_common::register_metrics!(registry;
            "gate_released", "Runs the flow-control gate released to the workers" => m.released;
            "flow_waiting", "Runs held by flow control, per key" => m.waiting;
            "flow_in_flight", "Runs of a concurrency key out of the gate and not ended, or of a rate key released in the last second" => m.in_flight;
        );
        m
    }

    /// Sets the per-key gauges from the standings (the 100 keys with the most waiting, so
    /// the series stay bounded); keys no longer listed are dropped.
    fn show(&self, standings: &[gate::KeyStanding]) {
        self.waiting.clear();
        self.in_flight.clear();
        for s in standings {
            let labels = KeyLabels {
                tenant: s.tenant.clone(),
                key: s.key.clone(),
                kind: s.kind.clone(),
            };
            self.waiting.get_or_create(&labels).set(s.waiting);
            self.in_flight.get_or_create(&labels).set(s.in_flight);
        }
    }
}

/// Runs the gate: competes for leadership, and passes every `interval` while leader.
pub async fn run(
    pool: PgPool,
    interval: Duration,
    metrics: GateMetrics,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        let Some(mut leadership) = Leadership::try_acquire(&pool, LEADER_LOCK).await else {
            pause(interval.max(Duration::from_secs(1)), &shutdown).await;
            continue;
        };
        tracing::info!("this scheduler leads the flow-control gate");
        let mut shown = Instant::now() - Duration::from_secs(1);
        while !shutdown.is_cancelled() {
            match pass_once(&pool).await {
                Ok(pass) => {
                    metrics.released.inc_by(pass.released as u64);
                }
                Err(e) => tracing::warn!(error = %e, "gate pass failed"),
            }
            if shown.elapsed() >= Duration::from_secs(1) {
                shown = Instant::now();
                match standings(&pool).await {
                    Ok(s) => metrics.show(&s),
                    Err(e) => tracing::warn!(error = %e, "flow-control standings not read"),
                }
                if !leadership.still_held().await {
                    tracing::warn!("the gate lost its leader connection");
                    break;
                }
            }
            pause(interval, &shutdown).await;
        }
        leadership.release().await;
    }
}

async fn pass_once(pool: &PgPool) -> Result<gate::Pass, sqlx::Error> {
    if !gate::anything_held(&mut *pool.acquire().await?).await? {
        return Ok(gate::Pass::default());
    }
    let mut tx = pool.begin().await?;
    let pass = gate::pass(&mut tx, BATCH).await?;
    tx.commit().await?;
    if pass.released > 0 {
        tracing::debug!(
            released = pass.released,
            waiting = pass.waiting,
            "gate released runs"
        );
    }
    Ok(pass)
}

async fn standings(pool: &PgPool) -> Result<Vec<gate::KeyStanding>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    gate::standings(&mut conn).await
}
