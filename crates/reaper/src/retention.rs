//! The reaper's rules. Every rule works in batches, each batch one transaction over
//! rows locked `FOR UPDATE SKIP LOCKED`, and every change re-checks in its `WHERE` the
//! state it observed (compare-and-set), so a snapshot captured or restored between the
//! read and the write is left alone. A crash loses at most the batch in flight; the
//! next sweep redoes it. Time is the `now` passed in: the database's clock in the
//! binary (one clock for every rule, the workers' too), moved by tests.

use cairn_common::hold;
use cairn_common::lineage::retention;
use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
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
    /// A quarantined snapshot's bytes are kept this long after its quarantine, for
    /// whoever investigates it.
    pub quarantine_kept: Duration,
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
            quarantine_kept: Duration::days(30),
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
    /// Finished requests whose step output was deleted.
    pub outputs_reclaimed: u64,
    /// Finished requests whose output a store did not let go this sweep.
    pub outputs_failed: u64,
    /// Sandbox snapshots read back from another node than their writer's.
    pub snapshots_verified: u64,
    /// Sandbox snapshots that could not be read back whole (tried again next sweep).
    pub verify_failed: u64,
    pub dry_run: bool,
}

impl SweepReport {
    /// Adds the counts of `other` (one store's part of a sweep).
    pub fn add(&mut self, other: &SweepReport) {
        self.snapshots_reclaimed += other.snapshots_reclaimed;
        self.reclaim_deferred += other.reclaim_deferred;
        self.reclaim_failed += other.reclaim_failed;
        self.bytes_reclaimed += other.bytes_reclaimed;
    }
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

/// Where a sweep's batches commit: each to the database, or, in a dry run, each to a
/// savepoint of one transaction that is rolled back at the end. So a dry run changes
/// nothing, yet every rule (and every batch) sees what the ones before it would have
/// done, and the report is what one sweep would do, in order.
pub(crate) enum Batches<'a> {
    Pool(&'a PgPool),
    Dry(&'a mut PgConnection),
}

impl Batches<'_> {
    pub(crate) async fn begin(&mut self) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
        match self {
            Batches::Pool(pool) => pool.begin().await,
            Batches::Dry(conn) => sqlx::Connection::begin(&mut **conn).await,
        }
    }
}

impl Sweep<'_> {
    /// Runs every rule once, until none has more due rows.
    pub async fn run(&self) -> Result<SweepReport, sqlx::Error> {
        if !self.dry_run {
            return self.rules(&mut Batches::Pool(self.pool)).await;
        }
        let mut tx = self.pool.begin().await?;
        let report = self.rules(&mut Batches::Dry(&mut tx)).await;
        tx.rollback().await?;
        report
    }

    async fn rules(&self, batches: &mut Batches<'_>) -> Result<SweepReport, sqlx::Error> {
        let mut report = SweepReport {
            dry_run: self.dry_run,
            ..Default::default()
        };
        report.stale_captures_failed = self.repeat(batches, Rule::StaleCaptures).await?;
        report.credential_retired = self.repeat(batches, Rule::Credentials).await?;
        report.idle_heads_retired = self.repeat(batches, Rule::IdleHeads).await?;
        report.sandbox_retired = self.repeat(batches, Rule::Sandbox).await?;
        report.holds_ended = self.repeat(batches, Rule::Holds).await?;
        self.reclaim(batches, &mut report).await?;
        self.reclaim_outputs(batches, &mut report).await?;
        Ok(report)
    }

    /// Runs one batch rule until a batch finds less than a full batch.
    async fn repeat(&self, batches: &mut Batches<'_>, rule: Rule) -> Result<u64, sqlx::Error> {
        let mut total = 0;
        loop {
            let mut tx = batches.begin().await?;
            let n = match rule {
                Rule::StaleCaptures => self.stale_captures(&mut tx).await?,
                Rule::Credentials => self.credentials(&mut tx).await?,
                Rule::IdleHeads => self.idle_heads(&mut tx).await?,
                Rule::Sandbox => self.sandbox(&mut tx).await?,
                Rule::Holds => self.holds(&mut tx).await?,
            };
            total += n;
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
        let picked: Vec<Uuid> = sqlx::query_scalar(
            "SELECT p.id FROM project_snapshots p
               LEFT JOIN execution_requests e ON e.id = p.request_id
              WHERE p.status IN ('creating', 'uploading')
                AND (p.created_at <= $1
                     OR p.created_at <= $3 AND p.request_id IS NOT NULL
                        AND (e.lease_epoch IS DISTINCT FROM p.lease_epoch
                             OR e.lease_owner IS NULL
                             OR e.lease_deadline < clock_timestamp()))
              LIMIT $2 FOR UPDATE OF p SKIP LOCKED",
        )
        .bind(self.now - self.durations.stale_capture)
        .bind(self.batch)
        .bind(self.now - self.durations.abandoned_capture)
        .fetch_all(&mut *conn)
        .await?;
        if picked.is_empty() {
            return Ok(0);
        }
        let stale = retention::fail_interrupted(&mut *conn, &picked).await?;
        let workspaces: Vec<Uuid> = stale.iter().filter_map(|s| s.1).collect();
        hold::captures_settled(conn, &workspaces).await?;
        Ok(stale.len() as u64)
    }

    /// Rule 4: snapshots taken under a rotated credential generation leave reuse.
    async fn credentials(&self, conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
        self.retire_picked(
            conn,
            ("retired", "credentials_rotated"),
            "SELECT p.id FROM project_snapshots p JOIN credential_generations g ON g.agent = p.agent
              WHERE p.retention = 'current' AND p.credential_generation < g.generation
                AND p.status NOT IN ('creating', 'uploading', 'restoring')
                AND p.created_at <= $1",
            self.now,
        )
        .await
    }

    /// Rule 1: checkpoint heads neither captured nor restored for the idle period. A head
    /// of a live task is never retired, however long its step runs or its request waits
    /// (queued, executing or paused, stopped at its checkpoint, awaiting verification or
    /// a person): only a task whose every request ended lets its head go idle, and its
    /// idle clock counts from its last state change as well as from its last capture.
    async fn idle_heads(&self, conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
        let cutoff = self.now - self.durations.idle_head;
        let due: Vec<(Uuid, Uuid)> = sqlx::query_as(
            "SELECT h.work_context_id, s.id FROM lineage_heads h JOIN project_snapshots s ON s.id = h.head_id
              WHERE h.retired_at IS NULL AND s.last_used_at <= $1 AND s.status NOT IN ('creating', 'uploading', 'restoring')
                AND NOT EXISTS (SELECT 1 FROM runs r JOIN execution_requests e ON e.run_id = r.id
                                 WHERE r.work_context_id = h.work_context_id
                                   AND (e.state NOT IN ('completed', 'failed', 'cancelled')
                                        OR e.updated_at > $1))
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
        let done =
            cairn_common::lineage::retire_idle_heads(conn, &contexts, &heads, self.now, cutoff)
                .await?;
        Ok(done.max(contexts.len() as u64))
    }

    /// Rule 5: sandbox retention. The latest stop snapshot of a live workspace stays;
    /// older ones are superseded; named snapshots stay until deleted; the other
    /// snapshots of a destroyed sandbox (stop, fork, its checkpoints) go after the grace;
    /// memory checkpoints expire after the pause.
    async fn sandbox(&self, conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
        let superseded = self
            .retire_picked(
                conn,
                ("superseded", "newer_stop_snapshot"),
                "SELECT p.id FROM project_snapshots p
                  WHERE p.kind = 'stop' AND p.retention = 'current' AND p.status = 'ready'
                    AND p.created_at <= $1
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
                  WHERE (p.kind IN ('stop', 'memory', 'fork')
                         OR (p.kind = 'checkpoint' AND p.sandbox_id IS NOT NULL))
                    AND p.retention = 'current'
                    AND w.state = 'destroyed' AND w.destroyed_at <= $1
                    AND p.status NOT IN ('creating', 'uploading', 'restoring')",
                self.now - self.durations.destroyed_grace,
            )
            .await?;
        let memory = self
            .retire_picked(
                conn,
                ("retired", "memory_expired"),
                "SELECT p.id FROM project_snapshots p JOIN workspaces w ON w.id = p.workspace_id
                  WHERE p.kind = 'memory' AND p.retention = 'current' AND w.paused_at <= $1",
                self.now - self.durations.memory_checkpoint,
            )
            .await?;
        Ok(superseded + destroyed + memory)
    }

    /// Moves a batch of the current snapshots `pick` selects (`p.id`, with `$1` the
    /// cutoff) to `retention` for `reason`, skipping rows another sweep has locked.
    async fn retire_picked(
        &self,
        conn: &mut PgConnection,
        (retention, reason): (&str, &str),
        pick: &str,
        cutoff: DateTime<Utc>,
    ) -> Result<u64, sqlx::Error> {
        let picked: Vec<Uuid> =
            sqlx::query_scalar(&format!("{pick} LIMIT $2 FOR UPDATE OF p SKIP LOCKED"))
                .bind(cutoff)
                .bind(self.batch)
                .fetch_all(&mut *conn)
                .await?;
        if picked.is_empty() {
            return Ok(0);
        }
        retention::retire(conn, &picked, (retention, reason), self.now).await
    }

    /// Rule 3: holds past their expiry, or of cancelled and terminal tasks; never a hold
    /// whose capture is in progress.
    async fn holds(&self, conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
        let due: Vec<Uuid> = sqlx::query_scalar(
            "SELECT x.id FROM holds x LEFT JOIN runs r ON r.id = x.run_id
              WHERE x.ended_at IS NULL AND NOT x.capture_in_progress
                AND (x.expires_at <= $1 OR r.state IN ('completed', 'failed', 'cancelled'))
              LIMIT $2 FOR UPDATE OF x SKIP LOCKED",
        )
        .bind(self.now)
        .bind(self.batch)
        .fetch_all(&mut *conn)
        .await?;
        if due.is_empty() {
            return Ok(0);
        }
        hold::end_due(conn, &due, self.now).await
    }
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
    cairn_common::reaper_status::record_sweep(pool, started, report.dry_run, &summary).await
}
