//! The gate: flow control of runs that name a concurrency key, a rate limit or a
//! priority. Their requests are admitted `held_by_gate`, with no announcement, and are
//! held again whenever they are queued again (a new attempt, a hand-back, a reviewed
//! continuation, a decision). Each pass of the scheduler's gate (one leader; one pass
//! at a time, by a transaction lock) releases, in one transaction, the held requests
//! that may start now, highest effective priority first, then earliest admitted:
//!
//! - at most the key's limit (the smallest its runs name) of a tenant's key are out of
//!   the gate and not ended (queued for a worker, or executing: a request whose worker
//!   died keeps its slot until the sweeper queues it again, so the limit holds under
//!   worker loss);
//! - at most `rate_per_second` requests of a tenant's rate key were released in the last
//!   second;
//! - no more than the live workers' free run slots (their advertised slots, less every
//!   run request queued for them or executing).
//!
//! A held request's priority rises by one for every [`AGING_SECONDS`] since its
//! admission, so a low one is never starved by a stream of higher ones. A request held
//! until a time (a step's retry after its backoff, [`hold_until`]) is not released
//! before it.

use super::action::ActionKind;
use super::requeue::queued_message;
use crate::outbox;
use crate::run::JobMessage;
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
    tenant_id: String,
    concurrency_key: Option<String>,
    /// The smallest limit the key's runs name.
    key_limit: Option<i64>,
    key_running: i64,
    rate_key: Option<String>,
    rate_per_second: Option<i32>,
    rate_started: i64,
    /// Its queued continuation action, or verification adoption, if it waits for one.
    action_id: Option<Uuid>,
    action_kind: Option<ActionKind>,
    adoption_id: Option<Uuid>,
}

/// What a pass released.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub released: usize,
    /// Held requests it looked at and left waiting.
    pub waiting: usize,
}

/// The advisory lock one pass holds in its transaction ("cairngps"): two schedulers
/// that both think they lead never pass at once.
const PASS_LOCK: i64 = 0x6361_6972_6e67_7073;

/// The gate's reads of its keys, as the first two of a query's common table
/// expressions: `in_hand`, the queued and executing run requests the gate holds or has
/// released (every keyed one is: a keyed run's request is held whenever it is queued,
/// until a release), which the partial index `execution_requests_gated` (migration
/// 0041) holds; and `released`, the requests it released in the last second. Each is
/// read on its own (`OFFSET 0`) and then joined to its run by key (`keyed_run!`), so
/// the keyed runs that have ended are never read, nor is a backlog of runs without a
/// key, save those the gate holds or released too (a run with only a priority, a
/// retried step's run until its backoff ends): left to itself, the planner starts from
/// the runs of a key, ended ones too.
macro_rules! gate_reads {
    () => {
        "in_hand AS (
    SELECT e.id, e.run_id, e.kind, e.held_by_gate, e.state, e.gate_released_at
      FROM execution_requests e
     WHERE e.kind = 'run' AND e.state IN ('queued', 'executing')
       AND (e.held_by_gate OR e.gate_released_at IS NOT NULL)
    OFFSET 0),
  released AS (
    SELECT e.id, e.run_id, e.kind, e.held_by_gate, e.state, e.gate_released_at
      FROM execution_requests e
     WHERE e.gate_released_at > now() - interval '1 second'
    OFFSET 0)"
    };
}

/// The run of a request `h` of [`gate_reads!`], as `r`, found by its key.
macro_rules! keyed_run {
    () => {
        "JOIN LATERAL (SELECT r.tenant_id, r.concurrency_key, r.concurrency_limit, r.rate_key,
                             r.rate_per_second
                        FROM runs r WHERE r.id = h.run_id OFFSET 0) r ON TRUE"
    };
}

/// Held requests that may start as far as their key and rate allow, best first: keys
/// and rates are counted per tenant, and a key's limit is the smallest its runs name.
const CANDIDATES: &str = concat!(
    "WITH ",
    gate_reads!(),
    ",
  running AS (
    SELECT r.tenant_id, r.concurrency_key AS key, count(*) AS n
      FROM in_hand h ",
    keyed_run!(),
    "
     WHERE r.concurrency_key IS NOT NULL AND NOT h.held_by_gate
     GROUP BY 1, 2),
  limits AS (
    SELECT r.tenant_id, r.concurrency_key AS key, min(r.concurrency_limit)::bigint AS n
      FROM in_hand h ",
    keyed_run!(),
    "
     WHERE r.concurrency_key IS NOT NULL
     GROUP BY 1, 2),
  started AS (
    SELECT r.tenant_id, r.rate_key AS key, count(*) AS n
      FROM released h ",
    keyed_run!(),
    "
     WHERE r.rate_key IS NOT NULL
     GROUP BY 1, 2)
SELECT e.id, e.run_id, e.attempt, r.tenant_id, r.concurrency_key, l.n AS key_limit,
       COALESCE(k.n, 0) AS key_running, r.rate_key, r.rate_per_second,
       COALESCE(s.n, 0) AS rate_started, q.id AS action_id, q.kind AS action_kind,
       (SELECT v.id FROM verification_adoptions v
         WHERE v.execution_request_id = e.id AND v.status = 'queued'
         ORDER BY v.created_at DESC LIMIT 1) AS adoption_id
  FROM execution_requests e JOIN runs r ON r.id = e.run_id
  LEFT JOIN running k ON k.tenant_id = r.tenant_id AND k.key = r.concurrency_key
  LEFT JOIN limits l ON l.tenant_id = r.tenant_id AND l.key = r.concurrency_key
  LEFT JOIN started s ON s.tenant_id = r.tenant_id AND s.key = r.rate_key
  LEFT JOIN LATERAL (SELECT a.id, a.kind FROM continuation_actions a
                      WHERE a.request_id = e.id AND a.status = 'queued'
                      ORDER BY a.created_at DESC LIMIT 1) q ON TRUE
 WHERE e.held_by_gate AND e.state = 'queued'
   AND (e.release_after IS NULL OR e.release_after <= now())
   AND (r.concurrency_key IS NULL OR COALESCE(k.n, 0) < COALESCE(l.n, 1))
   AND (r.rate_key IS NULL OR COALESCE(s.n, 0) < r.rate_per_second)
 ORDER BY COALESCE(r.priority, 0) + floor(EXTRACT(EPOCH FROM now() - e.admitted_at) / $1) DESC,
          e.admitted_at, e.id
 LIMIT $2
   FOR UPDATE OF e SKIP LOCKED"
);

/// Whether any request is held: most passes find none, and one look at the partial
/// index, outside any transaction, is all they cost.
pub async fn anything_held(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM execution_requests WHERE held_by_gate AND state = 'queued')",
    )
    .fetch_one(conn)
    .await
}

/// One pass of the gate, in the caller's transaction: releases what may start now (of
/// at most `batch` candidates) and announces it through the outbox. A pass that finds
/// another one under way does nothing.
pub async fn pass(conn: &mut PgConnection, batch: i64) -> Result<Pass, sqlx::Error> {
    let alone: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(PASS_LOCK)
        .fetch_one(&mut *conn)
        .await?;
    if !alone {
        return Ok(Pass::default());
    }
    let held: Vec<Held> = sqlx::query_as(CANDIDATES)
        .bind(AGING_SECONDS)
        .bind(batch)
        .fetch_all(&mut *conn)
        .await?;
    if held.is_empty() {
        return Ok(Pass::default());
    }
    let mut free = free_slots(&mut *conn).await?;
    // What this pass released so far, per (tenant, key).
    let mut running: HashMap<(&str, &str), i64> = HashMap::new();
    let mut started: HashMap<(&str, &str), i64> = HashMap::new();
    let mut released = Vec::new();
    for h in &held {
        if free <= 0 {
            break;
        }
        let key = h
            .concurrency_key
            .as_deref()
            .map(|k| (h.tenant_id.as_str(), k));
        let rate = h.rate_key.as_deref().map(|k| (h.tenant_id.as_str(), k));
        let key_full = key.is_some_and(|k| {
            h.key_running + running.get(&k).copied().unwrap_or(0) >= h.key_limit.unwrap_or(1)
        });
        let rate_full = rate.is_some_and(|k| {
            h.rate_started + started.get(&k).copied().unwrap_or(0)
                >= i64::from(h.rate_per_second.unwrap_or(1))
        });
        if key_full || rate_full {
            continue;
        }
        if let Some(k) = key {
            *running.entry(k).or_default() += 1;
        }
        if let Some(k) = rate {
            *started.entry(k).or_default() += 1;
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

/// The live workers' run slots, less every run request queued for them or executing. A
/// worker that has not said how many it has counts one.
async fn free_slots(conn: &mut PgConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT (SELECT COALESCE(sum(COALESCE(run_slots, 1)), 0) FROM worker_heartbeats
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
    // `updated_at` is the announcement's time, which the parked-delivery check reads.
    sqlx::query(
        "UPDATE execution_requests
            SET held_by_gate = FALSE, gate_released_at = now(), queued_at = now(), updated_at = now(),
                release_after = NULL
          WHERE id = ANY($1)",
    )
    .bind(&ids)
    .execute(&mut *conn)
    .await?;
    let messages: Vec<JobMessage> = released
        .iter()
        .map(|h| {
            let action = h.action_id.zip(h.action_kind);
            queued_message(h.run_id, h.id, h.attempt, action, h.adoption_id)
        })
        .collect();
    for message in &messages {
        outbox::announce(&mut *conn, message).await?;
    }
    Ok(())
}

/// Holds a request (queued again) until `at`: the gate releases it then, as its flow
/// control and the workers' free slots allow.
pub async fn hold_until(
    conn: &mut PgConnection,
    request_id: Uuid,
    at: chrono::DateTime<chrono::Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE execution_requests SET held_by_gate = TRUE, release_after = $2, queued_at = now()
          WHERE id = $1",
    )
    .bind(request_id)
    .bind(at)
    .execute(conn)
    .await?;
    Ok(())
}

/// How flow control stands for one key of one tenant.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize, utoipa::ToSchema)]
pub struct KeyStanding {
    pub tenant: String,
    pub key: String,
    /// `concurrency` or `rate`.
    pub kind: String,
    /// Held, waiting for the gate.
    pub waiting: i64,
    /// Out of the gate and not ended (concurrency), or released in the last second
    /// (rate).
    pub in_flight: i64,
    /// The smallest concurrency limit (or rate per second) its runs name: the one that
    /// holds.
    pub limit: Option<i32>,
}

/// Every key that has runs waiting or in flight (the 100 with the most waiting).
pub async fn standings(conn: &mut PgConnection) -> Result<Vec<KeyStanding>, sqlx::Error> {
    sqlx::query_as(concat!(
        "WITH ",
        gate_reads!(),
        "
         SELECT * FROM (
           SELECT r.tenant_id AS tenant, r.concurrency_key AS key, 'concurrency' AS kind,
                  count(*) FILTER (WHERE h.held_by_gate) AS waiting,
                  count(*) FILTER (WHERE NOT h.held_by_gate) AS in_flight,
                  min(r.concurrency_limit) AS \"limit\"
             FROM in_hand h ",
        keyed_run!(),
        "
            WHERE r.concurrency_key IS NOT NULL
            GROUP BY 1, 2
           UNION ALL
           SELECT r.tenant_id, r.rate_key, 'rate',
                  count(*) FILTER (WHERE h.held_by_gate AND h.state = 'queued'),
                  count(*) FILTER (WHERE h.gate_released_at > now() - interval '1 second'),
                  min(r.rate_per_second)
             FROM (SELECT * FROM in_hand WHERE state = 'queued'
                   UNION SELECT * FROM released WHERE kind = 'run') h ",
        keyed_run!(),
        "
            WHERE r.rate_key IS NOT NULL
            GROUP BY 1, 2) k
          ORDER BY waiting DESC, tenant, key, kind
          LIMIT 100"
    ))
    .fetch_all(conn)
    .await
}
