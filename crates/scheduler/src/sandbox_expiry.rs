//! Sandbox timeouts, idle-anchored: every exec or file operation (and an extend) counts
//! as activity, and so does an operation still running. When `timeout_sec`, or a non-zero `idle_timeout_sec`, has passed since
//! the last activity, a persistent sandbox is stopped (its stop snapshot captured by its
//! worker) and a non-persistent one destroyed. `always_on` disables both until an
//! explicit lifecycle action.

use cairn_common::sandbox::{ask, record};
use cairn_common::sandbox::{SandboxEvent, SandboxState};
use sqlx::PgPool;
use uuid::Uuid;

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Expired {
    pub stopping: u64,
    pub destroying: u64,
}

/// One pass over the sandboxes whose timeout passed.
pub async fn expire(pool: &PgPool, batch: i64) -> Result<Expired, sqlx::Error> {
    let mut report = Expired::default();
    let mut tx = pool.begin().await?;
    let due: Vec<(Uuid, SandboxState, bool, bool, String)> = sqlx::query_as(
        "SELECT id, state, persistent,
                COALESCE(lease_owner IS NOT NULL AND lease_deadline > clock_timestamp(), FALSE),
                CASE WHEN last_activity_at + make_interval(secs => timeout_sec) <= now() THEN 'timeout'
                     ELSE 'idle_timeout' END
           FROM sandboxes
          WHERE NOT always_on AND desired = state
            -- An operation in progress (or waiting) is activity.
            AND NOT EXISTS (SELECT 1 FROM sandbox_operations o
                             WHERE o.sandbox_id = sandboxes.id AND o.state IN ('pending', 'running'))
            AND (state = 'running' OR (state = 'stopped' AND NOT persistent))
            AND (last_activity_at + make_interval(secs => timeout_sec) <= now()
                 OR (idle_timeout_sec > 0 AND last_activity_at + make_interval(secs => idle_timeout_sec) <= now()))
          ORDER BY last_activity_at LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    for (id, state, persistent, owned, reason) in due {
        if persistent {
            // Its worker stops it (a lost one: the lease sweeper does).
            ask::stop(&mut tx, id, &reason).await?;
            report.stopping += 1;
        } else if owned {
            ask::desire(&mut tx, id, "destroyed").await?;
            report.destroying += 1;
        } else if state == SandboxState::Stopped {
            record::destroy_unowned(&mut tx, id, SandboxEvent::Destroy)
                .await
                .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
            report.destroying += 1;
        }
        tracing::info!(sandbox_id = %id.simple(), reason, persistent, "sandbox timed out");
    }
    tx.commit().await?;
    Ok(report)
}
