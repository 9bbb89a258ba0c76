//! Fencing a request's holder out: whoever held its lease can write nothing more.

use crate::journal;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

/// Clears the lease and moves the epoch on, so whoever held it can write nothing more.
/// A step its holder left without a receipt is charged up to now, or to the holder's
/// lease deadline when that passed first.
pub async fn fence_out(conn: &mut PgConnection, request_id: Uuid) -> Result<(), sqlx::Error> {
    let deadline: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT lease_deadline FROM execution_requests WHERE id = $1")
            .bind(request_id)
            .fetch_optional(&mut *conn)
            .await?
            .flatten();
    journal::charge_interrupted(&mut *conn, request_id, deadline).await?;
    sqlx::query(
        "UPDATE execution_requests
            SET lease_epoch = lease_epoch + 1, lease_owner = NULL, lease_deadline = NULL, updated_at = now()
          WHERE id = $1",
    )
    .bind(request_id)
    .execute(conn)
    .await?;
    Ok(())
}
