//! The overview sampler's loop: one leader at a time (its own advisory lock) records a
//! sample of the fleet ([`cairn_common::overview::record`]) just after each interval
//! ends, for the console's charts.

use cairn_common::leader::{pause, Leadership};
use cairn_common::overview;
use sqlx::PgPool;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The advisory lock key of the sampler's leader ("cairnovr").
const LEADER_LOCK: i64 = 0x6361_6972_6e6f_7672;

/// How long after an interval's end its sample is taken (a quarter of a short interval):
/// a run that ended just before the boundary has committed by then.
const SETTLE: Duration = Duration::from_secs(1);

/// Runs the sampler: competes for leadership, and records one sample per interval while
/// leader.
pub async fn run(pool: PgPool, interval_seconds: u32, shutdown: CancellationToken) {
    let interval = Duration::from_secs(u64::from(interval_seconds));
    let seconds = i32::try_from(interval_seconds).unwrap_or(10);
    while !shutdown.is_cancelled() {
        let Some(mut leadership) = Leadership::try_acquire(&pool, LEADER_LOCK).await else {
            pause(interval, &shutdown).await;
            continue;
        };
        tracing::info!("this scheduler leads the overview sampler");
        while !shutdown.is_cancelled() {
            pause(until_next(interval) + SETTLE.min(interval / 4), &shutdown).await;
            if shutdown.is_cancelled() {
                break;
            }
            if let Err(e) = overview::record(&pool, seconds).await {
                tracing::warn!(error = %e, "overview sample not recorded");
            }
            if !leadership.still_held().await {
                tracing::warn!("the overview sampler lost its leader connection");
                break;
            }
        }
        leadership.release().await;
    }
}

/// The time to the next multiple of `interval` since the epoch, by this host's clock
/// (the sample itself is aligned by the database's).
fn until_next(interval: Duration) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let step = interval.as_millis().max(1);
    let into = now.as_millis() % step;
    Duration::from_millis(u64::try_from(step - into).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_boundary_is_within_one_interval() {
        for secs in [1, 10, 300] {
            let interval = Duration::from_secs(secs);
            let wait = until_next(interval);
            assert!(wait > Duration::ZERO && wait <= interval, "{wait:?}");
        }
    }
}
