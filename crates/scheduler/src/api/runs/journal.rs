//! A run's journal: every step's intent and receipt (and the snapshot it stands on),
//! and the other entries.

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::path_id;
use crate::api::AppState;
use axum::extract::{Path, State};
use axum::Json;
use cairn_common::ids::Id;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

/// One step of the journal: its intent, and its receipt once it ended.
#[derive(Debug, Serialize, ToSchema, sqlx::FromRow)]
pub struct JournalStep {
    #[schema(value_type = String)]
    #[sqlx(try_from = "Uuid")]
    pub request_id: Id,
    pub step_key: String,
    pub step_index: i32,
    pub idempotent: bool,
    /// From its receipt: `completed` (exit 0), `failed` (another exit, a signal, its
    /// timeout or a sandbox limit) or `cancelled` (stopped because its run was
    /// cancelled), `marked_done` (a person decided its effect happened: see
    /// `decision_id`); without a receipt, `unknown_outcome` (it started and its end was
    /// not recorded).
    pub status: String,
    pub intent_epoch: i64,
    pub intent_attempt: i32,
    /// The worker that wrote the intent (held the lease at `intent_epoch`); absent on
    /// intents older than this field.
    pub worker: Option<String>,
    pub started_at: DateTime<Utc>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: Option<bool>,
    pub wall_ms: Option<i64>,
    pub cpu_ms: Option<i64>,
    pub output_digest: Option<String>,
    pub stdout_tail: Option<String>,
    pub stderr_tail: Option<String>,
    /// The worker-local base path of the step's full output: `.stdout` and `.stderr`
    /// are appended to it. Anyone else reads it through
    /// `GET /api/v1/runs/{run}/steps/{key}/output`.
    pub output_artifact: Option<String>,
    pub receipt_epoch: Option<i64>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The snapshot holding the step's effects, committed with its receipt: the receipt
    /// counts as done only on a tree at this snapshot or a later one of its lineage.
    #[schema(value_type = Option<String>)]
    pub snapshot_id: Option<Id>,
    /// How the tree the step ran on was acquired: `adopt`, `checkpoint`, `baseline`, `cold`.
    pub tree_tier: Option<String>,
    /// The sandbox the step ran in: `mechanism`, `isolated`, `namespaces`, `network`,
    /// `uid`/`gid` and `limits` (with what enforced them).
    #[schema(value_type = Option<Object>)]
    pub sandbox: Option<serde_json::Value>,
    /// The sandbox limit the step passed, which ended it: `memory_limit`, `pids_limit`
    /// or `cpu_limit`.
    #[sqlx(rename = "limit_breached")]
    pub limit: Option<String>,
    /// The reconciliation decision that recorded this receipt (`marked_done`): who
    /// decided and why are in its journal entry and at
    /// `GET /api/v1/runs/{run}/reconciliation/decisions/{id}`.
    #[schema(value_type = Option<String>)]
    pub decision_id: Option<Id>,
}

/// Any other journal record (checkpoints, acceptances, reuse intents and receipts).
#[derive(Debug, Serialize, ToSchema, sqlx::FromRow)]
pub struct JournalEntry {
    pub id: i64,
    #[schema(value_type = String)]
    #[sqlx(try_from = "Uuid")]
    pub request_id: Id,
    pub entry_kind: String,
    pub lease_epoch: i64,
    #[schema(value_type = Object)]
    pub body: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Journal {
    pub steps: Vec<JournalStep>,
    pub entries: Vec<JournalEntry>,
}

/// The journal of a run: intents and receipts of every step, and other entries.
#[utoipa::path(get, operation_id = "get_run_journal", tag = "runs", path = "/api/v1/runs/{run_id}/journal",
    params(("run_id" = String, Path)),
    responses((status = 200, body = Journal), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn journal(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<Journal>, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    let exists: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_optional(&state.pool)
        .await?;
    if exists.is_none() {
        return Err(ApiError::not_found("run"));
    }
    let steps: Vec<JournalStep> = sqlx::query_as(
        "SELECT i.request_id, i.step_key, i.step_index, i.idempotent,
                CASE WHEN r.step_key IS NULL THEN 'unknown_outcome'
                     WHEN r.decision_id IS NOT NULL THEN 'marked_done'
                     WHEN r.cancelled THEN 'cancelled'
                     WHEN r.exit_code = 0 AND NOT r.timed_out AND r.limit_breached IS NULL THEN 'completed'
                     ELSE 'failed' END AS status,
                i.lease_epoch AS intent_epoch, i.attempt AS intent_attempt, i.worker_id AS worker, i.started_at,
                r.exit_code, r.signal, r.timed_out, r.wall_ms, r.cpu_ms, r.output_digest,
                r.stdout_tail, r.stderr_tail, r.output_artifact, r.lease_epoch AS receipt_epoch, r.finished_at,
                r.snapshot_id, r.tree_tier, r.sandbox, r.limit_breached, r.decision_id
           FROM journal_intents i
           JOIN execution_requests e ON e.id = i.request_id
           LEFT JOIN journal_receipts r ON r.request_id = i.request_id AND r.step_key = i.step_key
          WHERE e.run_id = $1
          ORDER BY e.admitted_at, i.step_index",
    )
    .bind(run_id)
    .fetch_all(&state.pool)
    .await?;
    let entries: Vec<JournalEntry> = sqlx::query_as(
        "SELECT j.id, j.request_id, j.entry_kind, j.lease_epoch, j.body, j.created_at
           FROM journal_entries j JOIN execution_requests e ON e.id = j.request_id
          WHERE e.run_id = $1 ORDER BY j.id",
    )
    .bind(run_id)
    .fetch_all(&state.pool)
    .await?;
    Ok(Json(Journal { steps, entries }))
}
