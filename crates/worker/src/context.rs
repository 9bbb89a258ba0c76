//! What every job of this worker process shares: the database pool, the leases, the
//! settings, workspace custody, the metrics and the requests it runs.

use crate::custody::Custody;
use crate::janitor::ActiveRequests;
use crate::metrics::WorkerMetrics;
use cairn_common::lease::Leases;
use sqlx::PgPool;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Settings every job of this worker shares.
#[derive(Debug, Clone)]
pub struct JobSettings {
    pub worker_id: String,
    pub workspaces_dir: PathBuf,
    pub artifacts_dir: PathBuf,
    pub output_max_bytes: u64,
    pub output_tail_bytes: usize,
    /// Whether stored output has its secrets redacted.
    pub redact_output: bool,
    pub kill_grace: Duration,
    /// How long a pause may last before it behaves like a stop.
    pub pause_limit: Duration,
    /// Whether a draining worker hands runs back at step boundaries: only where other
    /// workers can restore its checkpoints.
    pub hand_back_at_step_boundary: bool,
    /// Sandboxes this worker hosts at once.
    pub sandbox_slots: u32,
}

/// The worker's shared services, which every job holds.
pub struct Worker {
    pub pool: PgPool,
    pub leases: Leases,
    pub settings: JobSettings,
    pub custody: Custody,
    pub metrics: WorkerMetrics,
    /// The step sandbox every process of a run starts in.
    pub isolation: crate::isolation::Isolation,
    /// Requests this process runs jobs for; the janitor never touches their trees.
    pub active: Arc<ActiveRequests>,
    /// Cancelled on SIGTERM: with shared snapshots, each run goes back to the queue at
    /// its next step boundary, so a worker scaled down or rolled finishes its steps but
    /// starts no more.
    pub draining: tokio_util::sync::CancellationToken,
    /// Wakes a job's keeper when its request's cancel or pause request changes.
    pub signals: Arc<crate::signals::Signals>,
    /// The hosted sandboxes whose ports previews reach.
    pub previews: Arc<crate::preview::Previews>,
    /// The running execs of hosted sandboxes: their input, terminal and kill.
    pub controls: Arc<crate::interactive::Controls>,
    /// Sandboxes for the sandbox consumer to place without the queue (`None`: this
    /// worker hosts none).
    pub placements: Option<tokio::sync::mpsc::Sender<(uuid::Uuid, String)>>,
}
