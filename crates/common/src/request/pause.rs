//! Pause and resume: the operator asks (`pause_requested_at`), the worker records what
//! it did (`paused_at`, the pause checkpoint).

use sqlx::PgConnection;
use uuid::Uuid;

/// Asks the run's executing request, held by a live worker, to pause (kept if already
/// asked). Whether a request was asked.
pub async fn ask(conn: &mut PgConnection, run_id: Uuid) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE execution_requests SET pause_requested_at = COALESCE(pause_requested_at, now()), updated_at = now()
          WHERE run_id = $1 AND kind = 'run' AND state = 'executing'
            AND lease_owner IS NOT NULL AND lease_deadline > clock_timestamp()",
    )
    .bind(run_id)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Withdraws the pause request of the run's executing request (resume). Whether there
/// was one.
pub async fn withdraw(conn: &mut PgConnection, run_id: Uuid) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE execution_requests SET pause_requested_at = NULL, updated_at = now()
          WHERE run_id = $1 AND kind = 'run' AND state = 'executing' AND pause_requested_at IS NOT NULL",
    )
    .bind(run_id)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// The worker paused, after its checkpoint (described by `checkpoint`).
pub async fn record_paused(
    conn: &mut PgConnection,
    request_id: Uuid,
    checkpoint: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE execution_requests SET paused_at = now(), pause_checkpoint = $2, updated_at = now()
          WHERE id = $1",
    )
    .bind(request_id)
    .bind(checkpoint)
    .execute(conn)
    .await?;
    Ok(())
}

/// The worker resumed.
pub async fn record_resumed(conn: &mut PgConnection, request_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE execution_requests SET paused_at = NULL, updated_at = now() WHERE id = $1")
        .bind(request_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// The pause ended without a resume (past its limit, or its request was claimed anew):
/// neither asked nor paused any more.
pub async fn clear(conn: &mut PgConnection, request_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE execution_requests SET pause_requested_at = NULL, paused_at = NULL WHERE id = $1",
    )
    .bind(request_id)
    .execute(conn)
    .await?;
    Ok(())
}
