//! The resume context: what a worker that took a request over found (how its tree was
//! acquired, from which snapshot, and where each journaled step stands on it).

use sqlx::PgConnection;
use uuid::Uuid;

/// Records the context of a new acquisition.
pub async fn record(
    conn: &mut PgConnection,
    request_id: Uuid,
    context: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE execution_requests SET resume_context = $2 WHERE id = $1")
        .bind(request_id)
        .bind(context)
        .execute(conn)
        .await?;
    Ok(())
}

/// Adds where each receipt stands on the acquired tree (`receipts`: a JSON list).
pub async fn note_receipts(
    conn: &mut PgConnection,
    request_id: Uuid,
    receipts: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE execution_requests
            SET resume_context = COALESCE(resume_context, '{}'::jsonb) || jsonb_build_object('receipts', $2::jsonb)
          WHERE id = $1",
    )
    .bind(request_id)
    .bind(receipts)
    .execute(conn)
    .await?;
    Ok(())
}
