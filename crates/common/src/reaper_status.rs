//! What operators read of the reaper (`cairnctl reaper status|pending`, the console's
//! Operations page): its last sweeps, and the artifacts that wait for repair.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// Records a reaper sweep: when it started, whether it was a dry run, and its summary.
pub async fn record_sweep(
    pool: &PgPool,
    started: DateTime<Utc>,
    dry_run: bool,
    summary: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO sweeps (component, started_at, finished_at, dry_run, summary)
         VALUES ('reaper', $1, now(), $2, $3)",
    )
    .bind(started)
    .bind(dry_run)
    .bind(summary)
    .execute(pool)
    .await?;
    Ok(())
}

/// One recorded sweep.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SweepRecord {
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub dry_run: bool,
    /// What each rule did (the sweep's report), and who led.
    pub summary: serde_json::Value,
}

/// The last `limit` sweeps, newest first.
pub async fn recent_sweeps(pool: &PgPool, limit: i64) -> Result<Vec<SweepRecord>, sqlx::Error> {
    sqlx::query_as(
        "SELECT started_at, finished_at, dry_run, summary FROM sweeps
          WHERE component = 'reaper' ORDER BY id DESC LIMIT $1",
    )
    .bind(limit.clamp(1, 1000))
    .fetch_all(pool)
    .await
}

/// A snapshot whose bytes could not be deleted yet.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingRepair {
    pub snapshot_id: Uuid,
    pub kind: String,
    pub store_url: String,
    pub reason: Option<String>,
    pub attempts: i32,
    pub next_retry_at: Option<DateTime<Utc>>,
}

/// Every snapshot waiting for repair, the next to be retried first.
pub async fn pending_repairs(pool: &PgPool) -> Result<Vec<PendingRepair>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id AS snapshot_id, kind, store_url, repair_reason AS reason,
                repair_attempts AS attempts, next_repair_at AS next_retry_at
           FROM project_snapshots
          WHERE retention = 'pending_operator_repair' ORDER BY next_repair_at",
    )
    .fetch_all(pool)
    .await
}
