//! Worker heartbeats: how the lease sweeper tells a dead worker from a slow one long
//! before its leases expire. A worker beats every [`INTERVAL`]; its requests are taken
//! over once it has been silent for [`LAPSE`] while another worker kept beating (see
//! migration `0009_worker_heartbeats.sql`). The fencing epoch stays the only safety
//! mechanism: a silent worker that comes back finds its writes refused.

use sqlx::PgPool;
use std::time::Duration;

/// How often a worker beats.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// How long a worker may be silent before its requests are taken over (five missed
/// beats: a worker that is merely slow keeps beating from its own task).
pub const LAPSE: Duration = Duration::from_secs(5);

/// The longest gap a run of beats continues across (two missed beats). Much shorter
/// than the lapse: after a database outage longer than this, every worker's run starts
/// again, so no worker is evidence against another that fell silent before it.
pub const GAP: Duration = Duration::from_secs(2);

/// The lapse in milliseconds, as the sweeper's SQL binds it.
pub fn lapse_ms() -> i64 {
    i64::try_from(LAPSE.as_millis()).unwrap_or(i64::MAX)
}

/// Records a beat of `worker_id`; a beat after a gap longer than [`GAP`] starts a new
/// run of beats. `fresh` (a process that just started) always starts one.
pub async fn beat(pool: &PgPool, worker_id: &str, fresh: bool) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO worker_heartbeats (worker_id, beat_at, beating_since)
         VALUES ($1, clock_timestamp(), clock_timestamp())
         ON CONFLICT (worker_id) DO UPDATE
            SET beating_since = CASE
                    WHEN $3 OR worker_heartbeats.beat_at < clock_timestamp() - $2 * interval '1 millisecond'
                    THEN clock_timestamp() ELSE worker_heartbeats.beating_since END,
                beat_at = clock_timestamp()",
    )
    .bind(worker_id)
    .bind(i64::try_from(GAP.as_millis()).unwrap_or(i64::MAX))
    .bind(fresh)
    .execute(pool)
    .await?;
    Ok(())
}

/// The SQL condition (over `execution_requests e`, `$lapse` the lapse in ms) under which
/// a request's owner is taken for dead: silent for the lapse, while another worker has
/// been beating without a gap since before the owner's last beat.
pub fn owner_silent_sql(lapse: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM worker_heartbeats w
                  WHERE w.worker_id = e.lease_owner
                    AND w.beat_at < clock_timestamp() - {lapse} * interval '1 millisecond'
                    AND EXISTS (SELECT 1 FROM worker_heartbeats o
                                 WHERE o.worker_id <> w.worker_id
                                   AND o.beat_at >= clock_timestamp() - {lapse} * interval '1 millisecond'
                                   AND o.beating_since <= w.beat_at))"
    )
}
