//! The journal of a request: an intent before a step (or check) starts and a receipt
//! after it ends, both fenced by the lease, and the other entries (acceptances, reuse
//! intents and receipts, completions). The one writer of `journal_intents`,
//! `journal_receipts` and `journal_entries`.
//!
//! A successful run step's receipt names the snapshot that holds its effects and is
//! committed in the same transaction as that snapshot's lineage append (the worker's
//! custody). On a later claim, a receipt counts as done only on a tree at that snapshot
//! or at a descendant of it ([`standings`]): on any other tree its step is an unknown
//! outcome again (invariant 9).

use crate::lease::Lease;
use crate::lineage::{self, Tier};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use std::collections::HashMap;
use uuid::Uuid;

/// How a command ended, as its receipt records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub wall_ms: i64,
    pub cpu_ms: i64,
    /// SHA-256 over stdout then stderr as captured.
    pub output_digest: String,
    pub stdout_tail: String,
    pub stderr_tail: String,
    /// Where the full output is kept.
    pub output_artifact: String,
    /// The sandbox the step ran in: its mechanism, namespaces, network and limits.
    pub sandbox: serde_json::Value,
    /// The sandbox limit the step passed, which ended it (`memory_limit`, `pids_limit`,
    /// `cpu_limit`; `disk_quota`: it failed with its tree or home full).
    pub limit: Option<String>,
    /// The step was stopped because its run was cancelled: this receipt keeps what it
    /// printed and used, and never counts as the step done.
    pub cancelled: bool,
}

/// A receipt to write.
#[derive(Debug, Clone, Copy)]
pub struct Receipt<'a> {
    pub step_key: &'a str,
    pub attempt: i32,
    pub outcome: &'a Outcome,
    /// The tier that produced the tree a run step ran on.
    pub tier: Option<Tier>,
}

/// A journal record of a step.
#[derive(Debug, Clone, Copy)]
pub enum Record {
    Intent,
    Receipt,
}

/// Whether `lease` wrote `record` of `step_key` (read back after a write whose commit
/// may have landed before its connection broke).
pub async fn written(
    pool: &sqlx::PgPool,
    lease: &Lease,
    record: Record,
    step_key: &str,
) -> Result<bool, sqlx::Error> {
    let query = match record {
        Record::Intent => {
            "SELECT EXISTS (SELECT 1 FROM journal_intents
                             WHERE request_id = $1 AND step_key = $2 AND lease_epoch = $3)"
        }
        Record::Receipt => {
            "SELECT EXISTS (SELECT 1 FROM journal_receipts
                             WHERE request_id = $1 AND step_key = $2 AND lease_epoch = $3)"
        }
    };
    sqlx::query_scalar(query)
        .bind(lease.request_id)
        .bind(step_key)
        .bind(lease.epoch)
        .fetch_one(pool)
        .await
}

/// Writes a step's intent and charges the command, inside the caller's fenced
/// transaction, before the step starts. `idempotent`: whether it may run again after an
/// unknown outcome; `output_store`: the identity and URL of the artifact store its live
/// output goes to, if it has any.
pub async fn write_intent(
    conn: &mut PgConnection,
    lease: &Lease,
    attempt: i32,
    step_key: &str,
    index: usize,
    idempotent: bool,
    output_store: Option<(Uuid, &str)>,
) -> Result<(), sqlx::Error> {
    let step = IntentOf {
        attempt,
        step_key,
        index,
        idempotent,
        output_store,
    };
    write_intent_resuming(conn, lease, &step, None).await
}

/// A step's intent, as [`write_intent`] writes it.
#[derive(Debug, Clone, Copy)]
pub struct IntentOf<'a> {
    pub attempt: i32,
    pub step_key: &'a str,
    pub index: usize,
    pub idempotent: bool,
    pub output_store: Option<(Uuid, &'a str)>,
}

/// [`write_intent`], and with `resume_context` the request's resume context too
/// ([`crate::request::resume::record`]), in the statement that charges the command: a
/// plan's first intent, committed with its tree's record, writes the request's row once.
pub async fn write_intent_resuming(
    conn: &mut PgConnection,
    lease: &Lease,
    step: &IntentOf<'_>,
    resume_context: Option<&serde_json::Value>,
) -> Result<(), sqlx::Error> {
    // One statement, one round trip: a data-modifying WITH runs exactly once, whether
    // or not the outer statement reads it.
    sqlx::query(
        "WITH intent AS (
           INSERT INTO journal_intents (request_id, step_key, step_index, idempotent, lease_epoch, attempt,
                                        output_store, output_store_url, worker_id)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
           ON CONFLICT (request_id, step_key) DO UPDATE
              SET lease_epoch = EXCLUDED.lease_epoch, attempt = EXCLUDED.attempt, started_at = now(),
                  ended_at = NULL, output_store = EXCLUDED.output_store,
                  output_store_url = EXCLUDED.output_store_url, worker_id = EXCLUDED.worker_id)
         UPDATE execution_requests
            SET used_commands = used_commands + 1, updated_at = now(),
                resume_context = COALESCE($10, resume_context)
          WHERE id = $1",
    )
    .bind(lease.request_id)
    .bind(step.step_key)
    .bind(i32::try_from(step.index).unwrap_or(i32::MAX))
    .bind(step.idempotent)
    .bind(lease.epoch)
    .bind(step.attempt)
    .bind(step.output_store.map(|(id, _)| id))
    .bind(step.output_store.map(|(_, url)| url))
    .bind(&lease.owner)
    .bind(resume_context)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Writes a receipt standing on `snapshot` and charges the command's wall and CPU time,
/// inside the caller's fenced transaction. A step run again (its earlier receipt stood
/// on a tree this one lacks) replaces its receipt.
pub async fn record_receipt(
    conn: &mut PgConnection,
    lease: &Lease,
    receipt: &Receipt<'_>,
    snapshot: Option<Uuid>,
) -> Result<(), sqlx::Error> {
    let outcome = receipt.outcome;
    // One statement: the receipt, the end of the intent's open interval (so the step is
    // never charged again as interrupted) and the charge of the measured time.
    sqlx::query(
        "WITH receipt AS (
           INSERT INTO journal_receipts (request_id, step_key, lease_epoch, attempt, exit_code, signal, timed_out,
                                         wall_ms, cpu_ms, output_digest, stdout_tail, stderr_tail, output_artifact,
                                         snapshot_id, tree_tier, sandbox, limit_breached, cancelled)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
           ON CONFLICT (request_id, step_key) DO UPDATE
              SET lease_epoch = EXCLUDED.lease_epoch, attempt = EXCLUDED.attempt, exit_code = EXCLUDED.exit_code,
                  signal = EXCLUDED.signal, timed_out = EXCLUDED.timed_out, wall_ms = EXCLUDED.wall_ms,
                  cpu_ms = EXCLUDED.cpu_ms, output_digest = EXCLUDED.output_digest,
                  stdout_tail = EXCLUDED.stdout_tail, stderr_tail = EXCLUDED.stderr_tail,
                  output_artifact = EXCLUDED.output_artifact, snapshot_id = EXCLUDED.snapshot_id,
                  tree_tier = EXCLUDED.tree_tier, sandbox = EXCLUDED.sandbox,
                  limit_breached = EXCLUDED.limit_breached, cancelled = EXCLUDED.cancelled,
                  decision_id = NULL, finished_at = now()),
         ended AS (UPDATE journal_intents SET ended_at = now()
                    WHERE request_id = $1 AND step_key = $2 AND ended_at IS NULL)
         UPDATE execution_requests SET used_wall_ms = used_wall_ms + $8, used_cpu_ms = used_cpu_ms + $9,
                updated_at = now()
          WHERE id = $1",
    )
    .bind(lease.request_id)
    .bind(receipt.step_key)
    .bind(lease.epoch)
    .bind(receipt.attempt)
    .bind(outcome.exit_code)
    .bind(outcome.signal)
    .bind(outcome.timed_out)
    .bind(outcome.wall_ms)
    .bind(outcome.cpu_ms)
    .bind(&outcome.output_digest)
    .bind(&outcome.stdout_tail)
    .bind(&outcome.stderr_tail)
    .bind(&outcome.output_artifact)
    .bind(snapshot)
    .bind(receipt.tier)
    .bind(&outcome.sandbox)
    .bind(&outcome.limit)
    .bind(outcome.cancelled)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Charges the wall time of every step that started and was never receipted (killed,
/// cancelled, drained, fenced, or its capture failed): from its intent's start to the
/// moment its end is known, or to `until` (its owner's lease deadline) when that came
/// first. Each interval is charged once. Returns the milliseconds charged.
pub async fn charge_interrupted(
    conn: &mut PgConnection,
    request_id: Uuid,
    until: Option<DateTime<Utc>>,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "WITH ended AS (
              UPDATE journal_intents
                 SET ended_at = GREATEST(started_at, LEAST(COALESCE($2, now()), now()))
               WHERE request_id = $1 AND ended_at IS NULL
           RETURNING (EXTRACT(EPOCH FROM (ended_at - started_at)) * 1000)::bigint AS ms),
              charged AS (SELECT COALESCE(sum(ms), 0)::bigint AS ms FROM ended)
         UPDATE execution_requests SET used_wall_ms = used_wall_ms + (SELECT ms FROM charged)
          WHERE id = $1 AND EXISTS (SELECT 1 FROM ended)
      RETURNING (SELECT ms FROM charged)",
    )
    .bind(request_id)
    .bind(until)
    .fetch_optional(conn)
    .await
    // Nothing ended, nothing charged: the request's row is left as it is (every claim
    // of a fresh request would otherwise write a new version of it for nothing).
    .map(|charged| charged.unwrap_or(0))
}

/// Writes another journal entry (an acceptance, a reuse intent or receipt, a
/// completion) under the lease's epoch; returns its id.
pub async fn entry(
    conn: &mut PgConnection,
    lease: &Lease,
    kind: &str,
    body: &serde_json::Value,
) -> Result<i64, sqlx::Error> {
    entry_at(conn, lease.request_id, lease.epoch, kind, body).await
}

/// Writes a journal entry of `request_id` under `epoch`, for a writer that holds no
/// lease but has locked and fenced the request (a person's reconciliation decision).
pub async fn entry_at(
    conn: &mut PgConnection,
    request_id: Uuid,
    epoch: i64,
    kind: &str,
    body: &serde_json::Value,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO journal_entries (request_id, entry_kind, lease_epoch, body) VALUES ($1, $2, $3, $4)
      RETURNING id",
    )
    .bind(request_id)
    .bind(kind)
    .bind(epoch)
    .bind(body)
    .fetch_one(conn)
    .await
}

/// Plan steps of a request a person must decide, in plan order: `stopped_on` (the step
/// its request stopped on: no receipt, or one on a tree its successor lacked, or one a
/// person recorded before an earlier step ran again), and each other step that may not
/// run again and started without a receipt. A verification's checks (`verify:…`) are
/// not plan steps: they are not decided here.
pub async fn undecided(
    conn: &mut PgConnection,
    request_id: Uuid,
    stopped_on: Option<&str>,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT i.step_key FROM journal_intents i
           LEFT JOIN journal_receipts r ON r.request_id = i.request_id AND r.step_key = i.step_key
          WHERE i.request_id = $1 AND strpos(i.step_key, ':') = 0
            AND (i.step_key = $2 OR (r.step_key IS NULL AND NOT i.idempotent))
          ORDER BY i.step_index",
    )
    .bind(request_id)
    .bind(stopped_on)
    .fetch_all(conn)
    .await
}

/// A person decided the step's effect happened: its receipt says so and names the
/// decision, with no exit, output or snapshot of its own (replacing a receipt on a tree
/// the successor lacked). Inside the caller's transaction, on a locked, fenced request.
pub async fn record_marked_done(
    conn: &mut PgConnection,
    request_id: Uuid,
    step_key: &str,
    epoch: i64,
    decision_id: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH receipt AS (
           INSERT INTO journal_receipts (request_id, step_key, lease_epoch, attempt, wall_ms, cpu_ms,
                                         output_digest, decision_id)
           SELECT request_id, step_key, $3, attempt, 0, 0, '', $4 FROM journal_intents
            WHERE request_id = $1 AND step_key = $2
           ON CONFLICT (request_id, step_key) DO UPDATE
              SET lease_epoch = EXCLUDED.lease_epoch, exit_code = NULL, signal = NULL, timed_out = FALSE,
                  wall_ms = 0, cpu_ms = 0, output_digest = '', stdout_tail = '', stderr_tail = '',
                  output_artifact = NULL, snapshot_id = NULL, tree_tier = NULL, sandbox = NULL,
                  limit_breached = NULL, cancelled = FALSE, decision_id = EXCLUDED.decision_id,
                  finished_at = now())
         UPDATE journal_intents SET ended_at = COALESCE(ended_at, now())
          WHERE request_id = $1 AND step_key = $2",
    )
    .bind(request_id)
    .bind(step_key)
    .bind(epoch)
    .bind(decision_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// A person decided the step's effect did not happen: its intent (and a receipt on a
/// tree the successor lacked) leave the journal, so the step runs again on the same
/// request. What it was charged stays charged; the decision's journal entry keeps what
/// was removed.
pub async fn forget_step(
    conn: &mut PgConnection,
    request_id: Uuid,
    step_key: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH receipt AS (DELETE FROM journal_receipts WHERE request_id = $1 AND step_key = $2)
         DELETE FROM journal_intents WHERE request_id = $1 AND step_key = $2",
    )
    .bind(request_id)
    .bind(step_key)
    .execute(conn)
    .await?;
    Ok(())
}

/// Steps (or checks) that started and have no receipt, in plan order, with whether each
/// may run again. `key_prefix` narrows them (a verification's checks).
pub async fn unknown_outcomes(
    conn: &mut PgConnection,
    request_id: Uuid,
    key_prefix: &str,
) -> Result<Vec<(String, bool)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT i.step_key, i.idempotent FROM journal_intents i
           LEFT JOIN journal_receipts r ON r.request_id = i.request_id AND r.step_key = i.step_key
          WHERE i.request_id = $1 AND r.step_key IS NULL AND starts_with(i.step_key, $2)
          ORDER BY i.step_index",
    )
    .bind(request_id)
    .bind(key_prefix)
    .fetch_all(conn)
    .await
}

/// SQL for the digest of the tree the request `request` (an expression for its id)
/// stands on: the tree of the latest snapshot its receipts were committed with, or, when
/// none was, the tree of its work context (`work_context`) it started from
/// ([`crate::lineage::current_tree_sql`], with `empty` the empty tree's digest). NULL
/// when a snapshot it stands on recorded no digest.
pub fn source_sql(request: &str, work_context: &str, empty: &str) -> String {
    format!(
        "CASE WHEN EXISTS (SELECT 1 FROM journal_receipts jr
                            WHERE jr.request_id = {request} AND jr.snapshot_id IS NOT NULL)
              THEN (SELECT s.tree_digest FROM journal_receipts jr JOIN project_snapshots s ON s.id = jr.snapshot_id
                     WHERE jr.request_id = {request}
                     ORDER BY s.sequence DESC NULLS LAST, jr.finished_at DESC LIMIT 1)
              ELSE {started_from} END",
        started_from = crate::lineage::current_tree_sql(work_context, empty),
    )
}

/// Digest of a request's receipts: what a retained checkpoint binds.
pub async fn digest(conn: &mut PgConnection, request_id: Uuid) -> Result<String, sqlx::Error> {
    let receipts: Vec<(String, Option<i32>, String)> = sqlx::query_as(
        "SELECT step_key, exit_code, output_digest FROM journal_receipts WHERE request_id = $1 ORDER BY step_key",
    )
    .bind(request_id)
    .fetch_all(conn)
    .await?;
    Ok(crate::digest::of(&receipts))
}

/// Where a journaled step stands, seen from a given tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Its receipt stands on this snapshot, which the tree holds: the effect is there.
    Done { snapshot: Uuid },
    /// An intent without a receipt: it started and its outcome is unknown.
    Unknown,
    /// A receipt the tree does not hold: it stands on another snapshot (or on none), so
    /// its effects are not in this tree.
    Behind { snapshot: Option<Uuid> },
    /// A person decided its effect happened (`mark_done`): it is done on the tree its
    /// run continues from, as long as no earlier step runs again first.
    MarkedDone,
}

impl Standing {
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Done { .. } => "on_tree",
            Standing::Unknown => "unknown_outcome",
            Standing::Behind { .. } => "tree_behind_journal",
            Standing::MarkedDone => "marked_done",
        }
    }
}

/// Where each journaled step of a request stands, seen from a tree at `position` (the
/// snapshot it was restored from or adopted at; `None` for a baseline or cold tree).
pub async fn standings(
    conn: &mut PgConnection,
    request_id: Uuid,
    position: Option<Uuid>,
) -> Result<HashMap<String, Standing>, sqlx::Error> {
    let rows: Vec<(String, bool, Option<Uuid>, bool)> = sqlx::query_as(
        "SELECT i.step_key, r.step_key IS NOT NULL, r.snapshot_id, r.decision_id IS NOT NULL
           FROM journal_intents i
           LEFT JOIN journal_receipts r ON r.request_id = i.request_id AND r.step_key = i.step_key
          WHERE i.request_id = $1",
    )
    .bind(request_id)
    .fetch_all(&mut *conn)
    .await?;
    let held = match position {
        Some(position) if rows.iter().any(|r| r.1) => lineage::ancestry(conn, position).await?,
        _ => Vec::new(),
    };
    Ok(rows
        .into_iter()
        .map(|(key, receipt, snapshot, decided)| {
            let standing = match (receipt, snapshot) {
                _ if decided => Standing::MarkedDone,
                (false, _) => Standing::Unknown,
                (true, Some(s)) if held.contains(&s) => Standing::Done { snapshot: s },
                (true, snapshot) => Standing::Behind { snapshot },
            };
            (key, standing)
        })
        .collect())
}
