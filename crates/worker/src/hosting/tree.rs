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
use crate::custody::Restore;
use crate::workspace::{self, Workspace};
use cairn_common::hold::{self, HoldTarget};
use cairn_common::lease::Lease;
use cairn_common::lineage::{self, LineageError, NewSnapshot, SnapshotStatus};
use cairn_common::sandbox::{operations, record, ForkSpec, SandboxEvent};
use cairn_snapshot::{self as snapshot, Manifest};
use serde_json::Value;
use sqlx::PgConnection;
use std::sync::Arc;
use uuid::Uuid;

/// How long a running sandbox's tree is held on this worker at most (the hold ends
/// when it stops); the same bound as any held tree.
const HOLD_DAYS: i64 = 14;

pub struct SandboxTree {
    pub workspace: Workspace,
    pub workspace_id: Uuid,
    /// The lineage head this tree derives from (what the next append expects).
    pub position: Option<Uuid>,
    /// The stat index of the tree as last captured or restored.
    pub index: Option<Arc<Manifest>>,
    /// Whether the live tree may hold what no snapshot has (a cold tree, or one
    /// restored from a source snapshot of another sandbox).
    pub uncaptured: bool,
    /// Where it came from: `stop_snapshot`, `checkpoint`, `source`, `cold`.
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
    let mut conn = worker.pool.acquire().await?;
    let head: Option<(Uuid, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT s.id, s.store_url, s.created_at FROM lineage_heads h JOIN project_snapshots s ON s.id = h.head_id
          WHERE h.work_context_id = $1 AND h.retired_at IS NULL AND s.status = 'ready'
            AND s.retention = 'current'",
    )
    .bind(row.id)
    .fetch_optional(&mut *conn)
    .await?;
    let stop: Option<(Uuid, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT s.id, s.store_url, s.created_at FROM sandboxes b JOIN project_snapshots s ON s.id = b.stop_snapshot_id
          WHERE b.id = $1 AND s.status = 'ready' AND s.retention = 'current'",
    )
    .bind(row.id)
    .fetch_optional(&mut *conn)
    .await?;
    let source: Option<(Uuid, String, String)> = match row.source_snapshot_id {
        Some(id) => sqlx::query_as(
            "SELECT id, store_url, CASE WHEN retention <> 'current' THEN 'deleted' ELSE status END
                   FROM project_snapshots WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?,
        None => None,
    };
    drop(conn);
    let position = head.as_ref().map(|h| h.0);
    // The newer of the two is the last durable tree: a stop snapshot holds everything
    // its lineage head did (every operation commits before the stop).
    let newest = match (&head, &stop) {
        (Some(h), Some(s)) if s.2 >= h.2 => Some((&s.0, &s.1, "stop_snapshot")),
        (Some(h), _) => Some((&h.0, &h.1, "checkpoint")),
        (None, Some(s)) => Some((&s.0, &s.1, "stop_snapshot")),
        (None, None) => None,
    };
    if let Some((id, store_url, origin)) = newest {
        let index = restore(worker, *id, store_url, &workspace).await?;
        return Ok(SandboxTree {
            workspace,
            workspace_id: row.workspace_id.unwrap_or_else(Uuid::new_v4),
            position,
            uncaptured: origin != "checkpoint",
            index: Some(Arc::new(index)),
            origin,
        });
    }
    if let Some((id, store_url, status)) = source {
        if status != "ready" {
            return Err(Unacquired::Failed(format!(
                "the source snapshot is {status}; only a ready snapshot is restored"
            )));
        }
        let index = restore(worker, id, &store_url, &workspace).await?;
        return Ok(SandboxTree {
            workspace,
            workspace_id: row.workspace_id.unwrap_or_else(Uuid::new_v4),
            position: None,
            // The restored tree's own stats: its first capture reads only what changed
            // (the identity files the scrub removes), not the whole tree again.
            index: Some(Arc::new(index)),
            uncaptured: true,
            origin: "source",
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
        workspace,
        workspace_id: row.workspace_id.unwrap_or_else(Uuid::new_v4),
        position: None,
        index: None,
        uncaptured: true,
        origin: "cold",
    })
}

async fn restore(
    worker: &Worker,
    id: Uuid,
    store_url: &str,
    workspace: &Workspace,
) -> Result<Manifest, Unacquired> {
    match worker
        .custody
        .restore_snapshot(id, store_url, workspace)
        .await
    {
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
    let path = tree.workspace.root.to_string_lossy().into_owned();
    sqlx::query(
        "INSERT INTO workspaces (id, agent, backend, persistent, state, host, path, directory_id, snapshot_id, work_context_id)
         VALUES ($1, $2, $3, $4, 'running', $5, $6, $7, $8, $9)
         ON CONFLICT (id) DO UPDATE SET state = 'running', host = $5, path = $6, directory_id = $7,
                snapshot_id = $8, updated_at = now()",
    )
    .bind(tree.workspace_id)
    .bind(&row.agent)
    .bind(&worker.custody.settings.backend)
    .bind(row.persistent)
    .bind(&worker.settings.worker_id)
    .bind(&path)
    .bind(worker.custody.directory.id)
    .bind(tree.position)
    .bind(row.id)
    .execute(&mut *conn)
    .await?;
    let target = HoldTarget {
        workspace_id: tree.workspace_id,
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

/// A capture that will not be sealed fails (so it defers no reclamation).
async fn abandon(worker: &Worker, snapshot_id: Uuid) {
    if let Ok(mut conn) = worker.pool.acquire().await {
        let _ = lineage::set_status(
            &mut conn,
            snapshot_id,
            &[SnapshotStatus::Creating, SnapshotStatus::Uploading],
            SnapshotStatus::Failed,
        )
        .await;
    }
}

/// Commits the tree with `seal`: an operation's receipt stands on the checkpoint holding
/// its effects (a new one appended to the sandbox's lineage, or the head the tree is at
/// when nothing changed); a stop captures the stop snapshot. One fenced transaction
/// makes the snapshot ready and writes the seal; a failure writes nothing.
pub async fn commit(
    worker: &Worker,
    lease: &Lease,
    row: &SandboxRow,
    tree: &mut SandboxTree,
    seal: Seal<'_>,
) -> Result<Uuid, HostError> {
    let settings = &worker.custody.settings;
    let scanned = snapshot::scan(&tree.workspace.root, &settings.rules)
        .await
        .map_err(|e| HostError::Capture(format!("reading the tree: {e}")))?;
    let kind = match seal {
        Seal::Start | Seal::Operation { .. } => "checkpoint",
        Seal::Stop { .. } => "stop",
        Seal::Resource { fork: None, .. } => "named",
        Seal::Resource { fork: Some(_), .. } => "fork",
    };
    let appends = matches!(seal, Seal::Start | Seal::Operation { .. });
    if let (Seal::Operation { id, result }, Some(position), Some(index), false) =
        (&seal, tree.position, tree.index.as_deref(), tree.uncaptured)
    {
        if scanned.unchanged_from(index) {
            let mut tx = lease.begin_fenced(&worker.pool).await?;
            finish_operation(&mut tx, *id, lease.epoch, result, position).await?;
            tx.commit().await.map_err(HostError::Db)?;
            return Ok(position);
        }
    }
    let mut tx = lease.begin_fenced(&worker.pool).await?;
    let generation = lineage::lock_generation(&mut tx, &row.agent).await?;
    if !lineage::lock_store_for_capture(&mut tx, settings.store_id).await? {
        return Err(HostError::Capture(
            "the snapshot store is being reclaimed".into(),
        ));
    }
    let snapshot_id = lineage::create(
        &mut tx,
        &NewSnapshot {
            kind,
            agent: &row.agent,
            repository: row.repository.as_deref(),
            backend: &settings.backend,
            base_image: settings.base_image.as_deref(),
            canonical_ref: row.git_ref.as_deref(),
            work_context_id: Some(row.id),
            workspace_id: Some(tree.workspace_id),
            store_url: settings.store.url(),
            store_id: settings.store_id,
            credential_generation: generation,
            owner: None,
        },
    )
    .await?;
    sqlx::query(
        "UPDATE project_snapshots SET sandbox_id = $2, lease_epoch = $3, predecessor_id = $4,
                status = 'uploading' WHERE id = $1",
    )
    .bind(snapshot_id)
    .bind(row.id)
    .bind(lease.epoch)
    .bind(tree.position)
    .execute(&mut *tx)
    .await?;
    tx.commit().await.map_err(HostError::Db)?;

    let captured = snapshot::capture_scanned(
        &settings.store,
        &tree.workspace.root,
        scanned,
        tree.index.clone(),
        snapshot_id,
    )
    .await;
    let manifest = match captured {
        Ok((manifest, _)) => manifest,
        Err(e) => {
            abandon(worker, snapshot_id).await;
            return Err(HostError::Capture(e.to_string()));
        }
    };
    let sealed = async {
        let mut tx = lease.begin_fenced(&worker.pool).await?;
        let size = i64::try_from(manifest.total_bytes()).unwrap_or(i64::MAX);
        if !lineage::mark_ready(
            &mut tx,
            snapshot_id,
            &snapshot::manifest_key(snapshot_id),
            size,
            &manifest.packs,
        )
        .await?
        {
            return Err(HostError::Capture(
                "the snapshot was failed while it was captured".into(),
            ));
        }
        if appends {
            match lineage::append(&mut tx, row.id, &row.agent, tree.position, snapshot_id).await {
                Ok(_) => {}
                Err(LineageError::Conflict { actual, .. }) => {
                    return Err(HostError::Capture(format!(
                        "the sandbox's lineage moved to {actual:?}"
                    )))
                }
                Err(LineageError::Db(e)) => return Err(HostError::Db(e)),
            }
            sqlx::query("UPDATE workspaces SET snapshot_id = $2, updated_at = now() WHERE id = $1")
                .bind(tree.workspace_id)
                .bind(snapshot_id)
                .execute(&mut *tx)
                .await?;
        }
        match &seal {
            Seal::Start => {}
            Seal::Operation { id, result } => {
                finish_operation(&mut tx, *id, lease.epoch, result, snapshot_id).await?;
            }
            Seal::Resource {
                id,
                name,
                fork,
                started,
            } => {
                sqlx::query("UPDATE project_snapshots SET name = $2 WHERE id = $1")
                    .bind(snapshot_id)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                let forks = match fork {
                    Some(spec) => {
                        super::fork::provision(&mut tx, row.id, snapshot_id, spec).await?
                    }
                    None => Vec::new(),
                };
                let frozen_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
                let result = serde_json::json!({
                    "snapshot_id": snapshot_id.simple().to_string(),
                    "sandbox_ids": forks.iter().map(|f| f.simple().to_string()).collect::<Vec<_>>(),
                    "frozen_ms": frozen_ms,
                });
                finish_operation(&mut tx, *id, lease.epoch, &result, snapshot_id).await?;
            }
            Seal::Stop { reason } => {
                stopped(&mut tx, lease, row, snapshot_id, *reason).await?;
            }
        }
        tx.commit().await.map_err(HostError::Db)?;
        Ok(())
    }
    .await;
    if let Err(e) = sealed {
        abandon(worker, snapshot_id).await;
        return Err(e);
    }
    // Only a lineage append moves the tree's position; its index must stay the
    // position's, for the shortcut above.
    if appends {
        tree.position = Some(snapshot_id);
        tree.index = Some(Arc::new(manifest));
        tree.uncaptured = false;
    }
    Ok(snapshot_id)
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

/// The stop, sealed with its snapshot in the caller's fenced transaction: the sandbox
/// `stopped` (for `reason`, or the one the API recorded), its pending operations ended,
/// its slot and lease released, its tree no longer held here.
async fn stopped(
    conn: &mut PgConnection,
    lease: &Lease,
    row: &SandboxRow,
    snapshot_id: Uuid,
    reason: Option<&str>,
) -> Result<(), HostError> {
    record::transition(conn, row.id, SandboxEvent::Stop).await?;
    sqlx::query(
        "UPDATE sandboxes SET stop_snapshot_id = $2, stopped_at = now(), desired = 'stopped',
                stop_reason = COALESCE($3, stop_reason, 'requested'), paused_at = NULL,
                lease_owner = NULL, lease_deadline = NULL
          WHERE id = $1 AND lease_epoch = $4",
    )
    .bind(row.id)
    .bind(snapshot_id)
    .bind(reason)
    .bind(lease.epoch)
    .execute(&mut *conn)
    .await?;
    record::interrupt_operations(conn, row.id, "the sandbox stopped before it ran").await?;
    record::tree_released(conn, row.id, "sandbox_stopped").await?;
    Ok(())
}
