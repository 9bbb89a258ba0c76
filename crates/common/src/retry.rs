//! Retry schedules, for everything tried again after a fault that heals (a lost
//! connection, a restart, a store that did not answer): growing delays from backon's
//! exponential backoff, bounded by a number of tries, by a budget (a job's within its
//! lease), or not at all (a reconnect loop), and a wait that a cancellation cuts short.

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The delays before each next try.
pub struct Delays(ExponentialBackoff);

impl Delays {
    fn grow(min: Duration, max: Duration) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(min)
            .with_max_delay(max)
    }

    /// Delays from `min` to `max`, spent once they add up to `budget`.
    pub fn within(min: Duration, max: Duration, budget: Duration) -> Delays {
        let builder = Self::grow(min, max)
            .with_total_delay(Some(budget))
            .without_max_times();
        Delays(builder.build())
    }

    /// Delays from `min` to `max` for `tries` tries in all (one delay fewer).
    pub fn tries(min: Duration, max: Duration, tries: usize) -> Delays {
        let builder = Self::grow(min, max).with_max_times(tries.saturating_sub(1));
        Delays(builder.build())
    }

    /// Delays from `min` to `max`, never spent.
    pub fn forever(min: Duration, max: Duration) -> Delays {
        Delays(Self::grow(min, max).without_max_times().build())
    }

    /// Sleeps the next delay and returns it; `None` at once when the schedule is spent
    /// or `stop` is cancelled, or when `stop` is cancelled during the sleep.
    pub async fn wait(&mut self, stop: &CancellationToken) -> Option<Duration> {
        let delay = self.0.next()?;
        if stop.is_cancelled() {
            return None;
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => Some(delay),
            _ = stop.cancelled() => None,
        }
    }
}

impl Iterator for Delays {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.0.next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tries_allow_one_delay_fewer_than_tries() {
        let ms = Duration::from_millis;
        assert_eq!(Delays::tries(ms(1), ms(2), 3).count(), 2);
        assert_eq!(Delays::tries(ms(1), ms(2), 1).count(), 0);
    }

    #[test]
    fn a_budget_bounds_the_sum_of_the_delays() {
        let ms = Duration::from_millis;
        let total: Duration = Delays::within(ms(10), ms(40), ms(100)).sum();
        assert!(total <= ms(100), "{total:?}");
        assert!(total >= ms(50), "{total:?}");
    }

    #[tokio::test]
    async fn a_cancelled_stop_ends_the_wait() {
        let stop = CancellationToken::new();
        stop.cancel();
        let mut delays = Delays::forever(Duration::from_secs(5), Duration::from_secs(5));
        assert_eq!(delays.wait(&stop).await, None);
    }
}
