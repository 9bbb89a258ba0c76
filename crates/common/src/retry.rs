//! Retry schedules, for everything tried again after a fault that heals (a lost
//! connection, a restart, a store that did not answer): growing delays from backon's
//! exponential backoff, bounded by a number of tries, by a budget (a job's within its
//! lease), or not at all (a reconnect loop), and a wait that a cancellation cuts short;
//! and the one rule for writing again after a fault hid whether a write landed.

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use std::fmt::Display;
use std::future::Future;
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

/// Runs `write` until it lands, through the faults `transient` names. Such a fault may
/// hide a commit that landed, so `landed` reads back whether it did (`Some` with its
/// result), and is asked again until it answers: the write is tried again only once it
/// reads back as not landed. An intent or a receipt charges its command or its time, so
/// one that landed must not be written twice. Gives the write's error back once
/// `delays` are spent, or when `give_up` says so before a wait.
pub async fn until_landed<T, E, W, WF, L, LF, LE>(
    mut delays: Delays,
    what: &str,
    (transient, give_up): (impl Fn(&E) -> bool, impl Fn() -> bool),
    mut write: W,
    mut landed: L,
) -> Result<T, E>
where
    E: Display,
    W: FnMut() -> WF,
    WF: Future<Output = Result<T, E>>,
    L: FnMut() -> LF,
    LF: Future<Output = Result<Option<T>, LE>>,
    LE: Display,
{
    loop {
        let error = match write().await {
            Err(e) if transient(&e) => e,
            other => return other,
        };
        match read_back(&mut delays, what, &give_up, &mut landed).await {
            Some(Some(value)) => return Ok(value),
            Some(None) => {}
            None => return Err(error),
        }
        let Some(delay) = delays.next().filter(|_| !give_up()) else {
            return Err(error);
        };
        tracing::warn!(error = %error, ?delay, what, "a durable write did not land; writing it again");
        tokio::time::sleep(delay).await;
    }
}

/// Asks `landed` whether a write whose reply a fault hid landed, until it answers:
/// `Some(answer)`, or `None` once `delays` are spent or `give_up` says so first. An
/// unanswered read-back says nothing, so it is never taken as "not landed".
pub async fn read_back<T, L, LF, LE>(
    delays: &mut Delays,
    what: &str,
    give_up: &impl Fn() -> bool,
    landed: &mut L,
) -> Option<Option<T>>
where
    L: FnMut() -> LF,
    LF: Future<Output = Result<Option<T>, LE>>,
    LE: Display,
{
    loop {
        let error = match landed().await {
            Ok(answer) => return Some(answer),
            Err(e) => e,
        };
        let delay = delays.next().filter(|_| !give_up())?;
        tracing::warn!(error = %error, ?delay, what, "could not read back whether a write landed; asking again");
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

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

    /// A store whose writes all land, and whose read-backs fail `unanswered` times
    /// before they answer: how often `until_landed` wrote, and what it returned.
    async fn landed_with_a_lost_reply(
        unanswered: u32,
        lost_replies: u32,
    ) -> (u32, Result<u32, String>) {
        let ms = Duration::from_millis;
        let (writes, asked) = (Cell::new(0), Cell::new(0));
        let write = || async {
            writes.set(writes.get() + 1);
            match writes.get() <= lost_replies {
                true => Err("connection reset".to_string()),
                false => Ok(writes.get()),
            }
        };
        let landed = || async {
            asked.set(asked.get() + 1);
            match asked.get() <= unanswered {
                true => Err("connection refused"),
                false => Ok(Some(writes.get())),
            }
        };
        let delays = Delays::within(ms(1), ms(2), ms(200));
        let rule = (|_: &String| true, || false);
        let result = until_landed(delays, "a test write", rule, write, landed).await;
        (writes.get(), result)
    }

    #[tokio::test]
    async fn a_write_is_not_written_again_while_its_read_back_is_unanswered() {
        let (writes, result) = landed_with_a_lost_reply(3, 1).await;
        assert_eq!(writes, 1, "a write that landed was written again");
        assert_eq!(result, Ok(1));
    }

    #[tokio::test]
    async fn a_write_that_reads_back_as_not_landed_is_written_again() {
        let ms = Duration::from_millis;
        let writes = Cell::new(0);
        let write = || async {
            writes.set(writes.get() + 1);
            match writes.get() {
                1 => Err("connection reset".to_string()),
                n => Ok(n),
            }
        };
        let landed = || async { Ok::<_, String>(None) };
        let delays = Delays::within(ms(1), ms(2), ms(200));
        let rule = (|_: &String| true, || false);
        let result = until_landed(delays, "a test write", rule, write, landed).await;
        assert_eq!((writes.get(), result), (2, Ok(2)));
    }

    #[tokio::test]
    async fn a_read_back_that_never_answers_gives_the_writes_error_back() {
        let (writes, result) = landed_with_a_lost_reply(u32::MAX, 1).await;
        assert_eq!((writes, result), (1, Err("connection reset".to_string())));
    }

    #[tokio::test]
    async fn a_fault_that_is_not_transient_is_not_read_back() {
        let ms = Duration::from_millis;
        let asked = Cell::new(0);
        let write = || async { Err::<u32, _>("constraint violated".to_string()) };
        let landed = || async {
            asked.set(asked.get() + 1);
            Ok::<_, String>(Some(1))
        };
        let delays = Delays::within(ms(1), ms(2), ms(200));
        let rule = (|e: &String| e.contains("connection"), || false);
        let result = until_landed(delays, "a test write", rule, write, landed).await;
        assert_eq!(result, Err("constraint violated".to_string()));
        assert_eq!(asked.get(), 0);
    }

    #[tokio::test]
    async fn giving_up_ends_the_read_back() {
        let ms = Duration::from_millis;
        let mut delays = Delays::within(ms(1), ms(2), ms(200));
        let mut landed = || async { Err::<Option<u32>, _>("connection refused") };
        let answer = read_back(&mut delays, "a test write", &|| true, &mut landed).await;
        assert_eq!(answer, None);
    }
}
