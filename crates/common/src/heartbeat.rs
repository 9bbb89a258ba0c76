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
/// run of beats. `fresh` (a process that just started) always starts one. `starved_for`:
/// how long the worker has been waiting, with a free slot, for any delivery (`None`
/// when it is not waiting); it is recorded on the database's clock.
pub async fn beat(
    pool: &PgPool,
    worker_id: &str,
    fresh: bool,
    starved_for: Option<Duration>,
) -> Result<(), sqlx::Error> {
    let starved_ms = starved_for.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    sqlx::query(
        "INSERT INTO worker_heartbeats (worker_id, beat_at, beating_since, starved_since)
         VALUES ($1, clock_timestamp(), clock_timestamp(),
                 clock_timestamp() - $4 * interval '1 millisecond')
         ON CONFLICT (worker_id) DO UPDATE
            SET beating_since = CASE
                    WHEN $3 OR worker_heartbeats.beat_at < clock_timestamp() - $2 * interval '1 millisecond'
                    THEN clock_timestamp() ELSE worker_heartbeats.beating_since END,
                beat_at = clock_timestamp(),
                starved_since = clock_timestamp() - $4 * interval '1 millisecond'",
    )
    .bind(worker_id)
    .bind(i64::try_from(GAP.as_millis()).unwrap_or(i64::MAX))
    .bind(fresh)
    .bind(starved_ms)
    .execute(pool)
    .await?;
    Ok(())
}

/// Records what `worker_id` offers, once it has beaten: its job slots and, apart from
/// them, its sandbox slots.
pub async fn advertise_slots(
    pool: &PgPool,
    worker_id: &str,
    run_slots: u32,
    sandbox_slots: u32,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE worker_heartbeats SET run_slots = $2, sandbox_slots = $3 WHERE worker_id = $1",
    )
    .bind(worker_id)
    .bind(i32::try_from(run_slots).unwrap_or(i32::MAX))
    .bind(i32::try_from(sandbox_slots).unwrap_or(i32::MAX))
    .execute(pool)
    .await?;
    Ok(())
}

/// The workspaces directory this worker holds (its volumes' disk).
pub async fn advertise_directory(
    pool: &PgPool,
    worker_id: &str,
    directory: uuid::Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE worker_heartbeats SET directory_id = $2 WHERE worker_id = $1")
        .bind(worker_id)
        .bind(directory)
        .execute(pool)
        .await?;
    Ok(())
}

/// Where the scheduler sends this worker's preview requests, and the key they carry
/// (`None`: it takes none).
pub async fn advertise_previews(
    pool: &PgPool,
    worker_id: &str,
    preview: Option<(&str, &str)>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE worker_heartbeats SET preview_url = $2, preview_key = $3 WHERE worker_id = $1",
    )
    .bind(worker_id)
    .bind(preview.map(|p| p.0))
    .bind(preview.map(|p| p.1))
    .execute(pool)
    .await?;
    Ok(())
}

/// How long after its announcement a request still queued counts as parked, when a live
/// worker has waited for work all that time: far above a healthy delivery (milliseconds),
/// below the takeover bound.
pub const PARKED_AFTER: Duration = Duration::from_secs(3);

/// How long a worker must have waited for work, after a request's announcement, for
/// that request to count as parked elsewhere: a message in the queue reaches a waiting
/// consumer in milliseconds.
pub const STARVED_FOR: Duration = Duration::from_secs(1);

/// The SQL condition (over `execution_requests e`, `$parked` [`PARKED_AFTER`] in ms)
/// under which a queued request's delivery is parked on a worker that does not take it
/// (a request the flow-control gate still holds was never announced):
/// it was announced (`updated_at`) more than `$parked` ago and its message left the
/// outbox, yet
/// - a worker waited for any delivery, with a free slot, for [`STARVED_FOR`] after the
///   announcement and got none (RabbitMQ pushes a queued message to a waiting consumer at
///   once, so the message was no longer in the queue); or
/// - for a plain run, a run announced [`STARVED_FOR`] after it was claimed already (the
///   queue is first in, first out, so its message was delivered and not claimed).
pub fn parked_sql(parked: &str) -> String {
    format!(
        "e.state = 'queued' AND e.lease_owner IS NULL AND NOT e.held_by_gate
         AND e.updated_at < clock_timestamp() - {parked} * interval '1 millisecond'
         AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.published_at IS NULL
                          AND o.payload->>'request_id' = e.id::text)
         AND (EXISTS (SELECT 1 FROM worker_heartbeats w
                       -- A busy worker reports no starved_since, and GREATEST skips a
                       -- NULL: without the test, every busy worker would count as
                       -- starving, and a whole backlog would be announced again.
                       WHERE w.starved_since IS NOT NULL
                         AND w.beat_at >= GREATEST(w.starved_since, e.updated_at)
                                          + {later} * interval '1 millisecond')
              OR (e.kind = 'run'
                  AND NOT EXISTS (SELECT 1 FROM continuation_actions a
                                   WHERE a.request_id = e.id AND a.status = 'queued')
                  AND e.updated_at + {later} * interval '1 millisecond'
                      < (SELECT s.queued_at FROM execution_requests s
                          WHERE s.kind = 'run' AND s.state NOT IN ('queued', 'cancelled')
                          ORDER BY s.queued_at DESC LIMIT 1)))",
        later = STARVED_FOR.as_millis(),
    )
}

/// The SQL condition (over `execution_requests e`, `$lapse` the lapse in ms) under which
/// a request's owner is taken for dead: silent for the lapse, while another worker has
/// been beating without a gap all that time. The database was then reachable and the
/// owner did not reach it: it died, stalled or lost its network, and its writes are
/// fenced. A worker started since (a replacement pod) is evidence once it has beaten
/// for the lapse; after a database outage every worker's run of beats starts again, so
/// the owner beats again before anyone is evidence against it.
pub fn owner_silent_sql(lapse: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM worker_heartbeats w
                  WHERE w.worker_id = e.lease_owner
                    AND w.beat_at < clock_timestamp() - {lapse} * interval '1 millisecond'
                    AND EXISTS (SELECT 1 FROM worker_heartbeats o
                                 WHERE o.worker_id <> w.worker_id
                                   AND o.beat_at >= clock_timestamp() - {lapse} * interval '1 millisecond'
                                   AND o.beating_since <= clock_timestamp() - {lapse} * interval '1 millisecond'))"
    )
}
