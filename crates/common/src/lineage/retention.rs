//! How snapshots leave use, as the reaper and the API decide it: the writes, by the ids
//! picked. The rules that pick them are the reaper's; each write checks again the state
//! it moves from, so a row that moved meanwhile is left as it is.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

/// Fails captures interrupted for good (still `creating` or `uploading`), so they defer
/// no reclamation in their stores. Returns each one failed and its workspace.
pub async fn fail_interrupted(
    conn: &mut PgConnection,
    ids: &[Uuid],
) -> Result<Vec<(Uuid, Option<Uuid>)>, sqlx::Error> {
    sqlx::query_as(
        "UPDATE project_snapshots SET status = 'failed', retire_reason = 'capture_interrupted'
          WHERE id = ANY($1) AND status IN ('creating', 'uploading')
         RETURNING id, workspace_id",
    )
    .bind(ids)
    .fetch_all(conn)
    .await
}

/// Moves current snapshots to `retention` (`retired`, `superseded`) for `reason`.
pub async fn retire(
    conn: &mut PgConnection,
    ids: &[Uuid],
    (retention, reason): (&str, &str),
    at: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE project_snapshots SET retention = $2, retired_at = $4, retire_reason = $3
          WHERE id = ANY($1) AND retention = 'current'",
    )
    .bind(ids)
    .bind(retention)
    .bind(reason)
    .bind(at)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// A failed step's tree, just captured, is kept for inspection only: retired now (by the
/// database's clock), so nothing continues from it and its bytes go by the reclaim rule.
pub async fn kept_for_inspection(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE project_snapshots SET retention = 'retired', retired_at = now(), retire_reason = 'inspection'
          WHERE id = $1 AND kind = 'inspection' AND retention = 'current'",
    )
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The snapshots' bytes are deleted from their store: their pack and chunk records go
/// and they are `deleted`, `reclaimed`. Returns how many were.
pub async fn reclaimed(conn: &mut PgConnection, ids: &[Uuid]) -> Result<u64, sqlx::Error> {
    sqlx::query("DELETE FROM snapshot_packs WHERE snapshot_id = ANY($1)")
        .bind(ids)
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM snapshot_chunks WHERE snapshot_id = ANY($1)")
        .bind(ids)
        .execute(&mut *conn)
        .await?;
    let done = sqlx::query(
        "UPDATE project_snapshots SET status = 'deleted', retention = 'reclaimed', repair_reason = NULL,
                next_repair_at = NULL
          WHERE id = ANY($1) AND status <> 'deleted'",
    )
    .bind(ids)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// A snapshot's bytes could not be deleted: it waits for an operator's repair, tried
/// again at `next_at`.
pub async fn pending_repair(
    conn: &mut PgConnection,
    id: Uuid,
    reason: &str,
    next_at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE project_snapshots SET retention = 'pending_operator_repair', repair_reason = $2,
                repair_attempts = repair_attempts + 1, next_repair_at = $3
          WHERE id = $1 AND status <> 'deleted'",
    )
    .bind(id)
    .bind(reason)
    .bind(next_at)
    .execute(conn)
    .await?;
    Ok(())
}
