//! Hosting sandboxes (the lifecycle seed): a placement delivery is claimed under the
//! sandbox's fenced lease, its tree acquired, and the sandbox then holds a worker slot
//! while it is `running`, carrying out its operations in order and what the API asks
//! of it (stop, destroy), until it stops, the worker drains, or the lease is lost.
//!
//! - [`tree`]: acquiring the tree and committing it (a receipt on a durable tree, or
//!   the stop snapshot).
//! - [`operation`]: one exec or file operation in the step sandbox, journaled.
//! - [`lifecycle`]: the moves its owner makes: running, stopped, destroyed, failed.
//! - [`fork`]: the sandboxes a fork provisions, and the identity a copy must not keep.
//! - [`volumes`]: placing the sandboxes whose volumes are on this worker's disk, and
//!   removing deleted volumes' data.

pub mod fork;
pub mod lifecycle;
pub mod operation;
mod staged;
pub mod tree;
pub mod volumes;

use crate::context::Worker;
use cairn_common::egress::{Effective, Layer, NetworkSpec};
use cairn_common::lease::{Lease, LeaseError};
use cairn_common::sandbox::{volume, SandboxState};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Why hosting a sandbox stopped short.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The lease is no longer this worker's: write nothing more.
    #[error(transparent)]
    Lost(LeaseError),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// A capture failed; nothing was committed.
    #[error("capture failed: {0}")]
    Capture(String),
    /// Something that heals (a store that did not answer): another placement may pass.
    #[error("{0}")]
    Transient(String),
}

impl From<cairn_common::request::Error> for HostError {
    /// A move the transition table refused: the sandbox moved under its owner (a writer
    /// outside the lease, or a bug); nothing was written.
    fn from(e: cairn_common::request::Error) -> Self {
        match e {
            cairn_common::request::Error::Db(e) => HostError::Db(e),
            refused => HostError::Capture(format!("the sandbox moved under its owner: {refused}")),
        }
    }
}

impl From<crate::custody::CustodyError> for HostError {
    fn from(e: crate::custody::CustodyError) -> Self {
        use crate::custody::CustodyError;
        match e {
            CustodyError::Lease(e) => e.into(),
            CustodyError::Db(e) => HostError::Db(e),
            CustodyError::CheckpointUnavailable(reason) => HostError::Transient(reason),
            CustodyError::CaptureFailed(reason) => HostError::Capture(reason),
            CustodyError::Workspace(e) => HostError::Capture(e.to_string()),
        }
    }
}

impl From<LeaseError> for HostError {
    fn from(e: LeaseError) -> Self {
        match e {
            LeaseError::Db(e) => HostError::Db(e),
            lost => HostError::Lost(lost),
        }
    }
}

/// The sandbox's row as its owner reads it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SandboxRow {
    pub id: Uuid,
    pub tenant_id: String,
    pub agent: String,
    pub state: SandboxState,
    pub desired: String,
    pub persistent: bool,
    pub repository: Option<String>,
    pub git_ref: Option<String>,
    pub source_snapshot_id: Option<Uuid>,
    pub workspace_id: Option<Uuid>,
    /// The room of its tree and of its home, in MiB.
    pub disk_mb: i32,
    /// Its network policy; `None`: the worker's default.
    pub network: Option<sqlx::types::Json<NetworkSpec>>,
    /// Its tenant's layer of the egress policy as it stood when the row was read
    /// (`None`: it narrows nothing).
    pub tenant_network: Option<sqlx::types::Json<NetworkSpec>>,
}

impl SandboxRow {
    /// The network its commands may have: the tenant's layer, then its own policy (else
    /// the worker's `default`), each only narrowing.
    pub fn effective_network(&self, default: bool) -> Effective {
        Effective::of(
            self.tenant_network.as_deref(),
            self.network.as_deref(),
            Layer::Sandbox,
            default,
        )
    }
}

impl SandboxRow {
    /// Whether a placement means work: a sandbox being created, or one asked to run
    /// again (a stopped one resumed, a paused one whose worker was lost).
    fn wants_placing(&self) -> bool {
        self.desired == "running"
            && matches!(
                self.state,
                SandboxState::Creating | SandboxState::Stopped | SandboxState::Paused
            )
    }
}

async fn read(pool: &sqlx::PgPool, id: Uuid) -> Result<Option<SandboxRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT id, tenant_id, agent, state, desired, persistent, repository, git_ref,
                source_snapshot_id, workspace_id, disk_mb, network, {} AS tenant_network
           FROM sandboxes WHERE id = $1",
        cairn_common::network_policy::of_tenant("tenant_id")
    ))
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// What a placement delivery came to.
pub enum Placement {
    /// Claimed: host it.
    Host(Box<(Lease, SandboxRow)>),
    /// Nothing to do (placed already, stopped meanwhile, destroyed): ack and drop.
    Dropped(&'static str),
}

/// Claims a placement: only a sandbox of the announced tenant that wants placing, and
/// only if no live owner holds it.
pub async fn claim(worker: &Worker, id: Uuid, tenant: &str) -> Result<Placement, HostError> {
    let Some(row) = read(&worker.pool, id).await? else {
        return Ok(Placement::Dropped("no such sandbox"));
    };
    if row.tenant_id != tenant {
        worker.metrics.tenant_mismatches.inc();
        return Ok(Placement::Dropped("the announcement names another tenant"));
    }
    if !row.wants_placing() {
        return Ok(Placement::Dropped("the sandbox needs no placement"));
    }
    // Its volumes' worker alone places it (see `volumes`).
    let bound = volume::directory_of(&mut *worker.pool.acquire().await?, id).await?;
    if bound.is_some_and(|d| d != worker.custody.directory.id) {
        return Ok(Placement::Dropped(
            "its volumes are on another worker's disk",
        ));
    }
    let leases = worker.leases.for_sandboxes();
    let Some(lease) = leases.claim(id, &worker.settings.worker_id).await? else {
        return Ok(Placement::Dropped("a live worker holds the sandbox"));
    };
    // Read again as its owner: it may have moved between the read and the claim.
    let row = match read(&worker.pool, id).await? {
        Some(row) if row.wants_placing() => row,
        _ => {
            leases.release(&lease).await?;
            return Ok(Placement::Dropped("the sandbox needs no placement"));
        }
    };
    Ok(Placement::Host(Box::new((lease, row))))
}

/// Hosts a claimed sandbox until it stops, is destroyed, the worker stops consuming
/// (`shutdown`: it is stopped, captured, for another worker to resume), or the lease
/// is lost.
#[tracing::instrument(skip_all, fields(sandbox_id = %lease.request_id.simple()))]
pub async fn host(
    worker: Arc<Worker>,
    lease: Lease,
    row: SandboxRow,
    shutdown: CancellationToken,
    drain: CancellationToken,
) {
    let id = row.id;
    worker.active.enter(id).await;
    let leases = worker.leases.for_sandboxes();
    let lost = CancellationToken::new();
    let renewal = crate::keeper::Renewal::new(worker.clone(), leases, lease.clone());
    let keeper = tokio::spawn(crate::keeper::keep_lease(renewal, lost.clone()));
    let host = lifecycle::Host {
        worker: worker.clone(),
        lease,
        row,
        lost: lost.clone(),
        session: None,
    };
    worker.metrics.sandboxes_hosted.inc();
    let ended = host.run(&shutdown, &drain).await;
    keeper.abort();
    let reason = match &ended {
        Ok(how) => *how,
        Err(HostError::Lost(_)) => "lease_lost",
        Err(_) => "error",
    };
    worker
        .metrics
        .sandbox_stops
        .get_or_create(&crate::metrics::ReasonLabel {
            reason: reason.to_string(),
        })
        .inc();
    // After its reason is counted: a reader that sees the slot free sees why.
    worker.metrics.sandboxes_hosted.dec();
    match &ended {
        Ok(how) => tracing::info!(how, "sandbox left this worker"),
        Err(HostError::Lost(e)) => {
            tracing::warn!(error = %e, "sandbox lease lost: this worker writes nothing more for it");
            worker.metrics.self_fenced.inc();
        }
        Err(e) => {
            tracing::warn!(error = %e, "sandbox hosting stopped; its lease lapses to the sweeper")
        }
    }
    worker.active.leave(id).await;
}

/// How often an idle sandbox looks for its next operation and what is asked of it.
const POLL: Duration = Duration::from_millis(25);
