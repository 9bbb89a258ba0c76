//! Durable holds: a live workspace tree is held before it is captured, so a failed or
//! interrupted capture can never let a release destroy the only live tree.
//!
//! A hold ends on cancellation or a terminal task state, else at the earlier of the task
//! deadline and 14 days (a 1-hour handoff on a non-persistent backend). An existing
//! shorter hold is never extended.

use chrono::{DateTime, Duration, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

/// How long a hold may last.
#[derive(Debug, Clone, Copy)]
pub struct HoldLimits {
    pub persistent: Duration,
    pub handoff: Duration,
}

impl Default for HoldLimits {
    fn default() -> Self {
        HoldLimits {
            persistent: Duration::days(14),
            handoff: Duration::hours(1),
        }
    }
}

/// When a new hold expires.
pub fn expiry(
    now: DateTime<Utc>,
    task_deadline: Option<DateTime<Utc>>,
    persistent_backend: bool,
    limits: HoldLimits,
) -> DateTime<Utc> {
    let limit = now
        + if persistent_backend {
            limits.persistent
        } else {
            limits.handoff
        };
    match task_deadline {
        Some(deadline) if deadline < limit => deadline,
        _ => limit,
    }
}

/// What a hold is on.
#[derive(Debug, Clone)]
pub struct HoldTarget<'a> {
    pub workspace_id: Uuid,
    pub run_id: Option<Uuid>,
    pub work_context: Option<Uuid>,
    pub agent: &'a str,
}

/// Holds a workspace until `expires_at`, or keeps the active hold it already has — an
/// existing hold is never extended. Returns the active hold's id.
pub async fn hold(
    conn: &mut PgConnection,
    target: &HoldTarget<'_>,
    reason: &str,
    expires_at: DateTime<Utc>,
) -> Result<Uuid, sqlx::Error> {
    take(conn, target, reason, expires_at, false).await
}

/// [`hold`] for a capture: the active hold (kept, or made with reason `capture`) is
/// marked with a capture in progress.
pub async fn hold_for_capture(
    conn: &mut PgConnection,
    target: &HoldTarget<'_>,
    expires_at: DateTime<Utc>,
) -> Result<Uuid, sqlx::Error> {
    take(conn, target, "capture", expires_at, true).await
}

/// Keeps the workspace's active hold (locked) or makes one, in one statement, and marks
/// it capturing when `capture` is set.
async fn take(
    conn: &mut PgConnection,
    target: &HoldTarget<'_>,
    reason: &str,
    expires_at: DateTime<Utc>,
    capture: bool,
) -> Result<Uuid, sqlx::Error> {
    sqlx::query_scalar(
        "WITH existing AS (SELECT id FROM holds WHERE workspace_id = $2 AND ended_at IS NULL
                             ORDER BY expires_at LIMIT 1 FOR UPDATE),
              marked AS (UPDATE holds SET capture_in_progress = TRUE
                          WHERE $8 AND id IN (SELECT id FROM existing)),
              made AS (INSERT INTO holds (id, workspace_id, run_id, work_context_id, agent, reason,
                                          expires_at, capture_in_progress)
                       SELECT $1, $2, $3, $4, $5, $6, $7, $8
                        WHERE NOT EXISTS (SELECT 1 FROM existing) RETURNING id)
         SELECT id FROM existing UNION ALL SELECT id FROM made",
    )
    .bind(Uuid::new_v4())
    .bind(target.workspace_id)
    .bind(target.run_id)
    .bind(target.work_context)
    .bind(target.agent)
    .bind(reason)
    .bind(expires_at)
    .bind(capture)
    .fetch_one(conn)
    .await
}

pub async fn set_capture_in_progress(
    conn: &mut PgConnection,
    hold_id: Uuid,
    in_progress: bool,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE holds SET capture_in_progress = $2 WHERE id = $1")
        .bind(hold_id)
        .bind(in_progress)
        .execute(conn)
        .await?;
    Ok(())
}

/// Ends a hold (idempotent).
pub async fn end(conn: &mut PgConnection, hold_id: Uuid, reason: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE holds SET ended_at = now(), end_reason = $2, capture_in_progress = FALSE WHERE id = $1 AND ended_at IS NULL")
        .bind(hold_id)
        .bind(reason)
        .execute(conn)
        .await?;
    Ok(())
}

/// Moves an active hold onto another workspace row (an adopted tree's new row), so the
/// tree is guarded without a gap. No capture of the new row is running yet.
pub async fn move_to(
    conn: &mut PgConnection,
    hold_id: Uuid,
    workspace_id: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE holds SET workspace_id = $2, capture_in_progress = FALSE WHERE id = $1 AND ended_at IS NULL",
    )
        .bind(hold_id)
        .bind(workspace_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Ends every active hold on a workspace (its task ended).
pub async fn end_for_workspace(
    conn: &mut PgConnection,
    workspace_id: Uuid,
    reason: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE holds SET ended_at = now(), end_reason = $2, capture_in_progress = FALSE WHERE workspace_id = $1 AND ended_at IS NULL")
        .bind(workspace_id)
        .bind(reason)
        .execute(conn)
        .await?;
    Ok(())
}

/// The holds of `workspaces` no longer say "capturing" once no capture of theirs is
/// in progress (the reaper failed the ones interrupted).
pub async fn captures_settled(
    conn: &mut PgConnection,
    workspaces: &[Uuid],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE holds h SET capture_in_progress = FALSE
          WHERE h.workspace_id = ANY($1) AND h.capture_in_progress AND h.ended_at IS NULL
            AND NOT EXISTS (SELECT 1 FROM project_snapshots p WHERE p.workspace_id = h.workspace_id
                              AND p.status IN ('creating', 'uploading'))",
    )
    .bind(workspaces)
    .execute(conn)
    .await?;
    Ok(())
}

/// Ends holds the reaper found due at `now`: `expired` past their expiry, else
/// `task_ended`; never one whose capture is in progress.
pub async fn end_due(
    conn: &mut PgConnection,
    ids: &[Uuid],
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE holds SET ended_at = $2,
                end_reason = CASE WHEN expires_at <= $2 THEN 'expired' ELSE 'task_ended' END
          WHERE id = ANY($1) AND ended_at IS NULL AND NOT capture_in_progress",
    )
    .bind(ids)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// Ends the holds on a sandbox's tree (its one workspace row).
pub async fn end_for_sandbox(
    conn: &mut PgConnection,
    sandbox_id: Uuid,
    reason: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE holds SET ended_at = now(), end_reason = $2
          WHERE ended_at IS NULL
            AND workspace_id = (SELECT workspace_id FROM sandboxes WHERE id = $1)",
    )
    .bind(sandbox_id)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// The active hold on a workspace, if any.
pub async fn active(
    conn: &mut PgConnection,
    workspace_id: Uuid,
) -> Result<Option<(Uuid, DateTime<Utc>)>, sqlx::Error> {
    sqlx::query_as("SELECT id, expires_at FROM holds WHERE workspace_id = $1 AND ended_at IS NULL AND expires_at > now()")
        .bind(workspace_id)
        .fetch_optional(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_bounded_by_the_deadline_and_the_backend() {
        let now = Utc::now();
        let limits = HoldLimits::default();
        assert_eq!(expiry(now, None, true, limits), now + Duration::days(14));
        assert_eq!(expiry(now, None, false, limits), now + Duration::hours(1));
        let soon = now + Duration::hours(3);
        assert_eq!(expiry(now, Some(soon), true, limits), soon);
        assert_eq!(
            expiry(now, Some(soon), false, limits),
            now + Duration::hours(1)
        );
    }
}
