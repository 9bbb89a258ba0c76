//! The lease keeper: renews a job's lease on its own task, every third of the TTL, so
//! job work never starves it. It stops the job when the lease is lost (self-fencing:
//! the step's process group is stopped and nothing more is written), when the run's
//! cancellation was requested and when the admitting continuation's window ends; it
//! also passes on pause and resume requests.

use crate::context::Worker;
use crate::signals::Subscription;
use cairn_common::lease::{Lease, LeaseError};
use chrono::{DateTime, Utc};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Why a job was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Fenced,
    Cancelled,
    Drain,
    /// Paused past the pause limit: it stops like a stop.
    PauseExpired,
    /// The admitting continuation's window ended: the step stops and the request stops
    /// at its checkpoint.
    WindowEnded,
}

/// The first reason a job was stopped for.
#[derive(Debug, Default)]
pub struct StopReason(AtomicU8);

impl StopReason {
    pub fn set(&self, reason: Reason) {
        let code = match reason {
            Reason::Fenced => 1,
            Reason::Cancelled => 2,
            Reason::Drain => 3,
            Reason::PauseExpired => 4,
            Reason::WindowEnded => 5,
        };
        let _ = self
            .0
            .compare_exchange(0, code, Ordering::SeqCst, Ordering::SeqCst);
    }

    pub fn get(&self) -> Option<Reason> {
        match self.0.load(Ordering::SeqCst) {
            1 => Some(Reason::Fenced),
            2 => Some(Reason::Cancelled),
            3 => Some(Reason::Drain),
            4 => Some(Reason::PauseExpired),
            5 => Some(Reason::WindowEnded),
            _ => None,
        }
    }
}

pub struct Keeper {
    done: CancellationToken,
    task: JoinHandle<()>,
}

impl Keeper {
    pub async fn stop(self) {
        self.done.cancel();
        let _ = self.task.await;
    }
}

/// What the keeper watches besides the lease.
pub struct Watch {
    pub stop: CancellationToken,
    pub reason: Arc<StopReason>,
    pub pause: watch::Sender<bool>,
    /// When the admitting continuation's window ends.
    pub window_ends_at: Option<DateTime<Utc>>,
    /// Wakes the keeper when the request's cancel or pause request changes.
    pub signals: Subscription,
}

pub fn spawn(worker: Arc<Worker>, lease: Lease, watch: Watch) -> Keeper {
    let done = CancellationToken::new();
    let task = tokio::spawn(keep(worker, lease, watch, done.clone()));
    Keeper { done, task }
}

async fn keep(worker: Arc<Worker>, mut lease: Lease, watch: Watch, done: CancellationToken) {
    let Watch {
        stop,
        reason,
        pause,
        window_ends_at,
        signals,
    } = watch;
    let ttl = worker.leases.ttl();
    let interval = (ttl / 3).max(Duration::from_millis(100));
    let mut renewed_at = Instant::now();
    // The next renewal, a full interval after the last try, failed ones included.
    let mut renew_at = renewed_at + interval;
    loop {
        // Wake at the window's end too, so the step stops there, not a renewal later.
        let until_window = window_ends_at
            .and_then(|end| (end - Utc::now()).to_std().ok())
            .map(|left| left.max(Duration::from_millis(50)));
        let until_renewal = renew_at.saturating_duration_since(Instant::now());
        let nap = until_window.map_or(until_renewal, |left| left.min(until_renewal));
        // A signal (a cancel or pause asked now) is read at once; the lease is renewed
        // on its own schedule.
        let signalled = tokio::select! {
            _ = tokio::time::sleep(nap) => false,
            _ = signals.wake.notified() => true,
            _ = done.cancelled() => return,
        };
        if !signalled || Instant::now() >= renew_at {
            renew_at = Instant::now() + interval;
            // Past the deadline without a renewal: fence ourselves before asking anyone.
            if renewed_at.elapsed() >= ttl {
                lost(
                    &worker,
                    &stop,
                    &reason,
                    "the lease deadline passed without a renewal",
                );
                return;
            }
            match worker.leases.renew(&mut lease).await {
                Ok(()) => {
                    renewed_at = Instant::now();
                    worker.metrics.leases_renewed.inc();
                }
                Err(LeaseError::Db(e)) => {
                    tracing::warn!(error = %e, request_id = %lease.request_id.simple(), "lease renewal failed; retrying until the deadline");
                    continue;
                }
                Err(e) => {
                    // The job committed its outcome and let the lease go between this
                    // renewal's start and the keeper's stop: that is not a loss.
                    if !released_by_its_job(&worker, &lease).await {
                        lost(&worker, &stop, &reason, &e.to_string());
                    }
                    return;
                }
            }
        }
        let asked = sqlx::query_as::<_, (bool, bool, bool)>(
            "SELECT cancel_requested_at IS NOT NULL, pause_requested_at IS NOT NULL,
                    COALESCE($2 <= now(), FALSE)
               FROM execution_requests WHERE id = $1",
        )
        .bind(lease.request_id)
        .bind(window_ends_at)
        .fetch_one(&worker.pool);
        // Never past the next renewal: the deadline check must not wait on this read.
        let asked = tokio::time::timeout(interval, asked).await;
        let Ok(Ok((cancelled, paused, window_ended))) = asked else {
            continue;
        };
        pause.send_if_modified(|p| std::mem::replace(p, paused) != paused);
        if cancelled {
            tracing::info!(request_id = %lease.request_id.simple(), "cancellation requested; stopping the step");
            reason.set(Reason::Cancelled);
            stop.cancel();
        } else if window_ended {
            tracing::info!(request_id = %lease.request_id.simple(), "the continuation's window ended; stopping the step");
            reason.set(Reason::WindowEnded);
            stop.cancel();
        }
    }
}

/// Whether the request's lease was let go by its own holder: same epoch, no owner
/// (a takeover or a fence moves the epoch).
async fn released_by_its_job(worker: &Worker, lease: &Lease) -> bool {
    let released: Result<Option<bool>, _> = sqlx::query_scalar(
        "SELECT lease_epoch = $2 AND lease_owner IS NULL FROM execution_requests WHERE id = $1",
    )
    .bind(lease.request_id)
    .bind(lease.epoch)
    .fetch_optional(&worker.pool)
    .await;
    matches!(released, Ok(Some(true)))
}

fn lost(worker: &Worker, stop: &CancellationToken, reason: &StopReason, why: &str) {
    tracing::warn!(
        why,
        "lease lost; self-fencing: stopping the step and writing nothing more"
    );
    worker.metrics.leases_lost.inc();
    reason.set(Reason::Fenced);
    stop.cancel();
}
