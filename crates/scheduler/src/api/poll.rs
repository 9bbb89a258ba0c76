//! Long polls: a route that waits for a worker (a sandbox's move, an operation's
//! receipt, a run's pause) reads the record until it is done or the caller's wait has
//! passed, then answers with what it read last.

use super::error::ApiError;
use std::future::Future;
use std::time::Duration;

/// Reads with `read` every `every` until `done` holds of what it read, or `wait` has
/// passed; returns the last read and whether it was done.
pub async fn until<T, R, F>(
    wait: Duration,
    every: Duration,
    mut read: R,
    done: impl Fn(&T) -> bool,
) -> Result<(T, bool), ApiError>
where
    R: FnMut() -> F,
    F: Future<Output = Result<T, ApiError>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let current = read().await?;
        if done(&current) {
            return Ok((current, true));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok((current, false));
        }
        tokio::time::sleep(every).await;
    }
}
