//! A sandbox's tree on this worker: acquired from its last durable tree (the newer of
//! its stop snapshot and its lineage head), from its source snapshot, or cold; and
//! committed: an operation's receipt with the checkpoint holding its effects
//! (invariant 9), or the stop snapshot.
//!
//! The sandbox keeps one `workspaces` row for its life, moved to whichever worker runs
//! it (no directory while it is stopped), so the reaper's sandbox rules (the latest
//! stop snapshot kept, the rest after the grace of a destroy) see one workspace.

use super::{HostError, SandboxRow};
use crate::context::Worker;
use crate::custody::{self, Capture, Checkpoint, LiveTree, Restore};
use crate::workspace::{self, Workspace};
use cairn_common::hold::{self, HoldTarget};
use cairn_common::lease::Lease;
use cairn_common::lineage::CapturedBy;
use cairn_common::sandbox::{operations, owner, ForkSpec};
use cairn_common::workspace as workspace_row;
use cairn_snapshot::Manifest;
use serde_json::Value;
use sqlx::PgConnection;
use std::sync::Arc;
use uuid::Uuid;

/// How long a running sandbox's tree is held on this worker at most (the hold ends
/// when it stops); the same bound as any held tree.
const HOLD_DAYS: i64 = 14;

pub struct SandboxTree {
    pub live: LiveTree,
    /// Where it came from: `stop_snapshot`, `checkpoint`, `source` (restored from
    /// another's snapshot), `staged` (a fork's, from its source's tree staged here),
    /// `cold`.
    pub origin: &'static str,
}

/// Why a tree could not be acquired.
pub enum Unacquired {
    /// For good: the sandbox fails (`creating`) or stays stopped with this reason.
    Failed(String),
    Host(HostError),
}

impl From<HostError> for Unacquired {
    fn from(e: HostError) -> Self {
        Unacquired::Host(e)
    }
}

impl From<sqlx::Error> for Unacquired {
    fn from(e: sqlx::Error) -> Self {
        Unacquired::Host(HostError::Db(e))
    }
}

/// Acquires the sandbox's tree in this worker's directory.
pub async fn acquire(worker: &Worker, row: &SandboxRow) -> Result<SandboxTree, Unacquired> {
    let quota_mb = u64::try_from(row.disk_mb).unwrap_or(1).max(1);
    let workspace = Workspace::for_request(&worker.custody.disk, row.id, quota_mb);
    workspace
        .reset()
        .await
        .map_err(|e| Unacquired::Failed(format!("preparing the tree: {e}")))?;
    let (head, stop, source) = durable_trees(worker, row).await?;
    let position = head.as_ref().map(|h| h.0);
    // The newer of the two is the last durable tree: a stop snapshot holds everything
    // its lineage head did (every operation commits before the stop).
    let newest = match (&head, &stop) {
        (Some(h), Some(s)) if s.2 >= h.2 => Some((s, "stop_snapshot")),
        (Some(h), _) => Some((h, "checkpoint")),
        (None, Some(s)) => Some((s, "stop_snapshot")),
        (None, None) => None,
    };
    if let Some((durable, origin)) = newest {
        let index = restore(worker, restorable(durable), &workspace).await?;
        return Ok(SandboxTree {
            live: LiveTree {
                workspace,
                workspace_id: row.workspace_id.unwrap_or_else(Uuid::new_v4),
                position,
                uncaptured: origin != "checkpoint",
                index: Some(Arc::new(index)),
            },
            origin,
        });
    }
    if let Some((id, store_url, status, recorded)) = source {
        if status != "ready" {
            return Err(Unacquired::Failed(format!(
                "the source snapshot is {status}; only a ready snapshot is restored"
            )));
        }
        let staged = (id, store_url.as_str(), recorded.as_deref());
        let (index, origin) = match from_staged(worker, staged, &workspace).await? {
            Some(index) => (index, "staged"),
            None => (restore(worker, staged, &workspace).await?, "source"),
        };
        return Ok(SandboxTree {
            live: LiveTree {
                workspace,
                workspace_id: row.workspace_id.unwrap_or_else(Uuid::new_v4),
                position: None,
                // The tree's own stats: its first capture reads only what changed (the
                // identity files the scrub removes), not the whole tree.
                index: Some(Arc::new(index)),
                uncaptured: true,
            },
            origin,
        });
    }
    workspace::cold(
        &workspace,
        row.repository.as_deref(),
        row.git_ref.as_deref(),
    )
    .await
    .map_err(|e| Unacquired::Failed(format!("preparing the tree: {e}")))?;
    Ok(SandboxTree {
        live: LiveTree {
            workspace,
            workspace_id: row.workspace_id.unwrap_or_else(Uuid::new_v4),
            position: None,
            index: None,
            uncaptured: true,
        },
        origin: "cold",
    })
}

/// A snapshot a sandbox's tree may come from: its id, store, time and the manifest key
/// its record names.
type Durable = (Uuid, String, chrono::DateTime<chrono::Utc>, Option<String>);

/// What a restore needs of a durable tree: its id, store and manifest key.
fn restorable(durable: &Durable) -> (Uuid, &str, Option<&str>) {
    let (id, store_url, _, recorded) = durable;
    (*id, store_url, recorded.as_deref())
}

/// A sandbox's source snapshot: its id, store, status and the manifest key its record
/// names.
type Source = (Uuid, String, String, Option<String>);

/// The sandbox's lineage head and stop snapshot (ready and current), and its source
/// snapshot with its status.
async fn durable_trees(
    worker: &Worker,
    row: &SandboxRow,
) -> Result<(Option<Durable>, Option<Durable>, Option<Source>), sqlx::Error> {
    let mut conn = worker.pool.acquire().await?;
    let head: Option<Durable> = sqlx::query_as(
        "SELECT s.id, s.store_url, s.created_at, s.manifest_key
           FROM lineage_heads h JOIN project_snapshots s ON s.id = h.head_id
          WHERE h.work_context_id = $1 AND h.retired_at IS NULL AND s.status = 'ready'
            AND s.retention = 'current'",
    )
    .bind(row.id)
    .fetch_optional(&mut *conn)
    .await?;
    let stop: Option<Durable> = sqlx::query_as(
        "SELECT s.id, s.store_url, s.created_at, s.manifest_key
           FROM sandboxes b JOIN project_snapshots s ON s.id = b.stop_snapshot_id
          WHERE b.id = $1 AND s.status = 'ready' AND s.retention = 'current'",
    )
    .bind(row.id)
    .fetch_optional(&mut *conn)
    .await?;
    let source: Option<Source> = match row.source_snapshot_id {
        Some(id) => {
            sqlx::query_as(&format!(
                "SELECT p.id, p.store_url, CASE WHEN {kept} THEN p.status ELSE 'deleted' END,
                        p.manifest_key
                   FROM project_snapshots p WHERE p.id = $1",
                kept = cairn_common::lineage::RESTORABLE_SOURCE,
            ))
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?
        }
        None => None,
    };
    Ok((head, stop, source))
}

/// The tree of a fork's capture staged on this worker's disk, made this sandbox's tree
/// as a copy-on-write snapshot of it (no restore): the capture's manifest is its index
/// (a snapshot keeps every file's inode and times), and what the capture left out is
/// removed from it. `None` when nothing is staged here, or it could not be used.
async fn from_staged(
    worker: &Worker,
    (id, store_url, recorded): (Uuid, &str, Option<&str>),
    workspace: &Workspace,
) -> Result<Option<Manifest>, Unacquired> {
    let disk = worker.custody.disk.clone();
    let (root, quota) = (workspace.root.clone(), workspace.quota_mb());
    let made = tokio::task::spawn_blocking(move || disk.from_staged(id, &root, quota)).await;
    match made {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => return Ok(None),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the staged tree could not be used; restoring");
            return Ok(None);
        }
        Err(e) => return Err(HostError::Transient(e.to_string()).into()),
    }
    let manifest = async {
        let store = cairn_snapshot::store::ArtifactStore::open_existing(store_url)?;
        cairn_snapshot::load_recorded(&store, id, recorded).await
    }
    .await;
    let manifest = match manifest {
        Ok(manifest) => manifest,
        Err(e) => {
            tracing::warn!(error = %e, "the staged tree's manifest could not be read; restoring");
            return Ok(None);
        }
    };
    let root = workspace.root.clone();
    let pruned = tokio::task::spawn_blocking(move || super::fork::prune_to(&root, manifest)).await;
    let manifest = match pruned {
        Ok(Ok((manifest, removed))) => {
            tracing::debug!(removed, "left-out paths removed from the staged tree");
            manifest
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the staged tree could not be pruned; restoring");
            return Ok(None);
        }
        Err(e) => return Err(HostError::Transient(e.to_string()).into()),
    };
    tokio::fs::create_dir_all(&workspace.home)
        .await
        .map_err(|e| Unacquired::Failed(format!("preparing the home: {e}")))?;
    worker.metrics.forks_staged.inc();
    Ok(Some(manifest))
}

/// Restores `snapshot`: its id, store and the manifest key its record names.
async fn restore(
    worker: &Worker,
    snapshot: (Uuid, &str, Option<&str>),
    workspace: &Workspace,
) -> Result<Manifest, Unacquired> {
    let id = snapshot.0;
    match worker.custody.restore_snapshot(snapshot, workspace).await {
        Ok(index) => {
            tokio::fs::create_dir_all(&workspace.home)
                .await
                .map_err(|e| Unacquired::Failed(format!("preparing the home: {e}")))?;
            Ok(index)
        }
        Err(Restore::Unusable(reason)) => Err(Unacquired::Failed(format!(
            "the snapshot {} cannot be restored: {reason}",
            id.simple()
        ))),
        // The store did not answer: another placement may do better.
        Err(Restore::Unavailable(reason)) => Err(Unacquired::Host(HostError::Transient(format!(
            "the snapshot store did not answer: {reason}"
        )))),
    }
}

/// Records the tree in use here, in the caller's fenced transaction: the sandbox's one
/// workspace row on this worker, held while it runs.
pub async fn record_in_use(
    conn: &mut sqlx::PgConnection,
    worker: &Worker,
    row: &SandboxRow,
    tree: &SandboxTree,
) -> Result<(), sqlx::Error> {
    let path = tree.live.workspace.root.to_string_lossy().into_owned();
    let in_use = workspace_row::InUse {
        id: tree.live.workspace_id,
        agent: &row.agent,
        backend: &worker.custody.settings.backend,
        persistent: row.persistent,
        host: &worker.settings.worker_id,
        directory_id: worker.custody.directory.id,
        path: &path,
        snapshot_id: tree.live.position,
        work_context_id: row.id,
        run: None,
    };
    workspace_row::in_use(&mut *conn, &in_use).await?;
    let target = HoldTarget {
        workspace_id: tree.live.workspace_id,
        run_id: None,
        work_context: Some(row.id),
        agent: &row.agent,
    };
    let expires = chrono::Utc::now() + chrono::Duration::days(HOLD_DAYS);
    hold::hold(&mut *conn, &target, "sandbox_running", expires).await?;
    Ok(())
}

/// What a commit seals with the tree.
pub enum Seal<'a> {
    /// A tree restored from another sandbox's snapshot becomes this one's own first
    /// checkpoint (it never depends on that snapshot again).
    Start,
    /// An operation's receipt.
    Operation { id: Uuid, result: &'a Value },
    /// A snapshot resource (`named`, or the capture of a fork with its new sandboxes),
    /// sealed with its operation's receipt.
    Resource {
        id: Uuid,
        name: Option<&'a str>,
        fork: Option<&'a ForkSpec>,
        started: std::time::Instant,
    },
    /// The stop snapshot, and the sandbox stopped (`reason`, or the one asked for).
    Stop { reason: Option<&'a str> },
}

/// A seal, as the sandbox's commit writes it.
struct SandboxSeal<'a> {
    seal: Seal<'a>,
    lease: &'a Lease,
    row: &'a SandboxRow,
    /// This worker's directory, and how many of a fork's sandboxes it takes itself,
    /// from its tree staged there (as many as it has free slots, where trees are
    /// subvolumes); the rest go to any worker at once.
    directory: Uuid,
    takes: usize,
}

impl custody::Seal for SandboxSeal<'_> {
    type Error = HostError;

    fn stands_on_unchanged(&self) -> bool {
        matches!(self.seal, Seal::Operation { .. })
    }

    async fn seal(
        &self,
        tx: &mut PgConnection,
        _lease: &Lease,
        snapshot_id: Uuid,
    ) -> Result<custody::TreeAfter, HostError> {
        let (lease, row) = (self.lease, self.row);
        match &self.seal {
            Seal::Start => {}
            Seal::Operation { id, result } => {
                finish_operation(tx, *id, lease.epoch, result, snapshot_id).await?;
            }
            Seal::Resource {
                id, fork, started, ..
            } => {
                let forks = match fork {
                    Some(spec) => {
                        let staged_at = (self.takes > 0).then_some(self.directory);
                        super::fork::provision(tx, row.id, snapshot_id, spec, staged_at).await?
                    }
                    None => Vec::new(),
                };
                let frozen_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
                let result = serde_json::json!({
                    "snapshot_id": snapshot_id.simple().to_string(),
                    "sandbox_ids": forks.iter().map(|f| f.simple().to_string()).collect::<Vec<_>>(),
                    "frozen_ms": frozen_ms,
                });
                finish_operation(tx, *id, lease.epoch, &result, snapshot_id).await?;
            }
            Seal::Stop { reason } => {
                owner::stopped(tx, row.id, lease.epoch, snapshot_id, *reason).await?;
            }
        }
        Ok(custody::TreeAfter::Stays)
    }
}

/// Commits the tree with `seal` ([`custody::Custody::commit`]): an operation's receipt
/// stands on the checkpoint holding its effects (a new one appended to the sandbox's
/// lineage, or the head the tree is at when nothing changed); a stop captures the stop
/// snapshot, a snapshot or fork its resource. The sandbox's running hold keeps the
/// tree meanwhile; a failure writes nothing.
pub async fn commit(
    worker: &Worker,
    lease: &Lease,
    row: &SandboxRow,
    tree: &mut SandboxTree,
    seal: Seal<'_>,
) -> Result<Uuid, HostError> {
    let (kind, name) = match &seal {
        Seal::Start | Seal::Operation { .. } => ("checkpoint", None),
        Seal::Stop { .. } => ("stop", None),
        Seal::Resource {
            fork: None, name, ..
        } => ("named", *name),
        Seal::Resource { fork: Some(_), .. } => ("fork", None),
    };
    let capture = Capture {
        kind,
        agent: &row.agent,
        repository: row.repository.as_deref(),
        git_ref: row.git_ref.as_deref(),
        work_context: Some(row.id),
        by: CapturedBy::Sandbox(row.id),
        name,
        hold: None,
        appends: matches!(seal, Seal::Start | Seal::Operation { .. }),
    };
    // A tree restored from a stop snapshot or a source is not at its position's index
    // until its first checkpoint.
    let index_is_position = !tree.live.uncaptured;
    // (Its sum over the tree is for a fork's capture only, not every checkpoint's.)
    let takes = match &seal {
        Seal::Resource { fork: Some(_), .. } => staged_forks(worker, tree),
        _ => 0,
    };
    // A fork's staged copy was verified stat for stat against its index as it was cut
    // to it, and nothing has run in it since: its first checkpoint is that index.
    let known = match (&seal, tree.origin, &tree.live.index) {
        (Seal::Start, "staged", Some(index)) => Some(Manifest::clone(index)),
        _ => None,
    };
    let seal = SandboxSeal {
        seal,
        lease,
        row,
        directory: worker.custody.directory.id,
        takes,
    };
    if let Some(manifest) = known {
        let at = tree.live.at(index_is_position);
        match (worker.custody)
            .commit_known(lease, &capture, at, manifest, &seal)
            .await?
        {
            Checkpoint::Stands(snapshot) => return Ok(snapshot),
            Checkpoint::Failed(reason) => {
                tracing::warn!(%reason, "the staged tree's index was not recorded; capturing it")
            }
        }
    }
    let at = tree.live.at(index_is_position);
    match worker.custody.commit(lease, &capture, at, &seal).await? {
        Checkpoint::Stands(snapshot) => Ok(snapshot),
        Checkpoint::Failed(reason) => Err(HostError::Capture(reason)),
    }
}

/// A tree smaller than this is restored faster than a snapshot of it is made (each
/// btrfs snapshot commits a transaction): its forks are not staged.
const STAGED_MIN_BYTES: u64 = 64 * 1024 * 1024;

/// How many of a fork's sandboxes this worker takes from its tree staged here: as many
/// as it has free slots, where trees are subvolumes and the tree is large enough.
pub(super) fn staged_forks(worker: &Worker, tree: &SandboxTree) -> usize {
    let size = tree
        .live
        .index
        .as_ref()
        .map_or(0, |index| index.total_bytes());
    if !worker.custody.disk.enforced() || worker.placements.is_none() || size < STAGED_MIN_BYTES {
        return 0;
    }
    let hosted = u32::try_from(worker.metrics.sandboxes_hosted.get()).unwrap_or(u32::MAX);
    let free = worker.settings.sandbox_slots.saturating_sub(hosted);
    usize::try_from(free).unwrap_or(0)
}

/// An operation's receipt, on the snapshot holding its effects.
pub async fn finish_operation(
    conn: &mut sqlx::PgConnection,
    id: Uuid,
    epoch: i64,
    result: &Value,
    snapshot_id: Uuid,
) -> Result<(), sqlx::Error> {
    let ended = operations::Ended::Done {
        result,
        snapshot_id: Some(snapshot_id),
    };
    operations::finish(conn, id, epoch, ended).await
}
