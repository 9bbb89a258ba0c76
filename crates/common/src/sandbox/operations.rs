//! The operations asked of a sandbox (exec, files, snapshots, forks), recorded for its
//! owner, and the idempotency keys of lifecycle and operation calls.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// Records an operation for the sandbox's owner, in the caller's transaction (it counts
/// as activity); returns its id.
pub async fn record(
    conn: &mut PgConnection,
    id: Uuid,
    kind: &str,
    body: &serde_json::Value,
) -> Result<Uuid, sqlx::Error> {
    let operation_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO sandbox_operations (id, sandbox_id, kind, body) VALUES ($1, $2, $3, $4)",
    )
    .bind(operation_id)
    .bind(id)
    .bind(kind)
    .bind(body)
    .execute(&mut *conn)
    .await?;
    sqlx::query("UPDATE sandboxes SET last_activity_at = now() WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(operation_id)
}

/// Records a key's first use (and the operation it became), in the transaction that
/// carries it out.
pub async fn remember_key(
    conn: &mut PgConnection,
    key: &str,
    digest: &str,
    id: Uuid,
    operation: Option<Uuid>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO sandbox_idempotency (idempotency_key, request_digest, sandbox_id, operation_id)
         VALUES ($1, $2, $3, $4)",
    )
    .bind(key)
    .bind(digest)
    .bind(id)
    .bind(operation)
    .execute(conn)
    .await?;
    Ok(())
}

/// Starts a pending operation at the owner's `epoch` (it counts as the sandbox's
/// activity), with the artifact store its live output goes to (an exec's);
/// `false` if it was not pending.
pub async fn start(
    conn: &mut PgConnection,
    id: Uuid,
    epoch: i64,
    sandbox_id: Uuid,
    output_store: Option<(Uuid, &str)>,
) -> Result<bool, sqlx::Error> {
    let started = sqlx::query(
        "UPDATE sandbox_operations SET state = 'running', lease_epoch = $2, started_at = now(),
                output_store = $3, output_store_url = $4
          WHERE id = $1 AND state = 'pending'",
    )
    .bind(id)
    .bind(epoch)
    .bind(output_store.map(|(store, _)| store))
    .bind(output_store.map(|(_, url)| url))
    .execute(&mut *conn)
    .await?;
    sqlx::query("UPDATE sandboxes SET last_activity_at = now() WHERE id = $1")
        .bind(sandbox_id)
        .execute(conn)
        .await?;
    Ok(started.rows_affected() == 1)
}

/// The snapshot an operation's receipt stands on, once its owner at `epoch` ended it
/// `done` on one.
pub async fn receipted(pool: &PgPool, id: Uuid, epoch: i64) -> Result<Option<Uuid>, sqlx::Error> {
    let snapshot: Option<Option<Uuid>> = sqlx::query_scalar(
        "SELECT snapshot_id FROM sandbox_operations WHERE id = $1 AND lease_epoch = $2 AND state = 'done'",
    )
    .bind(id)
    .bind(epoch)
    .fetch_optional(pool)
    .await?;
    Ok(snapshot.flatten())
}

/// Marks the live output of `ids` deleted by retention at `at`.
pub async fn outputs_reclaimed(
    conn: &mut PgConnection,
    ids: &[Uuid],
    at: chrono::DateTime<chrono::Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE sandbox_operations SET output_reclaimed_at = $2 WHERE id = ANY($1)")
        .bind(ids)
        .bind(at)
        .execute(conn)
        .await?;
    Ok(())
}

/// Ends a running operation of the owner at `epoch` with its receipt: `done`, on the
/// snapshot holding its effects where it had any, or `interrupted` (its effects could
/// not be kept; the result says so).
pub async fn finish(
    conn: &mut PgConnection,
    id: Uuid,
    epoch: i64,
    ended: Ended<'_>,
) -> Result<(), sqlx::Error> {
    let (state, result, snapshot_id) = match ended {
        Ended::Done {
            result,
            snapshot_id,
        } => ("done", result.clone(), snapshot_id),
        Ended::Failed { error } => ("done", serde_json::json!({ "error": error }), None),
        Ended::Interrupted { error, ran } => (
            "interrupted",
            serde_json::json!({ "error": error, "ran": ran }),
            None,
        ),
    };
    sqlx::query(
        "UPDATE sandbox_operations SET state = $3, result = $4, snapshot_id = $5, finished_at = now()
          WHERE id = $1 AND state = 'running' AND lease_epoch = $2",
    )
    .bind(id)
    .bind(epoch)
    .bind(state)
    .bind(result)
    .bind(snapshot_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// How an operation ended.
#[derive(Debug, Clone, Copy)]
pub enum Ended<'a> {
    /// Its result, and the snapshot that holds its effects (`None`: it changed nothing).
    Done {
        result: &'a serde_json::Value,
        snapshot_id: Option<Uuid>,
    },
    /// It could not be carried out (a capture failed).
    Failed { error: &'a str },
    /// It ran, but its effects could not be captured.
    Interrupted {
        error: &'a str,
        ran: &'a serde_json::Value,
    },
}
