//! Writes every component makes to a sandbox's row: a state move through the transition
//! table, a placement announced through the outbox, and an owner fenced out.

use super::state::{SandboxEvent, SandboxState};
use crate::outbox;
use crate::request::table::{apply, Error};
use crate::run::{JobKind, JobMessage};
use sqlx::PgConnection;
use uuid::Uuid;

/// Moves the sandbox by `event`, or [`Error::Refused`] naming its current state.
pub async fn transition(
    conn: &mut PgConnection,
    id: Uuid,
    event: SandboxEvent,
) -> Result<SandboxState, Error> {
    apply::<SandboxState>(conn, id, event).await
}

/// Announces the sandbox's placement: a worker claims it from `cairn.sandboxes`.
pub async fn announce_placement(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    outbox::announce(
        conn,
        &JobMessage {
            kind: JobKind::Sandbox,
            run_id: id,
            request_id: id,
            action_id: None,
            attempt: None,
        },
    )
    .await?;
    Ok(())
}

/// Ends the current owner's lease: the epoch moves on, so it writes nothing more.
pub async fn fence_out(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE sandboxes SET lease_epoch = lease_epoch + 1, lease_owner = NULL,
                lease_deadline = NULL, updated_at = now()
          WHERE id = $1",
    )
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Ends the operations that will not get a receipt from this owner: those never started
/// (`reason`), and one that was running when its owner was lost (its outcome unknown).
pub async fn interrupt_operations(
    conn: &mut PgConnection,
    id: Uuid,
    reason: &str,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE sandbox_operations
            SET state = 'interrupted', finished_at = now(),
                result = jsonb_build_object('error', CASE WHEN state = 'running'
                    THEN 'its worker was lost while it ran: its outcome is unknown'
                    ELSE $2 END)
          WHERE sandbox_id = $1 AND state IN ('pending', 'running')",
    )
    .bind(id)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// Ends the holds on the sandbox's tree (its worker keeps it no longer).
pub async fn end_holds(conn: &mut PgConnection, id: Uuid, reason: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE holds SET ended_at = now(), end_reason = $2
          WHERE ended_at IS NULL
            AND workspace_id = (SELECT workspace_id FROM sandboxes WHERE id = $1)",
    )
    .bind(id)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// Destroys a sandbox no worker holds: released, its pending operations ended, its
/// tree's holds ended and its workspace row destroyed (its snapshots go after the
/// reaper's grace).
pub async fn destroy_unowned(
    conn: &mut PgConnection,
    id: Uuid,
    event: SandboxEvent,
) -> Result<(), Error> {
    transition(conn, id, event).await?;
    fence_out(conn, id).await?;
    sqlx::query(
        "UPDATE sandboxes SET desired = 'destroyed', destroyed_at = now(), paused_at = NULL WHERE id = $1",
    )
    .bind(id)
    .execute(&mut *conn)
    .await?;
    interrupt_operations(conn, id, "the sandbox was destroyed first").await?;
    end_holds(conn, id, "sandbox_destroyed").await?;
    sqlx::query(
        "UPDATE workspaces SET state = 'destroyed', destroyed_at = now(), updated_at = now()
          WHERE id = (SELECT workspace_id FROM sandboxes WHERE id = $1) AND state <> 'destroyed'",
    )
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}
