//! Workspace rows, the one writer of `workspaces`: where a live tree is (worker,
//! directory, path), whose it is (a run's request, or a sandbox's work context), the
//! snapshot it is at, and its state. A run's tree gets a row each time it is acquired;
//! a sandbox keeps one row for its life, moved to whichever worker runs it.

use sqlx::PgConnection;
use uuid::Uuid;

crate::text_enum! {
    /// Where a tree stands.
    pub enum WorkspaceState {
        Creating => "creating",
        Running => "running",
        Stopped => "stopped",
        Paused => "paused",
        Error => "error",
        Destroyed => "destroyed",
    }
}

/// A tree in use on a worker.
#[derive(Debug, Clone)]
pub struct InUse<'a> {
    pub id: Uuid,
    pub agent: &'a str,
    pub backend: &'a str,
    pub persistent: bool,
    /// The worker holding it, its directory and the tree's path there.
    pub host: &'a str,
    pub directory_id: Uuid,
    pub path: &'a str,
    /// The snapshot the tree is at.
    pub snapshot_id: Option<Uuid>,
    pub work_context_id: Uuid,
    /// A run's tree: its run and request, and the agent's credential generation.
    pub run: Option<(Uuid, Uuid, i64)>,
}

/// Records the tree `running` where it is now: a new row, or the sandbox's one row
/// moved here.
pub async fn in_use(conn: &mut PgConnection, tree: &InUse<'_>) -> Result<(), sqlx::Error> {
    record(conn, tree, false).await?;
    Ok(())
}

/// [`in_use`], and the other live rows of the tree's path destroyed in the same
/// statement (trees that were fenced or died there): the tree at the path is now this
/// one. Returns the rows destroyed.
pub async fn in_use_replacing(
    conn: &mut PgConnection,
    tree: &InUse<'_>,
) -> Result<Vec<Uuid>, sqlx::Error> {
    record(conn, tree, true).await
}

async fn record(
    conn: &mut PgConnection,
    tree: &InUse<'_>,
    replacing: bool,
) -> Result<Vec<Uuid>, sqlx::Error> {
    // The two writes touch different rows (`id <> $1`), so neither sees the other's.
    // `'destroyed'` is written out: bound, it would hide from a generic plan that the
    // partial index on the path covers these rows, and each claim would scan the table.
    sqlx::query_scalar(
        "WITH stale AS (
           UPDATE workspaces SET state = $14, destroyed_at = now(), updated_at = now()
            WHERE $15 AND directory_id = $11 AND path = $8 AND id <> $1 AND state <> 'destroyed'
           RETURNING id),
         recorded AS (
           INSERT INTO workspaces (id, run_id, work_context_id, agent, backend, persistent, state, host, path,
                                   credential_generation, request_id, directory_id, snapshot_id)
           VALUES ($1, $2, $3, $4, $5, $6, $13, $7, $8, COALESCE($9, 0), $10, $11, $12)
           ON CONFLICT (id) DO UPDATE SET state = $13, host = $7, path = $8, directory_id = $11,
                  snapshot_id = $12, updated_at = now())
         SELECT id FROM stale",
    )
    .bind(tree.id)
    .bind(tree.run.map(|r| r.0))
    .bind(tree.work_context_id)
    .bind(tree.agent)
    .bind(tree.backend)
    .bind(tree.persistent)
    .bind(tree.host)
    .bind(tree.path)
    .bind(tree.run.map(|r| r.2))
    .bind(tree.run.map(|r| r.1))
    .bind(tree.directory_id)
    .bind(tree.snapshot_id)
    .bind(WorkspaceState::Running)
    .bind(WorkspaceState::Destroyed)
    .bind(replacing)
    .fetch_all(conn)
    .await
}

/// The tree is gone (released, removed or replaced).
pub async fn destroy(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    destroy_at(conn, id, None).await
}

/// The tree is gone, and was last at `snapshot` when one is given: its last commit and
/// its end in one statement.
pub async fn destroy_at(
    conn: &mut PgConnection,
    id: Uuid,
    snapshot: Option<Uuid>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE workspaces SET state = $2, destroyed_at = now(), updated_at = now(),
                snapshot_id = COALESCE($3, snapshot_id)
          WHERE id = $1 AND state <> $2",
    )
    .bind(id)
    .bind(WorkspaceState::Destroyed)
    .bind(snapshot)
    .execute(conn)
    .await?;
    Ok(())
}

/// The tree stays where it is, no job running on it (held for a successor).
pub async fn stop(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE workspaces SET state = $2, updated_at = now() WHERE id = $1")
        .bind(id)
        .bind(WorkspaceState::Stopped)
        .execute(conn)
        .await?;
    Ok(())
}

/// The tree is now at `snapshot` (its latest commit).
pub async fn moved_to(
    conn: &mut PgConnection,
    id: Uuid,
    snapshot: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE workspaces SET snapshot_id = $2, updated_at = now() WHERE id = $1")
        .bind(id)
        .bind(snapshot)
        .execute(conn)
        .await?;
    Ok(())
}

/// Marks a live tree paused (its processes frozen or stopped) or running again.
pub async fn set_paused(
    conn: &mut PgConnection,
    id: Uuid,
    paused: bool,
) -> Result<(), sqlx::Error> {
    let (to, paused_at) = if paused {
        (WorkspaceState::Paused, "now()")
    } else {
        (WorkspaceState::Running, "NULL")
    };
    sqlx::query(&format!(
        "UPDATE workspaces SET state = $2, paused_at = {paused_at}, updated_at = now()
          WHERE id = $1 AND state IN ($3, $4)"
    ))
    .bind(id)
    .bind(to)
    .bind(WorkspaceState::Running)
    .bind(WorkspaceState::Paused)
    .execute(conn)
    .await?;
    Ok(())
}

/// A sandbox's tree left its worker (stopped): its row stays, on no worker.
pub async fn leave_worker_of_sandbox(
    conn: &mut PgConnection,
    sandbox_id: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE workspaces SET state = $2, host = NULL, path = NULL, directory_id = NULL,
                updated_at = now()
          WHERE id = (SELECT workspace_id FROM sandboxes WHERE id = $1) AND state <> $3",
    )
    .bind(sandbox_id)
    .bind(WorkspaceState::Stopped)
    .bind(WorkspaceState::Destroyed)
    .execute(conn)
    .await?;
    Ok(())
}

/// A sandbox's tree is destroyed with it (its snapshots go after the reaper's grace).
pub async fn destroy_of_sandbox(
    conn: &mut PgConnection,
    sandbox_id: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE workspaces SET state = $2, destroyed_at = now(), updated_at = now()
          WHERE id = (SELECT workspace_id FROM sandboxes WHERE id = $1) AND state <> $2",
    )
    .bind(sandbox_id)
    .bind(WorkspaceState::Destroyed)
    .execute(conn)
    .await?;
    Ok(())
}

/// When a tree on a worker's disk guards nothing (`w` its row, `$2` the grace in
/// seconds): untouched for the grace, no live hold (a capture, or one that has not
/// expired for the grace) on it, and no other live row of its path that is recent or
/// held.
pub const UNGUARDED: &str = "w.updated_at < now() - make_interval(secs => $2)
    AND NOT EXISTS (SELECT 1 FROM holds h
                     WHERE h.workspace_id = w.id AND h.ended_at IS NULL
                       AND (h.capture_in_progress OR h.expires_at > now() - make_interval(secs => $2)))
    AND NOT EXISTS (SELECT 1 FROM workspaces o
                     WHERE o.directory_id = w.directory_id AND o.path = w.path AND o.id <> w.id AND o.state <> 'destroyed'
                       AND (o.updated_at >= now() - make_interval(secs => $2)
                            OR EXISTS (SELECT 1 FROM holds g
                                        WHERE g.workspace_id = o.id AND g.ended_at IS NULL
                                          AND (g.capture_in_progress OR g.expires_at > now() - make_interval(secs => $2)))))";

/// Destroys a live tree's row if it still guards nothing ([`UNGUARDED`], with
/// `grace_secs`); whether it did.
pub async fn take_unguarded(
    conn: &mut PgConnection,
    id: Uuid,
    grace_secs: f64,
) -> Result<bool, sqlx::Error> {
    let taken = sqlx::query(&format!(
        "UPDATE workspaces w SET state = $3, destroyed_at = now(), updated_at = now()
          WHERE w.id = $1 AND w.state IN ($4, $5, $6) AND {UNGUARDED}"
    ))
    .bind(id)
    .bind(grace_secs)
    .bind(WorkspaceState::Destroyed)
    .bind(WorkspaceState::Stopped)
    .bind(WorkspaceState::Running)
    .bind(WorkspaceState::Paused)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(taken > 0)
}
