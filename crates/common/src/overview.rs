//! The fleet overview's samples (`overview_samples`): one row per interval, taken by the
//! scheduler that leads the sampler, kept for a day and read by `GET /api/v1/overview`.
//! Each sample is read from the tables themselves, so every scheduler shows the same
//! series and a restart loses none of it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

/// How long samples are kept.
pub const KEPT_HOURS: i64 = 24;

/// The fleet over one interval, ending at `at`.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Sample {
    pub at: DateTime<Utc>,
    pub interval_seconds: i32,
    /// Runs that ended in the interval, by how.
    pub completed: i32,
    pub failed: i32,
    pub cancelled: i32,
    /// Runs standing at the end of the interval: queued (of which held by flow control),
    /// running, and waiting for a person (reconciliation, a checkpoint's review, a
    /// verification).
    pub queued: i32,
    pub held: i32,
    pub running: i32,
    pub needs_person: i32,
    pub workers: i32,
    /// From admission to a worker's claim, of the runs' requests claimed in the interval
    /// (a run queued again counts from its admission).
    pub admission_to_start_p50_ms: Option<f64>,
    pub admission_to_start_p95_ms: Option<f64>,
}

/// Records the sample of the last whole interval of `interval_seconds` (aligned on the
/// epoch, by the database's clock). Returns whether it was new: one a standby already
/// recorded, before leadership moved, is kept as it is.
pub async fn record(pool: &PgPool, interval_seconds: i32) -> Result<bool, sqlx::Error> {
    // The bounds are read first and bound as values, and the ended runs' requests are
    // looked up run by run: computed inside the statement, the bounds left the planner
    // unable to tell how few runs an interval holds, and it hashed every request the
    // database keeps at each sample.
    let (lo, hi): (DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
        "SELECT date_bin(make_interval(secs => $1), now(), 'epoch'::timestamptz)
                  - make_interval(secs => $1),
                date_bin(make_interval(secs => $1), now(), 'epoch'::timestamptz)",
    )
    .bind(interval_seconds)
    .fetch_one(pool)
    .await?;
    let inserted = sqlx::query(
        "WITH ended AS (
              SELECT count(*) FILTER (WHERE r.state = 'completed') AS completed,
                     count(*) FILTER (WHERE r.state = 'failed') AS failed,
                     count(*) FILTER (WHERE r.state = 'cancelled') AS cancelled
                FROM runs r WHERE r.finished_at > $3 AND r.finished_at <= $4),
         standing AS (
              SELECT count(*) FILTER (WHERE state = 'queued') AS queued,
                     count(*) FILTER (WHERE state = 'running') AS running,
                     count(*) FILTER (WHERE state IN ('needs_reconciliation', 'stopped_at_checkpoint',
                                                      'awaiting_verification')) AS needs_person
                FROM runs
               WHERE state IN ('queued', 'running', 'needs_reconciliation', 'stopped_at_checkpoint',
                               'awaiting_verification')),
         -- Claimed in the interval: still executing, or a run that has ended since,
         -- within the interval or after it, before this sample (its requests looked up
         -- run by run, never by hashing them all). The sample is taken within an
         -- interval of its end: the bound above keeps the planner's estimate small (with
         -- none, a generic plan expects a third of all runs and compiles itself with
         -- JIT at each sample).
         waits AS (
              SELECT (extract(epoch FROM e.claimed_at - e.admitted_at) * 1000)::float8 AS ms
                FROM execution_requests e
               WHERE e.state = 'executing' AND e.kind = 'run'
                 AND e.claimed_at > $3 AND e.claimed_at <= $4
              UNION ALL
              SELECT (extract(epoch FROM e.claimed_at - e.admitted_at) * 1000)::float8
                FROM runs r,
                     LATERAL (SELECT e.claimed_at, e.admitted_at FROM execution_requests e
                               WHERE e.run_id = r.id AND e.kind = 'run'
                                 AND e.claimed_at > $3 AND e.claimed_at <= $4
                              OFFSET 0) e
               WHERE r.finished_at > $3 AND r.finished_at <= $4 + make_interval(secs => $1))
         INSERT INTO overview_samples
              (at, interval_seconds, completed, failed, cancelled, queued, held, running,
               needs_person, workers, admission_to_start_p50_ms, admission_to_start_p95_ms)
         SELECT $4, $1, ended.completed, ended.failed, ended.cancelled, standing.queued,
                (SELECT count(*) FROM execution_requests
                  WHERE held_by_gate AND state = 'queued' AND kind = 'run'),
                standing.running, standing.needs_person,
                (SELECT count(*) FROM worker_heartbeats
                  WHERE beat_at > now() - make_interval(secs => $2)),
                (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) FROM waits),
                (SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY ms) FROM waits)
           FROM ended, standing
         ON CONFLICT (at) DO NOTHING",
    )
    .bind(interval_seconds)
    .bind(crate::heartbeat::LAPSE.as_secs_f64())
    .bind(lo)
    .bind(hi)
    .execute(pool)
    .await?
    .rows_affected();
    sqlx::query(
        "DELETE FROM overview_samples WHERE at < now() - make_interval(hours => $1::integer)",
    )
    .bind(KEPT_HOURS as i32)
    .execute(pool)
    .await?;
    Ok(inserted == 1)
}

/// The samples of the last `minutes`, oldest first.
pub async fn since(pool: &PgPool, minutes: i32) -> Result<Vec<Sample>, sqlx::Error> {
    sqlx::query_as(
        "SELECT at, interval_seconds, completed, failed, cancelled, queued, held, running,
                needs_person, workers, admission_to_start_p50_ms, admission_to_start_p95_ms
           FROM overview_samples
          WHERE at > now() - make_interval(mins => $1)
          ORDER BY at",
    )
    .bind(minutes)
    .fetch_all(pool)
    .await
}
