//! Custody of a request's workspace: how its tree is acquired, committed and released.
//!
//! **Acquisition** ([`acquire`]) tries the tiers in order: (1) adopt a still-held tree of
//! the same task in this worker's directory, only if that tree is at the lineage head;
//! (2) restore the same work context's current checkpoint; (3) restore an eligible clean
//! baseline; (4) cold start. No tier ever selects another work context's checkpoint.
//! Every tier yields a tree *at* a known point of the lineage: the snapshot it was
//! restored from or adopted at, or none (baseline, cold). The journal reuses a receipt
//! only on a tree that holds its snapshot ([`cairn_common::journal::standings`]).
//!
//! **One durable fact per job** ([`commit`]): a run's step, a sandbox's operation, stop,
//! snapshot or fork commits its seal with the capture of its tree. A step's tree is
//! captured under a durable hold ([`checkpoint`]), then the receipt, the snapshot's `ready` and its lineage append commit in one
//! fenced transaction. A worker killed before that commit leaves an intent without a
//! receipt. A step that changed nothing commits its receipt on the snapshot the tree is
//! already at, writing no pack. A capture that keeps failing is retried within the
//! lease, then the attempt ends with no receipt (the tree stays held).
//!
//! **Capture-before-release** ([`release`]): a tree holding uncaptured work stays, held,
//! for a successor of the same task; a hold moves with an adopted tree. A failed step's
//! tree is kept for inspection only ([`inspection`]).

mod acquire;
mod checkpoint;
mod commit;
mod inspection;
mod release;

pub(crate) use acquire::Restore;
pub use acquire::{NoOpening, Opened, Opening};
pub use checkpoint::{Checkpoint, Commit, Committed, Completion, NoCompletion};
pub use commit::{Capture, NoSeal, Seal, TreeAfter, TreeAt};
pub use release::Release;

use crate::directory::Directory;
use crate::workspace::{self, Workspace};
use cairn_common::hold::HoldLimits;
use cairn_common::lease::LeaseError;
pub use cairn_common::lineage::Tier;
use cairn_common::retry::Delays;
use cairn_snapshot::{CaptureRules, Manifest, Repository};
use serde_json::Value;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Settings of workspace custody on this worker.
#[derive(Debug, Clone)]
pub struct CustodySettings {
    /// Where checkpoints and baselines are captured to.
    pub store: Repository,
    /// The store's identity, recorded on every snapshot captured to it.
    pub store_id: Uuid,
    /// Name of this workspace backend (part of the baseline key).
    pub backend: String,
    /// Whether trees survive a stop here (14-day holds) or not (1-hour handoff).
    pub persistent: bool,
    pub base_image: Option<String>,
    pub rules: CaptureRules,
    pub hold_limits: HoldLimits,
    /// How long a step's failing capture is retried before its attempt ends.
    pub capture_retry: Duration,
    /// How long a durable write of custody is retried through database faults: the
    /// lease's TTL.
    pub write_retry: Duration,
    /// This worker's id, recorded on the trees it creates.
    pub worker_id: String,
    /// The node this worker runs on, recorded on every snapshot it writes (none: its
    /// snapshots are never called off-host).
    pub node: Option<String>,
}

/// Custody of every workspace in this worker's directory.
pub struct Custody {
    pub pool: PgPool,
    pub settings: CustodySettings,
    pub directory: Directory,
    /// The volume trees are made on.
    pub disk: crate::disk::Disk,
    /// The room of each run's tree and of its home, in MiB.
    pub run_disk_mb: u64,
}

/// What the job knows about its run for custody.
#[derive(Debug, Clone)]
pub struct Subject {
    pub request_id: Uuid,
    pub run_id: Uuid,
    /// The work context: the task id across automatic attempts and continuations.
    pub work_context: Uuid,
    pub agent: String,
    pub repository: Option<String>,
    pub git_ref: Option<String>,
    pub deadline: Option<chrono::DateTime<chrono::Utc>>,
}

/// A workspace and where it stands in its lineage: what every job's commit reads and
/// moves. A run's [`Tree`] and a sandbox's tree each hold one.
pub struct LiveTree {
    pub workspace: Workspace,
    pub workspace_id: Uuid,
    /// The snapshot this tree is at: restored from, adopted at, or last committed. Its
    /// captured state is a prefix of the live tree; `None` for a baseline or cold tree.
    pub position: Option<Uuid>,
    /// The stat index of the tree as last captured or restored, when known: the next
    /// capture reads only what changed, and a tree unchanged from its position needs
    /// no capture at all.
    pub index: Option<Arc<Manifest>>,
    /// Whether the live tree may hold work `position` lacks.
    pub uncaptured: bool,
}

impl CustodySettings {
    /// The delays between a durable write's (or a read-back's) tries: growing, for up to
    /// `write_retry`.
    pub fn write_delays(&self) -> Delays {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(2));
        Delays::within(min, max, self.write_retry)
    }
}

impl LiveTree {
    /// The tree as a commit takes it. `index_is_position`: whether `index` is the
    /// position's own, so an unchanged tree may stand on the position.
    pub fn at(&mut self, index_is_position: bool) -> TreeAt<'_> {
        TreeAt {
            root: &self.workspace.root,
            workspace_id: Some(self.workspace_id),
            position: &mut self.position,
            index: &mut self.index,
            uncaptured: &mut self.uncaptured,
            index_is_position,
        }
    }

    /// The tree after a commit that a read-back found landed: it is at `snapshot`, whose
    /// index this process never got back.
    pub fn moved_to(&mut self, snapshot: Uuid) {
        self.position = Some(snapshot);
        self.index = None;
        self.uncaptured = false;
    }
}

/// A run's workspace in use.
pub struct Tree {
    pub live: LiveTree,
    pub tier: Tier,
    pub resume_context: Value,
}

#[derive(Debug, thiserror::Error)]
pub enum CustodyError {
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Workspace(#[from] workspace::WorkspaceError),
    /// The current checkpoint can be restored but not now (its store did not answer):
    /// falling back would leave the tree behind the journal, so the attempt ends.
    #[error("the current checkpoint could not be read: {0}")]
    CheckpointUnavailable(String),
    /// A step's capture kept failing within the lease: no receipt was written.
    #[error("the step's effects could not be captured: {0}")]
    CaptureFailed(String),
}

impl CustodyError {
    /// A database fault (a lost connection, a restart, a pool timeout): it heals, and
    /// says nothing about who owns the lease.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            CustodyError::Db(_) | CustodyError::Lease(LeaseError::Db(_))
        )
    }

    /// Whether this ends the attempt without the lease being lost (the request is
    /// handed on), as opposed to a lost lease or a database failure.
    pub fn ends_attempt(&self) -> Option<&'static str> {
        match self {
            CustodyError::CheckpointUnavailable(_) => Some("checkpoint_unavailable"),
            CustodyError::CaptureFailed(_) => Some("capture_failed"),
            _ => None,
        }
    }
}

/// Marks a tree paused (its processes stopped) or running again.
pub async fn set_paused(
    conn: &mut sqlx::PgConnection,
    tree: &Tree,
    paused: bool,
) -> Result<(), sqlx::Error> {
    cairn_common::workspace::set_paused(conn, tree.live.workspace_id, paused).await
}
