//! The moves a sandbox's owner (the worker holding its lease) makes, each a state move
//! through the transition table with what the row records of it, in the owner's fenced
//! transaction.

use super::record::{interrupt_operations, transition, tree_released};
use super::state::{SandboxEvent, SandboxState};
use crate::request::table::Error;
use sqlx::PgConnection;
use uuid::Uuid;

/// Running on `worker_id` with its tree `workspace_id`: `Ready` for a sandbox being
/// created, `Resume` for one placed again.
pub async fn running_on(
    conn: &mut PgConnection,
    id: Uuid,
    was: SandboxState,
    worker_id: &str,
    workspace_id: Uuid,
) -> Result<(), Error> {
    let event = match was {
        SandboxState::Creating => SandboxEvent::Ready,
        _ => SandboxEvent::Resume,
    };
    transition(conn, id, event).await?;
    sqlx::query(
        "UPDATE sandboxes SET worker_id = $2, workspace_id = $3, stop_reason = NULL, error_reason = NULL,
                paused_at = NULL, last_activity_at = now(), placement_attempt = 1
          WHERE id = $1",
    )
    .bind(id)
    .bind(worker_id)
    .bind(workspace_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Its processes frozen in place (`paused`), or thawed (`running`).
pub async fn paused(conn: &mut PgConnection, id: Uuid, frozen: bool) -> Result<(), Error> {
    let event = if frozen {
        SandboxEvent::Pause
    } else {
        SandboxEvent::Resume
    };
    transition(conn, id, event).await?;
    sqlx::query(
        "UPDATE sandboxes SET paused_at = CASE WHEN $2 THEN now() END, last_activity_at = now()
          WHERE id = $1",
    )
    .bind(id)
    .bind(frozen)
    .execute(conn)
    .await?;
    Ok(())
}

/// Its tree could not be acquired, for good: a sandbox being created (`was`) fails
/// with the reason; one being resumed is (or stays) stopped and says why. Its pending
/// operations end.
pub async fn unplaceable(
    conn: &mut PgConnection,
    id: Uuid,
    was: SandboxState,
    reason: &str,
) -> Result<(), Error> {
    if was == SandboxState::Creating {
        transition(conn, id, SandboxEvent::BootFailure).await?;
        super::ask::failed(conn, id, reason).await?;
    } else {
        // A paused one whose worker was lost and whose disk cannot be restored now
        // is stopped, as its pause would have been.
        if was == SandboxState::Paused {
            transition(conn, id, SandboxEvent::Stop).await?;
        }
        sqlx::query(
            "UPDATE sandboxes SET desired = 'stopped', stop_reason = 'restore_failed', error_reason = $2,
                    paused_at = NULL
              WHERE id = $1",
        )
        .bind(id)
        .bind(reason)
        .execute(&mut *conn)
        .await?;
    }
    interrupt_operations(conn, id, reason).await?;
    Ok(())
}

/// Recovery failed at run time: the sandbox is in `error` (its hold keeps the tree).
pub async fn runtime_failed(conn: &mut PgConnection, id: Uuid, reason: &str) -> Result<(), Error> {
    transition(conn, id, SandboxEvent::RuntimeFailure).await?;
    super::ask::failed(conn, id, reason).await?;
    interrupt_operations(conn, id, reason).await?;
    Ok(())
}

/// Destroyed by its owner: its pending operations end, its tree's holds end and its
/// workspace row is destroyed (its snapshots go after the reaper's grace).
pub async fn destroyed(conn: &mut PgConnection, id: Uuid) -> Result<(), Error> {
    transition(conn, id, SandboxEvent::Destroy).await?;
    sqlx::query("UPDATE sandboxes SET destroyed_at = now(), paused_at = NULL WHERE id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    interrupt_operations(conn, id, "the sandbox was destroyed first").await?;
    super::record::end_holds(conn, id, "sandbox_destroyed").await?;
    super::volume::detach_all(conn, id).await?;
    crate::workspace::destroy_of_sandbox(conn, id).await?;
    Ok(())
}

/// Stopped with its stop snapshot, under lease `epoch`: `stopped` (for `reason`, or
/// the one the API recorded), its pending operations ended, its lease released and
/// its tree no longer held on a worker.
pub async fn stopped(
    conn: &mut PgConnection,
    id: Uuid,
    epoch: i64,
    snapshot_id: Uuid,
    reason: Option<&str>,
) -> Result<(), Error> {
    transition(conn, id, SandboxEvent::Stop).await?;
    sqlx::query(
        "UPDATE sandboxes SET stop_snapshot_id = $2, stopped_at = now(), desired = 'stopped',
                stop_reason = COALESCE($3, stop_reason, 'requested'), paused_at = NULL,
                lease_owner = NULL, lease_deadline = NULL
          WHERE id = $1 AND lease_epoch = $4",
    )
    .bind(id)
    .bind(snapshot_id)
    .bind(reason)
    .bind(epoch)
    .execute(&mut *conn)
    .await?;
    interrupt_operations(conn, id, "the sandbox stopped before it ran").await?;
    tree_released(conn, id, "sandbox_stopped").await?;
    Ok(())
}

/// The sandbox's identity: the one it has kept, or `made` where it has none yet (its
/// first run), in the owner's fenced transaction.
pub async fn keep_identity(
    conn: &mut PgConnection,
    id: Uuid,
    made: &super::identity::Identity,
) -> Result<super::identity::Identity, Error> {
    let (kept,): (sqlx::types::Json<super::identity::Identity>,) = sqlx::query_as(
        "UPDATE sandboxes SET identity = COALESCE(identity, $2) WHERE id = $1 RETURNING identity",
    )
    .bind(id)
    .bind(sqlx::types::Json(made))
    .fetch_one(conn)
    .await?;
    Ok(kept.0)
}
