//! Single-leader roles (the lease sweeper, the reaper): a PostgreSQL session advisory
//! lock held on a dedicated connection. If the leader dies or its connection drops, the
//! lock is released and a standby's next try wins.

use sqlx::{Connection, PgConnection, PgPool};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Leadership of one role, held while this connection lives.
pub struct Leadership {
    conn: PgConnection,
}

impl Leadership {
    /// Tries once to lead the role `key`; `None` when another instance leads or the
    /// database cannot be reached.
    pub async fn try_acquire(pool: &PgPool, key: i64) -> Option<Leadership> {
        let options = pool.connect_options().as_ref().clone();
        let mut conn = match PgConnection::connect_with(&options).await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "cannot connect to compete for leadership");
                return None;
            }
        };
        let won: Result<bool, _> = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(key)
            .fetch_one(&mut conn)
            .await;
        if matches!(won, Ok(true)) {
            Some(Leadership { conn })
        } else {
            let _ = conn.close().await;
            None
        }
    }

    /// Whether the leader connection still answers (if not, the lock is gone).
    pub async fn still_held(&mut self) -> bool {
        sqlx::query("SELECT 1")
            .execute(&mut self.conn)
            .await
            .is_ok()
    }

    /// Gives leadership up.
    pub async fn release(self) {
        let _ = self.conn.close().await;
    }
}

/// Sleeps `interval`, or less if `shutdown` comes first.
pub async fn pause(interval: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(interval) => {}
        _ = shutdown.cancelled() => {}
    }
}
