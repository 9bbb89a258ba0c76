//! The reaper's rules. Every rule works in batches, each batch one transaction over
//! rows locked `FOR UPDATE SKIP LOCKED`, and every change re-checks in its `WHERE` the
//! state it observed (compare-and-set), so a snapshot captured or restored between the
//! read and the write is left alone. A crash loses at most the batch in flight; the
//! next sweep redoes it. Time is the `now` passed in, so tests can move it.

use cairn_snapshot as snapshot;
use cairn_snapshot::store::ArtifactStore;
use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use std::collections::HashMap;
use uuid::Uuid;

/// Every duration of the rules; the defaults are the product's.
#[derive(Debug, Clone)]
pub struct Durations {
    pub idle_head: Duration,
    pub reclaim_after: Duration,
    pub destroyed_grace: Duration,
    pub memory_checkpoint: Duration,
    pub repair_backoff_max: Duration,
    /// A capture still `creating` or `uploading` after this long was interrupted.
    pub stale_capture: Duration,
    /// A capture whose owner's lease can no longer commit it is abandoned this long
    /// after it started.
    pub abandoned_capture: Duration,
}

impl Default for Durations {
    fn default() -> Self {
        Durations {
            idle_head: Duration::days(14),
            reclaim_after: Duration::days(7),
            destroyed_grace: Duration::hours(24),
            memory_checkpoint: Duration::hours(72),
            repair_backoff_max: Duration::hours(24),
            stale_capture: Duration::hours(6),
            abandoned_capture: Duration::minutes(1),
        }
    }
}

/// What one sweep did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    pub idle_heads_retired: u64,
    pub snapshots_reclaimed: u64,
    pub reclaim_deferred: u64,
    pub reclaim_failed: u64,
    pub bytes_reclaimed: u64,
    pub holds_ended: u64,
    pub credential_retired: u64,
    pub sandbox_retired: u64,
    pub stale_captures_failed: u64,
    pub dry_run: bool,
}

#[derive(Debug, Clone, Copy)]
enum Rule {
    StaleCaptures,
    Credentials,
    IdleHeads,
    Sandbox,
    Holds,
}

pub struct Sweep<'a> {
    pub pool: &'a PgPool,
    pub now: DateTime<Utc>,
    pub durations: &'a Durations,
    pub batch: i64,
    pub dry_run: bool,
}

impl Sweep<'_> {
    /// Runs every rule once, until none has more due rows.
    pub async fn run(&self) -> Result<SweepReport, sqlx::Error> {
        let mut report = SweepReport {
            dry_run: self.dry_run,
            ..Default::default()
        };
        report.stale_captures_failed = self.repeat(Rule::StaleCaptures).await?;
        report.credential_retired = self.repeat(Rule::Credentials).await?;
        report.idle_heads_retired = self.repeat(Rule::IdleHeads).await?;
        report.sandbox_retired = self.repeat(Rule::Sandbox).await?;
        report.holds_ended = self.repeat(Rule::Holds).await?;
        self.reclaim(&mut report).await?;
        Ok(report)
    }

    /// Runs one batch rule until a batch finds less than a full batch. A dry run rolls
    /// its batch back and runs each rule once.
    async fn repeat(&self, rule: Rule) -> Result<u64, sqlx::Error> {
        let mut total = 0;
        loop {
            let mut tx = self.pool.begin().await?;
            let n = match rule {
                Rule::StaleCaptures => self.stale_captures(&mut tx).await?,
                Rule::Credentials => self.credentials(&mut tx).await?,
                Rule::IdleHeads => self.idle_heads(&mut tx).await?,
                Rule::Sandbox => self.sandbox(&mut tx).await?,
                Rule::Holds => self.holds(&mut tx).await?,
            };
            total += n;
            if self.dry_run {
                tx.rollback().await?;
                return Ok(total);
            }
            tx.commit().await?;
            if (n as i64) < self.batch {
                return Ok(total);
            }
        }
    }

    /// A capture interrupted for good fails, so it no longer defers reclamation in its
    /// store, and its hold is no longer "capturing" (the hold itself stays until it
    /// expires: the live tree may still be on its host). Interrupted for good: its owner
    /// can no longer commit it (the request's lease epoch moved on, or its lease lapsed:
    /// a fenced write would be refused), or it is older than the stale limit.
    async fn stale_captures(&self, conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
        let stale: Vec<(Uuid, Option<Uuid>)> = sqlx::query_as(
            "UPDATE project_snapshots SET status = 'failed', retire_reason = 'capture_interrupted'
              WHERE id IN (SELECT p.id FROM project_snapshots p
                             LEFT JOIN execution_requests e ON e.id = p.request_id
                            WHERE p.status IN ('creating', 'uploading')
                              AND (p.created_at <= $1
                                   OR p.created_at <= $3 AND p.request_id IS NOT NULL
                                      AND (e.lease_epoch IS DISTINCT FROM p.lease_epoch
                                           OR e.lease_owner IS NULL
                                           OR e.lease_deadline < clock_timestamp()))
                            LIMIT $2 FOR UPDATE OF p SKIP LOCKED)
                AND status IN ('creating', 'uploading')
          RETURNING id, workspace_id",
        )
        .bind(self.now - self.durations.stale_capture)
        .bind(self.batch)
        .bind(self.now - self.durations.abandoned_capture)
        .fetch_all(&mut *conn)
        .await?;
        let workspaces: Vec<Uuid> = stale.iter().filter_map(|s| s.1).collect();
        sqlx::query(
            "UPDATE holds h SET capture_in_progress = FALSE
              WHERE h.workspace_id = ANY($1) AND h.capture_in_progress AND h.ended_at IS NULL
                AND NOT EXISTS (SELECT 1 FROM project_snapshots p WHERE p.workspace_id = h.workspace_id
                                  AND p.status IN ('creating', 'uploading'))",
        )
        .bind(&workspaces)
        .execute(conn)
        .await?;
        Ok(stale.len() as u64)
    }

    /// Rule 4: snapshots taken under a rotated credential generation leave reuse.
    async fn credentials(&self, conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE project_snapshots s SET retention = 'retired', retired_at = $1, retire_reason = 'credentials_rotated'
              WHERE s.id IN (
                    SELECT p.id FROM project_snapshots p JOIN credential_generations g ON g.agent = p.agent
                     WHERE p.retention = 'current' AND p.credential_generation < g.generation
                       AND p.status NOT IN ('creating', 'uploading', 'restoring')
                     LIMIT $2 FOR UPDATE OF p SKIP LOCKED)
                AND s.retention = 'current'",
        )
        .bind(self.now)
        .bind(self.batch)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    /// Rule 1: checkpoint heads neither captured nor restored for the idle period. A head
    /// of a live task is never retired, however long its step runs or its request waits
    /// (queued, executing or paused, stopped at its checkpoint, awaiting verification or
    /// a person): only a task whose every request ended lets its head go idle.
    async fn idle_heads(&self, conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
        let cutoff = self.now - self.durations.idle_head;
        let due: Vec<(Uuid, Uuid)> = sqlx::query_as(
            "SELECT h.work_context_id, s.id FROM lineage_heads h JOIN project_snapshots s ON s.id = h.head_id
              WHERE h.retired_at IS NULL AND s.last_used_at <= $1 AND s.status NOT IN ('creating', 'uploading', 'restoring')
                AND NOT EXISTS (SELECT 1 FROM runs r JOIN execution_requests e ON e.run_id = r.id
                                 WHERE r.work_context_id = h.work_context_id
                                   AND e.state NOT IN ('completed', 'failed', 'cancelled'))
              ORDER BY s.last_used_at LIMIT $2 FOR UPDATE OF h, s SKIP LOCKED",
        )
        .bind(cutoff)
        .bind(self.batch)
        .fetch_all(&mut *conn)
        .await?;
        if due.is_empty() {
            return Ok(0);
        }
        let (contexts, heads): (Vec<Uuid>, Vec<Uuid>) = due.into_iter().unzip();
        sqlx::query("UPDATE lineage_heads SET retired_at = $2 WHERE work_context_id = ANY($1) AND retired_at IS NULL")
            .bind(&contexts)
            .bind(self.now)
            .execute(&mut *conn)
            .await?;
        let done = sqlx::query(
            "UPDATE project_snapshots SET retention = 'retired', retired_at = $2, retire_reason = 'idle'
              WHERE id = ANY($1) AND retention = 'current' AND last_used_at <= $3",
        )
        .bind(&heads)
        .bind(self.now)
        .bind(cutoff)
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected().max(contexts.len() as u64))
    }

    /// Rule 5: sandbox retention. The latest stop snapshot of a live workspace stays;
    /// older ones are superseded; named snapshots stay until deleted; snapshots of a
    /// destroyed workspace go after the grace; memory checkpoints expire after the pause.
    async fn sandbox(&self, conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
        let superseded = self
            .retire_picked(
                conn,
                ("superseded", "newer_stop_snapshot"),
                "SELECT p.id FROM project_snapshots p
                  WHERE p.kind = 'stop' AND p.retention = 'current' AND p.status = 'ready'
                    AND p.created_at <= $3
                    AND EXISTS (SELECT 1 FROM project_snapshots n WHERE n.workspace_id = p.workspace_id
                                  AND n.kind = 'stop' AND n.status = 'ready' AND n.created_at > p.created_at)",
                self.now,
            )
            .await?;
        let destroyed = self
            .retire_picked(
                conn,
                ("retired", "workspace_destroyed"),
                "SELECT p.id FROM project_snapshots p JOIN workspaces w ON w.id = p.workspace_id
                  WHERE p.kind IN ('stop', 'memory') AND p.retention = 'current'
                    AND w.state = 'destroyed' AND w.destroyed_at <= $3
                    AND p.status NOT IN ('creating', 'uploading', 'restoring')",
                self.now - self.durations.destroyed_grace,
            )
            .await?;
        let memory = self
            .retire_picked(
                conn,
                ("retired", "memory_expired"),
                "SELECT p.id FROM project_snapshots p JOIN workspaces w ON w.id = p.workspace_id
                  WHERE p.kind = 'memory' AND p.retention = 'current' AND w.paused_at <= $3",
                self.now - self.durations.memory_checkpoint,
            )
            .await?;
        Ok(superseded + destroyed + memory)
    }

    /// Moves a batch of the current snapshots `pick` selects (`p.id`, with `$3` the
    /// cutoff) to `retention` for `reason`, skipping rows another sweep has locked.
    async fn retire_picked(
        &self,
        conn: &mut PgConnection,
        (retention, reason): (&str, &str),
        pick: &str,
        cutoff: DateTime<Utc>,
    ) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(&format!(
            "UPDATE project_snapshots s SET retention = $4, retired_at = $1, retire_reason = $5
              WHERE s.id IN ({pick} LIMIT $2 FOR UPDATE OF p SKIP LOCKED)
                AND s.retention = 'current'"
        ))
        .bind(self.now)
        .bind(self.batch)
        .bind(cutoff)
        .bind(retention)
        .bind(reason)
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }

    /// Rule 3: holds past their expiry, or of cancelled and terminal tasks; never a hold
    /// whose capture is in progress.
    async fn holds(&self, conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE holds h SET ended_at = $1,
                    end_reason = CASE WHEN h.expires_at <= $1 THEN 'expired' ELSE 'task_ended' END
              WHERE h.id IN (
                    SELECT x.id FROM holds x LEFT JOIN runs r ON r.id = x.run_id
                     WHERE x.ended_at IS NULL AND NOT x.capture_in_progress
                       AND (x.expires_at <= $1 OR r.state IN ('completed', 'failed', 'cancelled'))
                     LIMIT $2 FOR UPDATE OF x SKIP LOCKED)
                AND h.ended_at IS NULL AND NOT h.capture_in_progress",
        )
        .bind(self.now)
        .bind(self.batch)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    /// Rules 2, 6 and 7: delete the bytes of retired, superseded and failed snapshots
    /// once their retention window has passed, through the store each snapshot records.
    /// A pack goes only when no other manifest of its store references it, and not while
    /// a capture of that store is in progress. What cannot be deleted waits for repair,
    /// retried with backoff.
    async fn reclaim(&self, report: &mut SweepReport) -> Result<(), sqlx::Error> {
        let window = self.now - self.durations.reclaim_after;
        loop {
            let mut tx = self.pool.begin().await?;
            let due: Vec<(Uuid, String, i32)> = sqlx::query_as(
                "SELECT id, store_url, repair_attempts FROM project_snapshots
                  WHERE status <> 'deleted'
                    AND ((retention IN ('retired', 'superseded') OR status IN ('failed', 'quarantined'))
                         AND (COALESCE(retired_at, created_at) <= $1
                              OR retire_reason IN ('workspace_destroyed', 'memory_expired'))
                         AND status NOT IN ('creating', 'uploading', 'restoring')
                      OR retention = 'pending_operator_repair' AND next_repair_at <= $2)
                  LIMIT $3 FOR UPDATE SKIP LOCKED",
            )
            .bind(window)
            .bind(self.now)
            .bind(self.batch)
            .fetch_all(&mut *tx)
            .await?;
            let found = due.len() as i64;
            let mut by_store: HashMap<String, Vec<(Uuid, i32)>> = HashMap::new();
            for (id, store, attempts) in due {
                by_store.entry(store).or_default().push((id, attempts));
            }
            let mut progressed = false;
            for (store_url, snapshots) in by_store {
                progressed |= self
                    .reclaim_store(&mut tx, &store_url, &snapshots, report)
                    .await?;
            }
            if self.dry_run {
                tx.rollback().await?;
                return Ok(());
            }
            tx.commit().await?;
            if found < self.batch || !progressed {
                return Ok(());
            }
        }
    }

    async fn reclaim_store(
        &self,
        conn: &mut PgConnection,
        store_url: &str,
        snapshots: &[(Uuid, i32)],
        report: &mut SweepReport,
    ) -> Result<bool, sqlx::Error> {
        let ids: Vec<Uuid> = snapshots.iter().map(|s| s.0).collect();
        // New captures of this store wait while packs are deleted; running ones defer it.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(store_url)
            .execute(&mut *conn)
            .await?;
        let capturing: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM project_snapshots WHERE store_url = $1 AND status IN ('creating', 'uploading'))",
        )
        .bind(store_url)
        .fetch_one(&mut *conn)
        .await?;
        if capturing {
            report.reclaim_deferred += ids.len() as u64;
            return Ok(false);
        }
        // A pack (or, for snapshots of the first format, a chunk object) goes only when
        // no other live snapshot of this store references it.
        let orphan_packs: Vec<Uuid> =
            orphans(&mut *conn, "snapshot_packs", "pack_id", &ids, store_url).await?;
        let orphan_chunks: Vec<String> =
            orphans(&mut *conn, "snapshot_chunks", "chunk_id", &ids, store_url).await?;
        if self.dry_run {
            report.snapshots_reclaimed += ids.len() as u64;
            return Ok(true);
        }
        match delete_objects(store_url, &ids, &orphan_packs, &orphan_chunks).await {
            Ok(bytes) => {
                for table in ["snapshot_packs", "snapshot_chunks"] {
                    sqlx::query(&format!("DELETE FROM {table} WHERE snapshot_id = ANY($1)"))
                        .bind(&ids)
                        .execute(&mut *conn)
                        .await?;
                }
                let done = sqlx::query(
                    "UPDATE project_snapshots SET status = 'deleted', retention = 'reclaimed', repair_reason = NULL,
                            next_repair_at = NULL
                      WHERE id = ANY($1) AND status <> 'deleted'",
                )
                .bind(&ids)
                .execute(&mut *conn)
                .await?;
                report.snapshots_reclaimed += done.rows_affected();
                report.bytes_reclaimed += bytes;
                Ok(true)
            }
            Err(reason) => {
                tracing::warn!(store = store_url, %reason, count = ids.len(), "cannot reclaim; pending operator repair");
                for (id, attempts) in snapshots {
                    let minutes = 1i64 << (*attempts).clamp(0, 20);
                    let wait = Duration::minutes(minutes).min(self.durations.repair_backoff_max);
                    sqlx::query(
                        "UPDATE project_snapshots SET retention = 'pending_operator_repair', repair_reason = $2,
                                repair_attempts = repair_attempts + 1, next_repair_at = $3
                          WHERE id = $1 AND status <> 'deleted'",
                    )
                    .bind(id)
                    .bind(&reason)
                    .bind(self.now + wait)
                    .execute(&mut *conn)
                    .await?;
                }
                report.reclaim_failed += ids.len() as u64;
                Ok(true)
            }
        }
    }
}

/// Deletes manifests and orphan packs through the store the snapshots name (never the
/// current configuration). A pack's index goes before the pack, so no capture can find
/// a chunk in a pack that is gone. Returns the bytes freed.
async fn delete_objects(
    store_url: &str,
    snapshots: &[Uuid],
    packs: &[Uuid],
    legacy_chunks: &[String],
) -> Result<u64, String> {
    // Never create a missing local store: an empty directory would look "deleted".
    let store = ArtifactStore::open_existing(store_url).map_err(|e| e.to_string())?;
    let mut keys: Vec<String> = snapshots
        .iter()
        .flat_map(|id| {
            [
                snapshot::manifest_key(*id),
                snapshot::legacy_manifest_key(*id),
            ]
        })
        .collect();
    keys.extend(
        packs
            .iter()
            .flat_map(|p| [snapshot::index_key(*p), snapshot::pack_key(*p)]),
    );
    keys.extend(legacy_chunks.iter().map(|c| snapshot::legacy_chunk_key(c)));
    let mut bytes = 0;
    for key in keys {
        bytes += store
            .size(&key)
            .await
            .map_err(|e| e.to_string())?
            .unwrap_or(0);
        store.delete(&key).await.map_err(|e| e.to_string())?;
    }
    Ok(bytes)
}

/// The objects (`column` of `table`) the snapshots `ids` reference that no other live
/// snapshot of the store references.
async fn orphans<T>(
    conn: &mut PgConnection,
    table: &str,
    column: &str,
    ids: &[Uuid],
    store_url: &str,
) -> Result<Vec<T>, sqlx::Error>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar(&format!(
        "SELECT DISTINCT c.{column} FROM {table} c
          WHERE c.snapshot_id = ANY($1)
            AND NOT EXISTS (SELECT 1 FROM {table} o JOIN project_snapshots p ON p.id = o.snapshot_id
                             WHERE o.{column} = c.{column} AND NOT (o.snapshot_id = ANY($1))
                               AND p.store_url = $2 AND p.status <> 'deleted')"
    ))
    .bind(ids)
    .bind(store_url)
    .fetch_all(conn)
    .await
}

/// Records a sweep for `cairnctl reaper status`.
pub async fn record_sweep(
    pool: &PgPool,
    started: DateTime<Utc>,
    report: &SweepReport,
    leader: &str,
) -> Result<(), sqlx::Error> {
    let mut summary = serde_json::to_value(report).unwrap_or_default();
    summary["leader"] = serde_json::Value::from(leader);
    sqlx::query("INSERT INTO sweeps (component, started_at, finished_at, dry_run, summary) VALUES ('reaper', $1, now(), $2, $3)")
        .bind(started)
        .bind(report.dry_run)
        .bind(summary)
        .execute(pool)
        .await?;
    Ok(())
}
