//! The gate: flow control of runs that name a concurrency key, a rate limit or a
//! priority. Their requests are admitted `held_by_gate`, with no announcement. Each pass
//! of the scheduler's gate (one leader) releases, in one transaction, the held requests
//! that may start now, highest effective priority first, then oldest:
//!
//! - at most `concurrency_limit` requests of a key are out of the gate and not yet
//!   ended (queued for a worker, or executing: a request whose worker died keeps its
//!   slot until the sweeper queues it again, so the limit holds under worker loss);
//! - at most `rate_per_second` requests of a rate key were released in the last second;
//! - no more than the live workers' free run slots (their advertised slots, less every
//!   run request queued for them or executing).
//!
//! A held request's priority rises by one for every [`AGING_SECONDS`] it waits, so a
//! low one is never starved by a stream of higher ones.

use crate::outbox;
use crate::run::{JobKind, JobMessage};
use sqlx::PgConnection;
use std::collections::HashMap;
use uuid::Uuid;

/// A waiting run gains one priority step every this many seconds.
pub const AGING_SECONDS: f64 = 10.0;

#[derive(Debug, sqlx::FromRow)]
struct Held {
    id: Uuid,
    run_id: Uuid,
    attempt: i32,
    concurrency_key: Option<String>,
    concurrency_limit: Option<i32>,
    rate_key: Option<String>,
    rate_per_second: Option<i32>,
}

/// What a pass released.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub released: usize,
    /// Held requests it looked at and left waiting.
    pub waiting: usize,
}

/// One pass of the gate, in the caller's transaction: releases what may start now (at
/// most `batch` requests) and announces it through the outbox.
pub async fn pass(conn: &mut PgConnection, batch: i64) -> Result<Pass, sqlx::Error> {
    let held: Vec<Held> = sqlx::query_as(
        "SELECT e.id, e.run_id, e.attempt, r.concurrency_key, r.concurrency_limit, r.rate_key,
                r.rate_per_second
           FROM execution_requests e JOIN runs r ON r.id = e.run_id
          WHERE e.held_by_gate AND e.state = 'queued'
          ORDER BY COALESCE(r.priority, 0) + floor(EXTRACT(EPOCH FROM now() - e.queued_at) / $1) DESC,
                   e.queued_at, e.id
          LIMIT $2
            FOR UPDATE OF e SKIP LOCKED",
    )
    .bind(AGING_SECONDS)
    .bind(batch)
    .fetch_all(&mut *conn)
    .await?;
    if held.is_empty() {
        return Ok(Pass::default());
    }
    let mut running = counts(&mut *conn, CONCURRENT).await?;
    let mut started = counts(&mut *conn, STARTED_LAST_SECOND).await?;
    let mut free = free_slots(&mut *conn).await?;
    let mut released = Vec::new();
    for h in &held {
        if free <= 0 {
            break;
        }
        let key_full = h.concurrency_key.as_ref().is_some_and(|k| {
            running.get(k).copied().unwrap_or(0) >= i64::from(h.concurrency_limit.unwrap_or(1))
        });
        let rate_full = h.rate_key.as_ref().is_some_and(|k| {
            started.get(k).copied().unwrap_or(0) >= i64::from(h.rate_per_second.unwrap_or(1))
        });
        if key_full || rate_full {
            continue;
        }
        if let Some(k) = &h.concurrency_key {
            *running.entry(k.clone()).or_default() += 1;
        }
        if let Some(k) = &h.rate_key {
            *started.entry(k.clone()).or_default() += 1;
        }
        free -= 1;
        released.push(h);
    }
    release(conn, &released).await?;
    Ok(Pass {
        released: released.len(),
        waiting: held.len() - released.len(),
    })
}

/// Requests of each concurrency key out of the gate and not ended.
const CONCURRENT: &str =
    "SELECT r.concurrency_key, count(*) FROM execution_requests e JOIN runs r ON r.id = e.run_id
  WHERE r.concurrency_key IS NOT NULL AND e.kind = 'run' AND NOT e.held_by_gate
    AND e.state IN ('queued', 'executing')
  GROUP BY 1";

/// Requests of each rate key released in the last second.
const STARTED_LAST_SECOND: &str =
    "SELECT r.rate_key, count(*) FROM execution_requests e JOIN runs r ON r.id = e.run_id
  WHERE r.rate_key IS NOT NULL AND e.gate_released_at > now() - interval '1 second'
  GROUP BY 1";

async fn counts(conn: &mut PgConnection, query: &str) -> Result<HashMap<String, i64>, sqlx::Error> {
    let rows: Vec<(String, i64)> = sqlx::query_as(query).fetch_all(conn).await?;
    Ok(rows.into_iter().collect())
}

/// The live workers' run slots, less every run request queued for them or executing.
async fn free_slots(conn: &mut PgConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT (SELECT COALESCE(sum(run_slots), 0) FROM worker_heartbeats
                  WHERE beat_at > now() - make_interval(secs => $1))
              - (SELECT count(*) FROM execution_requests
                  WHERE kind = 'run' AND NOT held_by_gate AND state IN ('queued', 'executing'))",
    )
    .bind(crate::heartbeat::LAPSE.as_secs_f64())
    .fetch_one(conn)
    .await
}

async fn release(conn: &mut PgConnection, released: &[&Held]) -> Result<(), sqlx::Error> {
    if released.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = released.iter().map(|h| h.id).collect();
    sqlx::query(
        "UPDATE execution_requests SET held_by_gate = FALSE, gate_released_at = now(), queued_at = now()
          WHERE id = ANY($1)",
    )
    .bind(&ids)
    .execute(&mut *conn)
    .await?;
    let messages: Vec<JobMessage> = released
        .iter()
        .map(|h| JobMessage {
            tenant: None,
            kind: JobKind::Run,
            run_id: h.run_id,
            request_id: h.id,
            action_id: None,
            attempt: Some(h.attempt),
        })
        .collect();
    outbox::announce_many(conn, JobKind::Run, &messages).await?;
    Ok(())
}

/// How flow control stands for one key.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize, utoipa::ToSchema)]
pub struct KeyStanding {
    pub key: String,
    /// `concurrency` or `rate`.
    pub kind: String,
    /// Held, waiting for the gate.
    pub waiting: i64,
    /// Out of the gate and not ended (concurrency), or released in the last second
    /// (rate).
    pub in_flight: i64,
    /// The largest concurrency limit (or rate per second) its runs name.
    pub limit: Option<i32>,
}

/// Every key that has runs waiting or in flight.
pub async fn standings(conn: &mut PgConnection) -> Result<Vec<KeyStanding>, sqlx::Error> {
    sqlx::query_as(
        "SELECT r.concurrency_key AS key, 'concurrency' AS kind,
                count(*) FILTER (WHERE e.held_by_gate) AS waiting,
                count(*) FILTER (WHERE NOT e.held_by_gate) AS in_flight,
                max(r.concurrency_limit) AS \"limit\"
           FROM execution_requests e JOIN runs r ON r.id = e.run_id
          WHERE r.concurrency_key IS NOT NULL AND e.kind = 'run' AND e.state IN ('queued', 'executing')
          GROUP BY r.concurrency_key
         UNION ALL
         SELECT r.rate_key, 'rate',
                count(*) FILTER (WHERE e.held_by_gate AND e.state = 'queued'),
                count(*) FILTER (WHERE e.gate_released_at > now() - interval '1 second'),
                max(r.rate_per_second)
           FROM execution_requests e JOIN runs r ON r.id = e.run_id
          WHERE r.rate_key IS NOT NULL AND e.kind = 'run'
            AND (e.state = 'queued' OR e.gate_released_at > now() - interval '1 second')
          GROUP BY r.rate_key
          ORDER BY 1, 2",
    )
    .fetch_all(conn)
    .await
}
