//! The lease keeper: renews a job's lease on its own task, every third of the TTL, so
//! job work never starves it ([`Renewal`], the one renewal of every job's lease). It stops the job when the lease is lost (self-fencing:
//! the step's process group is stopped and nothing more is written), when the run's
//! cancellation was requested and when the admitting continuation's window ends; it
//! also passes on pause and resume requests.

use crate::context::Worker;
use crate::signals::Subscription;
use cairn_common::lease::{Lease, LeaseError, Leases};
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

/// Why a lease is no longer kept.
pub enum Unkept {
    /// Its job let it go (it committed its outcome).
    Released,
    /// Lost: the job fences itself.
    Lost(String),
}

/// A lease kept alive, for any job (a run's, a sandbox's): renewed a full third of the
/// TTL after the last try, failed ones included; a database fault is tried again at the
/// next turn, and once the TTL has passed since the last renewal the holder fences
/// itself before asking anyone.
pub struct Renewal {
    worker: Arc<Worker>,
    leases: Leases,
    pub lease: Lease,
    interval: Duration,
    renewed_at: Instant,
    due: Instant,
}

impl Renewal {
    pub fn new(worker: Arc<Worker>, leases: Leases, lease: Lease) -> Renewal {
        let interval = (leases.ttl() / 3).max(Duration::from_millis(100));
        let now = Instant::now();
        Renewal {
            worker,
            leases,
            lease,
            interval,
            renewed_at: now,
            due: now + interval,
        }
    }

    /// When the next renewal is due.
    pub fn due(&self) -> Instant {
        self.due
    }

    /// Renews now, or says why the lease is no longer kept.
    pub async fn renew(&mut self) -> Result<(), Unkept> {
        self.due = Instant::now() + self.interval;
        if self.renewed_at.elapsed() >= self.leases.ttl() {
            return Err(Unkept::Lost(
                "the lease deadline passed without a renewal".into(),
            ));
        }
        match self.leases.renew(&mut self.lease).await {
            Ok(()) => {
                self.renewed_at = Instant::now();
                self.worker.metrics.leases_renewed.inc();
                Ok(())
            }
            Err(LeaseError::Db(e)) => {
                tracing::warn!(error = %e, id = %self.lease.request_id.simple(), "lease renewal failed; retrying until the deadline");
                Ok(())
            }
            // The job committed its outcome and let the lease go between this renewal's
            // start and the keeper's stop: that is not a loss.
            Err(_) if self.lease.released_by_holder(&self.worker.pool).await => {
                Err(Unkept::Released)
            }
            Err(e) => Err(Unkept::Lost(e.to_string())),
        }
    }
}

/// Keeps a lease with nothing else to watch (a sandbox's: its host reads what is
/// asked of it): `lost` is cancelled once the lease cannot be kept.
pub async fn keep_lease(mut renewal: Renewal, lost: CancellationToken) {
    loop {
        tokio::time::sleep_until(renewal.due().into()).await;
        if let Err(unkept) = renewal.renew().await {
            if let Unkept::Lost(why) = unkept {
                tracing::warn!(why, "lease lost; self-fencing");
                renewal.worker.metrics.leases_lost.inc();
            }
            lost.cancel();
            return;
        }
    }
}

async fn keep(worker: Arc<Worker>, lease: Lease, watch: Watch, done: CancellationToken) {
    let Watch {
        stop,
        reason,
        pause,
        window_ends_at,
        signals,
    } = watch;
    let mut renewal = Renewal::new(worker.clone(), worker.leases.clone(), lease);
    let interval = renewal.interval;
    loop {
        // Wake at the window's end too, so the step stops there, not a renewal later.
        let until_window = window_ends_at
            .and_then(|end| (end - Utc::now()).to_std().ok())
            .map(|left| left.max(Duration::from_millis(50)));
        let until_renewal = renewal.due().saturating_duration_since(Instant::now());
        let nap = until_window.map_or(until_renewal, |left| left.min(until_renewal));
        // A signal (a cancel or pause asked now) is read at once; the lease is renewed
        // on its own schedule.
        let signalled = tokio::select! {
            _ = tokio::time::sleep(nap) => false,
            _ = signals.wake.notified() => true,
            _ = done.cancelled() => return,
        };
        if !signalled || Instant::now() >= renewal.due() {
            if let Err(unkept) = renewal.renew().await {
                if let Unkept::Lost(why) = unkept {
                    lost(&worker, &stop, &reason, &why);
                }
                return;
            }
        }
        let request_id = renewal.lease.request_id;
        let asked = sqlx::query_as::<_, (bool, bool, bool)>(
            "SELECT cancel_requested_at IS NOT NULL, pause_requested_at IS NOT NULL,
                    COALESCE($2 <= now(), FALSE)
               FROM execution_requests WHERE id = $1",
        )
        .bind(request_id)
        .bind(window_ends_at)
        .fetch_one(&worker.pool);
        // Never past the next renewal: the deadline check must not wait on this read.
        let asked = tokio::time::timeout(interval, asked).await;
        let Ok(Ok((cancelled, paused, window_ended))) = asked else {
            continue;
        };
        pause.send_if_modified(|p| std::mem::replace(p, paused) != paused);
        if cancelled {
            tracing::info!(request_id = %request_id.simple(), "cancellation requested; stopping the step");
            reason.set(Reason::Cancelled);
            stop.cancel();
        } else if window_ended {
            tracing::info!(request_id = %request_id.simple(), "the continuation's window ended; stopping the step");
            reason.set(Reason::WindowEnded);
            stop.cancel();
        }
    }
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
