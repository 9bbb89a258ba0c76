//! What is recorded on a request beside its state: when its step output was reclaimed,
//! and when its delivery was last announced.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

/// The requests' step output is gone from the artifact store (the reaper reclaimed it).
pub async fn outputs_reclaimed(
    conn: &mut PgConnection,
    ids: &[Uuid],
    at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE execution_requests SET output_reclaimed_at = $2 WHERE id = ANY($1)")
        .bind(ids)
        .bind(at)
        .execute(conn)
        .await?;
    Ok(())
}

/// The request's delivery was announced again now: the next announcement waits for
/// fresh evidence that it is parked.
pub async fn announced_again(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE execution_requests SET updated_at = clock_timestamp() WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}
