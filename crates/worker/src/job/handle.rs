//! A job's handle: the claimed request and everything that runs it owns, passed by
//! reference to whatever works on the job (the plan, a pause, a verification, its
//! ending), as a connection handler owns its connection.

use crate::context::Worker;
use crate::custody::Subject;
use crate::keeper::{Reason, StopReason};
use backon::{ExponentialBuilder, Retryable};
use cairn_common::lease::{Lease, LeaseError};
use cairn_common::request::Continuation;
use cairn_common::run::{JobKind, StepSpec};
use sqlx::{Postgres, Transaction};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How a delivery ended, for logs, metrics and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// Acked without work: a duplicate, a stale message, or a request another holds.
    Dropped(String),
    Completed,
    /// A retained report was accepted (final-outcome continuation); nothing ran.
    Accepted,
    AwaitingVerification,
    /// A verification's checks passed: its finishing round is queued.
    ChecksPassed,
    Failed(String),
    NeedsReconciliation(String),
    Cancelled,
    /// Drain (or an attempt that ended): the request went back to the queue.
    HandedBack,
    /// The lease was lost: nothing more was written.
    Fenced,
    /// Stopped at its checkpoint (a pause past its limit, an attempt that ended).
    StoppedAtCheckpoint,
}

/// A claimed request, ready to run.
pub struct Claimed {
    pub lease: Lease,
    pub kind: JobKind,
    /// The continuation action or verification adoption that admitted it.
    pub action_id: Option<Uuid>,
    /// The same, typed.
    pub continuation: Continuation,
    /// When the admitting continuation's window ends: the job stops there.
    pub window_ends_at: Option<chrono::DateTime<chrono::Utc>>,
    pub run_id: Uuid,
    pub attempt: i32,
    pub steps: Vec<StepSpec>,
    pub repository: Option<String>,
    pub git_ref: Option<String>,
    pub max_commands: i32,
    pub max_wall_ms: i64,
    pub used_commands: i32,
    pub used_wall_ms: i64,
    pub agent: String,
    pub work_context: Uuid,
    pub deadline: Option<chrono::DateTime<chrono::Utc>>,
    /// The tenant's layer of the egress policy as it stood at the claim (`None`: it
    /// narrows nothing).
    pub tenant_network: Option<cairn_common::egress::NetworkSpec>,
    /// Whether the request had a journaled intent when it was claimed. The lease keeps
    /// every other writer out of its journal, so without one its standings are empty.
    pub journaled: bool,
}

impl Claimed {
    /// What custody needs to know of the run.
    pub fn subject(&self) -> Subject {
        Subject {
            request_id: self.lease.request_id,
            run_id: self.run_id,
            work_context: self.work_context,
            agent: self.agent.clone(),
            repository: self.repository.clone(),
            git_ref: self.git_ref.clone(),
            deadline: self.deadline,
        }
    }
}

/// A running job: its claim, the worker's services, and the signals that stop or pause
/// it (driven by its lease keeper and the worker's drain).
pub struct Job {
    pub worker: Arc<Worker>,
    pub claimed: Claimed,
    /// Cancelled when the job must stop (see [`Job::cause`]).
    pub stop: CancellationToken,
    cause: Arc<StopReason>,
    /// Whether a pause is requested now (the keeper passes it on).
    pause: watch::Receiver<bool>,
}

impl Job {
    pub fn new(
        worker: Arc<Worker>,
        claimed: Claimed,
        stop: CancellationToken,
        cause: Arc<StopReason>,
        pause: watch::Receiver<bool>,
    ) -> Job {
        Job {
            worker,
            claimed,
            stop,
            cause,
            pause,
        }
    }

    pub fn lease(&self) -> &Lease {
        &self.claimed.lease
    }

    pub fn request_id(&self) -> Uuid {
        self.claimed.lease.request_id
    }

    /// Whether the job was told to stop.
    pub fn stopped(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Why it was stopped, if it was.
    pub fn cause(&self) -> Option<Reason> {
        self.cause.get()
    }

    /// At a boundary (between steps, or checks): on a drain, where other workers can
    /// restore this worker's checkpoints, stops the job here, to go back to the queue.
    pub fn stop_if_draining(&self) {
        let settings = &self.worker.settings;
        if settings.hand_back_at_step_boundary && self.worker.draining.is_cancelled() {
            self.stop_for(Reason::Drain);
        }
    }

    /// Stops the job for `reason` (the first reason given wins).
    pub fn stop_for(&self, reason: Reason) {
        self.cause.set(reason);
        self.stop.cancel();
    }

    /// A watch of the pause request, for waiting on it.
    pub fn pause_requests(&self) -> watch::Receiver<bool> {
        self.pause.clone()
    }

    /// A transaction fenced by the job's lease: every durable write of the job. A
    /// database fault on the way (a pool timeout, a lost connection) is transient: it is
    /// retried for up to one lease TTL unless the keeper fenced the job meanwhile. Only
    /// a refused fence means the lease is lost.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, LeaseError> {
        let policy = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(2))
            .with_total_delay(Some(self.worker.leases.ttl()))
            .without_max_times();
        (|| self.claimed.lease.begin_fenced(&self.worker.pool))
            .retry(policy)
            .when(|e| matches!(e, LeaseError::Db(_)) && self.cause() != Some(Reason::Fenced))
            .notify(|e, wait| {
                tracing::warn!(error = %e, ?wait, "a durable write could not start; retrying within the lease")
            })
            .await
    }
}
