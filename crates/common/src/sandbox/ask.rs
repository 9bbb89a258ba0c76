//! What the API and the scheduler's sweepers ask of a sandbox's owner, through its row:
//! the state it should reach (`desired`), with why it stops, its room and its timeout,
//! and placing it again. The owner acts on these; [`super::record`] moves the state.

use sqlx::PgConnection;
use uuid::Uuid;

/// Asks the owner for `desired` (`running`, `paused`, `stopped`, `destroyed`).
pub async fn desire(conn: &mut PgConnection, id: Uuid, desired: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE sandboxes SET desired = $2, updated_at = now() WHERE id = $1")
        .bind(id)
        .bind(desired)
        .execute(conn)
        .await?;
    Ok(())
}

/// Asks the owner to stop it, saying why (`requested`, `timeout`, …).
pub async fn stop(conn: &mut PgConnection, id: Uuid, reason: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE sandboxes SET desired = 'stopped', stop_reason = $2, updated_at = now() WHERE id = $1",
    )
    .bind(id)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// A sandbox whose worker was lost, stopped at its last durable tree: `stopped` now
/// (the caller moved its state), or a resume that was never placed.
pub async fn lost_worker(
    conn: &mut PgConnection,
    id: Uuid,
    stopped_now: bool,
) -> Result<(), sqlx::Error> {
    let sql = if stopped_now {
        "UPDATE sandboxes SET desired = 'stopped', stop_reason = 'worker_lost',
                stopped_at = now(), paused_at = NULL WHERE id = $1"
    } else {
        "UPDATE sandboxes SET desired = 'stopped', stop_reason = 'worker_lost' WHERE id = $1"
    };
    sqlx::query(sql).bind(id).execute(conn).await?;
    Ok(())
}

/// Why a sandbox is in `error` (the caller moved its state).
pub async fn failed(conn: &mut PgConnection, id: Uuid, reason: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE sandboxes SET error_reason = $2 WHERE id = $1")
        .bind(id)
        .bind(reason)
        .execute(conn)
        .await?;
    Ok(())
}

/// Gives the sandbox's tree and home `mb` MiB (the caller refused a shrink).
pub async fn grow_disk(conn: &mut PgConnection, id: Uuid, mb: i32) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE sandboxes SET disk_mb = $2 WHERE id = $1")
        .bind(id)
        .bind(mb)
        .execute(conn)
        .await?;
    Ok(())
}

/// Replaces its timeout (or keeps it: `None`) and counts as activity.
pub async fn extend(
    conn: &mut PgConnection,
    id: Uuid,
    timeout_sec: Option<i32>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE sandboxes SET timeout_sec = COALESCE($2, timeout_sec), last_activity_at = now(),
                updated_at = now() WHERE id = $1",
    )
    .bind(id)
    .bind(timeout_sec)
    .execute(conn)
    .await?;
    Ok(())
}

/// Announces its placement again: the first of a new series (`first`, a resume) or the
/// next after a worker was lost while it prepared the sandbox.
pub async fn place_again(
    conn: &mut PgConnection,
    id: Uuid,
    first: bool,
) -> Result<(), sqlx::Error> {
    let sql = if first {
        "UPDATE sandboxes SET placement_attempt = 1 WHERE id = $1"
    } else {
        "UPDATE sandboxes SET placement_attempt = placement_attempt + 1 WHERE id = $1"
    };
    sqlx::query(sql).bind(id).execute(&mut *conn).await?;
    super::record::announce_placement(conn, id).await
}

/// Sets the service `name` (or deletes it: `None`), counting as activity.
pub async fn set_service(
    conn: &mut PgConnection,
    id: Uuid,
    name: &str,
    service: Option<&super::service::ServiceSpec>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE sandboxes SET last_activity_at = now(),
                services = CASE WHEN $3::jsonb IS NULL THEN services - $2
                                ELSE jsonb_set(services, ARRAY[$2], $3::jsonb) END
          WHERE id = $1",
    )
    .bind(id)
    .bind(name)
    .bind(service.map(sqlx::types::Json))
    .execute(conn)
    .await?;
    Ok(())
}

/// A use of the sandbox (a preview's request) counts as activity: written at most once
/// a second, so that a page of many requests is not a write each.
pub async fn touch(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE sandboxes SET last_activity_at = now()
          WHERE id = $1 AND last_activity_at < now() - interval '1 second'",
    )
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}
