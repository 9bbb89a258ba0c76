//! Runs: admission (single and batch), listing, reading, cancellation, the execution
//! requests of a run and its journal.

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::json::StrictJson;
use super::path_id;
use super::AppState;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::digest;
use cairn_common::ids::Id;
use cairn_common::outbox;
use cairn_common::request::cancel::{cancel_run, Cancellation};
use cairn_common::request::RequestState;
use cairn_common::run::{Budgets, JobKind, JobMessage, RunSpec, StepSpec, MAX_BATCH};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// Charged usage of a request, across all its attempts and continuations.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Usage {
    pub commands: i32,
    pub wall_ms: i64,
    pub cpu_ms: i64,
}

/// A run and the state of its ticket.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunView {
    #[schema(value_type = String, example = "6f1c0e0b3f3c4f0e9a1d2b3c4d5e6f70")]
    pub run_id: Id,
    /// The run's execution request (its ticket).
    #[schema(value_type = String)]
    pub request_id: Id,
    pub agent: String,
    pub repository: Option<String>,
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    /// `queued`, `running`, `awaiting_verification`, `stopped_at_checkpoint`,
    /// `needs_reconciliation`, `completed`, `failed` or `cancelled`.
    pub state: String,
    pub steps: Vec<StepSpec>,
    pub budgets: Budgets,
    pub usage: Usage,
    pub attempt: i32,
    pub max_attempts: i32,
    pub deadline: Option<DateTime<Utc>>,
    pub stop_reason: Option<String>,
    pub reconciliation_step: Option<String>,
    pub cancel_requested_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct RunRow {
    id: Uuid,
    request_id: Uuid,
    agent: String,
    repository: Option<String>,
    git_ref: Option<String>,
    state: String,
    steps: serde_json::Value,
    max_commands: i32,
    max_wall_seconds: i32,
    max_attempts: i32,
    deadline: Option<DateTime<Utc>>,
    attempt: i32,
    used_commands: i32,
    used_wall_ms: i64,
    used_cpu_ms: i64,
    stop_reason: Option<String>,
    reconciliation_step: Option<String>,
    cancel_requested_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

const RUN_SELECT: &str =
    "SELECT r.id, e.id AS request_id, r.agent, r.repository, r.git_ref, r.state,
        r.steps, r.max_commands, r.max_wall_seconds, r.max_attempts, r.deadline, e.attempt,
        e.used_commands, e.used_wall_ms, e.used_cpu_ms, e.stop_reason, e.reconciliation_step,
        r.cancel_requested_at, r.created_at, r.updated_at, r.finished_at
   FROM runs r JOIN execution_requests e ON e.run_id = r.id AND e.kind = 'run'";

impl From<RunRow> for RunView {
    fn from(row: RunRow) -> Self {
        RunView {
            run_id: row.id.into(),
            request_id: row.request_id.into(),
            agent: row.agent,
            repository: row.repository,
            git_ref: row.git_ref,
            state: row.state,
            steps: serde_json::from_value(row.steps).unwrap_or_default(),
            budgets: Budgets {
                max_commands: u32::try_from(row.max_commands).unwrap_or(0),
                max_wall_seconds: u32::try_from(row.max_wall_seconds).unwrap_or(0),
            },
            usage: Usage {
                commands: row.used_commands,
                wall_ms: row.used_wall_ms,
                cpu_ms: row.used_cpu_ms,
            },
            attempt: row.attempt,
            max_attempts: row.max_attempts,
            deadline: row.deadline,
            stop_reason: row.stop_reason,
            reconciliation_step: row.reconciliation_step,
            cancel_requested_at: row.cancel_requested_at,
            created_at: row.created_at,
            updated_at: row.updated_at,
            finished_at: row.finished_at,
        }
    }
}

pub async fn load_run(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Option<RunView>, sqlx::Error> {
    let row: Option<RunRow> = sqlx::query_as(&format!("{RUN_SELECT} WHERE r.id = $1"))
        .bind(run_id)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(RunView::from))
}

/// Admits runs in the caller's transaction: each run, its execution request and its
/// outbox message, in bulk statements. Returns the new run ids in order.
async fn admit(
    conn: &mut PgConnection,
    specs: &[RunSpec],
    operator: Uuid,
    idempotency_key: Option<&str>,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let run_ids: Vec<Uuid> = specs.iter().map(|_| Uuid::new_v4()).collect();
    let request_ids: Vec<Uuid> = specs.iter().map(|_| Uuid::new_v4()).collect();
    let agents: Vec<&str> = specs.iter().map(|s| s.agent.as_str()).collect();
    let repositories: Vec<Option<&str>> = specs.iter().map(|s| s.repository.as_deref()).collect();
    let refs: Vec<Option<&str>> = specs.iter().map(|s| s.git_ref.as_deref()).collect();
    let steps: Vec<serde_json::Value> = specs
        .iter()
        .map(|s| serde_json::to_value(&s.steps).unwrap_or_default())
        .collect();
    let max_commands: Vec<i32> = specs
        .iter()
        .map(|s| clamp_i32(s.budgets.max_commands))
        .collect();
    let max_wall: Vec<i32> = specs
        .iter()
        .map(|s| clamp_i32(s.budgets.max_wall_seconds))
        .collect();
    let max_attempts: Vec<i32> = specs.iter().map(|s| clamp_i32(s.max_attempts())).collect();
    let deadlines: Vec<Option<DateTime<Utc>>> = specs.iter().map(|s| s.deadline).collect();
    let digests: Vec<String> = specs.iter().map(digest::of).collect();
    let keys: Vec<Option<String>> = specs
        .iter()
        .map(|_| idempotency_key.map(|k| format!("{}:{k}", operator.simple())))
        .collect();
    sqlx::query(
        "INSERT INTO runs (id, root_run_id, task_id, agent, operator_id, repository, git_ref, steps,
                           max_commands, max_wall_seconds, max_attempts, deadline, state,
                           idempotency_key, request_digest)
         SELECT id, id, id, agent, $12, repository, git_ref, steps, max_commands, max_wall_seconds,
                max_attempts, deadline, 'queued', idempotency_key, request_digest
           FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::int[],
                       $7::int[], $8::int[], $9::timestamptz[], $10::text[], $11::text[])
             AS t(id, agent, repository, git_ref, steps, max_commands, max_wall_seconds,
                  max_attempts, deadline, idempotency_key, request_digest)",
    )
    .bind(&run_ids)
    .bind(&agents)
    .bind(&repositories)
    .bind(&refs)
    .bind(&steps)
    .bind(&max_commands)
    .bind(&max_wall)
    .bind(&max_attempts)
    .bind(&deadlines)
    .bind(&keys)
    .bind(&digests)
    .bind(operator)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO execution_requests (id, run_id, kind, state, max_attempts, max_commands, max_wall_seconds)
         SELECT id, run_id, 'run', 'queued', max_attempts, max_commands, max_wall_seconds
           FROM UNNEST($1::uuid[], $2::uuid[], $3::int[], $4::int[], $5::int[])
             AS t(id, run_id, max_attempts, max_commands, max_wall_seconds)",
    )
    .bind(&request_ids)
    .bind(&run_ids)
    .bind(&max_attempts)
    .bind(&max_commands)
    .bind(&max_wall)
    .execute(&mut *conn)
    .await?;
    let messages: Vec<JobMessage> = run_ids
        .iter()
        .zip(&request_ids)
        .map(|(run_id, request_id)| JobMessage {
            kind: JobKind::Run,
            run_id: *run_id,
            request_id: *request_id,
            action_id: None,
            attempt: Some(1),
        })
        .collect();
    outbox::announce_many(conn, JobKind::Run, &messages).await?;
    Ok(run_ids)
}

fn clamp_i32(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| {
            ApiError::bad_request(
                "invalid_idempotency_key",
                "Idempotency-Key must be 1 to 255 visible characters",
            )
            .with_field("Idempotency-Key")
        })?;
    Ok(Some(key.to_string()))
}

/// Submit one run.
#[utoipa::path(post, path = "/api/v1/runs", tag = "runs",
    request_body = RunSpec,
    params(("Idempotency-Key" = Option<String>, Header, description = "Same key and body: the same run; same key, other body: 409")),
    responses(
        (status = 201, description = "Admitted and queued", body = RunView),
        (status = 200, description = "Replay of an earlier submission with the same Idempotency-Key", body = RunView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, description = "Idempotency-Key reused with another body", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn submit(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    StrictJson(spec): StrictJson<RunSpec>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let key = idempotency_key(&headers)?;
    spec.validate("", Utc::now())?;
    if let Some(key) = &key {
        if let Some(replay) = replay(&state, &caller, key, &spec).await? {
            return Ok(replay);
        }
    }
    let mut tx = state.pool.begin().await?;
    let run_ids = match admit(
        &mut tx,
        std::slice::from_ref(&spec),
        caller.token_id,
        key.as_deref(),
    )
    .await
    {
        Ok(ids) => ids,
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() && key.is_some() => {
            // A concurrent submission with the same key won the race: answer as a replay.
            drop(tx);
            let key = key.as_deref().unwrap_or_default();
            return replay(&state, &caller, key, &spec).await?.ok_or_else(|| {
                ApiError::conflict("idempotency_key_conflict", "Idempotency-Key is in use")
            });
        }
        Err(e) => return Err(e.into()),
    };
    let view = load_run(&mut tx, run_ids[0])
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    tx.commit().await?;
    state.metrics.runs_admitted.inc();
    let mut response = (StatusCode::CREATED, Json(&view)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/api/v1/runs/{}", view.run_id)) {
        response.headers_mut().insert("location", location);
    }
    Ok(response)
}

async fn replay(
    state: &AppState,
    caller: &Caller,
    key: &str,
    spec: &RunSpec,
) -> Result<Option<Response>, ApiError> {
    let stored: Option<(Uuid, String)> =
        sqlx::query_as("SELECT id, request_digest FROM runs WHERE idempotency_key = $1")
            .bind(format!("{}:{key}", caller.token_id.simple()))
            .fetch_optional(&state.pool)
            .await?;
    let Some((run_id, stored_digest)) = stored else {
        return Ok(None);
    };
    if stored_digest != digest::of(spec) {
        return Err(ApiError::conflict(
            "idempotency_key_conflict",
            "this Idempotency-Key was used with a different body; nothing was admitted",
        )
        .with_field("Idempotency-Key"));
    }
    let mut conn = state.pool.acquire().await?;
    let view = load_run(&mut conn, run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    let mut response = (StatusCode::OK, Json(view)).into_response();
    response
        .headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    Ok(Some(response))
}

/// A batch submission.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// 1 to 1,000 runs, admitted together or not at all.
    pub runs: Vec<RunSpec>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResponse {
    /// The new run ids, in the order submitted.
    #[schema(value_type = Vec<String>)]
    pub run_ids: Vec<Id>,
}

/// Submit up to 1,000 runs in one transaction.
#[utoipa::path(post, path = "/api/v1/runs/batch", tag = "runs", request_body = BatchRequest,
    responses((status = 201, body = BatchResponse), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn submit_batch(
    State(state): State<AppState>,
    caller: Caller,
    StrictJson(batch): StrictJson<BatchRequest>,
) -> Result<(StatusCode, Json<BatchResponse>), ApiError> {
    caller.require(Role::Operator)?;
    if batch.runs.is_empty() || batch.runs.len() > MAX_BATCH {
        return Err(ApiError::unprocessable(
            "runs",
            format!("1 to {MAX_BATCH} runs"),
        ));
    }
    let now = Utc::now();
    for (i, spec) in batch.runs.iter().enumerate() {
        spec.validate(&format!("runs[{i}]."), now)?;
    }
    let mut tx = state.pool.begin().await?;
    let ids = admit(&mut tx, &batch.runs, caller.token_id, None).await?;
    tx.commit().await?;
    state.metrics.runs_admitted.inc_by(ids.len() as u64);
    Ok((
        StatusCode::CREATED,
        Json(BatchResponse {
            run_ids: ids.into_iter().map(Id::from).collect(),
        }),
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only runs in this state.
    pub state: Option<String>,
    /// Page size, 1..=500 (default 50).
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RunPage {
    pub runs: Vec<RunView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// List runs, newest first.
#[utoipa::path(get, path = "/api/v1/runs", tag = "runs", params(ListQuery),
    responses((status = 200, body = RunPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RunPage>, ApiError> {
    caller.require(Role::Viewer)?;
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let limit = query.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(
            ApiError::bad_request("invalid_query", "limit is from 1 to 500").with_field("limit"),
        );
    }
    let run_state = match &query.state {
        Some(s) => {
            let known = RequestState::ALL.iter().any(|r| r.run_state() == s);
            if !known {
                return Err(
                    ApiError::bad_request("invalid_query", format!("unknown state {s:?}"))
                        .with_field("state"),
                );
            }
            Some(s.clone())
        }
        None => None,
    };
    let cursor = match &query.cursor {
        Some(c) => Some(parse_cursor(c).ok_or_else(|| {
            ApiError::bad_request("invalid_query", "cursor is not one this API returned")
                .with_field("cursor")
        })?),
        None => None,
    };
    let rows: Vec<RunRow> = sqlx::query_as(&format!(
        "{RUN_SELECT}
          WHERE ($1::text IS NULL OR r.state = $1)
            AND ($2::timestamptz IS NULL OR (r.created_at, r.id) < ($2, $3))
          ORDER BY r.created_at DESC, r.id DESC
          LIMIT $4"
    ))
    .bind(run_state)
    .bind(cursor.map(|c| c.0))
    .bind(cursor.map(|c| c.1).unwrap_or_default())
    .bind(limit + 1)
    .fetch_all(&state.pool)
    .await?;
    let mut runs: Vec<RunView> = rows.into_iter().map(RunView::from).collect();
    let next_cursor = if runs.len() as i64 > limit {
        runs.truncate(usize::try_from(limit).unwrap_or(50));
        runs.last()
            .map(|r| format!("{}_{}", r.created_at.timestamp_micros(), r.run_id))
    } else {
        None
    };
    Ok(Json(RunPage { runs, next_cursor }))
}

fn parse_cursor(cursor: &str) -> Option<(DateTime<Utc>, Uuid)> {
    let (micros, id) = cursor.split_once('_')?;
    let at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
    let id: Id = id.parse().ok()?;
    Some((at, id.uuid()))
}

/// Read one run.
#[utoipa::path(get, path = "/api/v1/runs/{run_id}", tag = "runs",
    params(("run_id" = String, Path, description = "32 lowercase hex")),
    responses((status = 200, body = RunView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<RunView>, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    let mut conn = state.pool.acquire().await?;
    let view = load_run(&mut conn, run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    Ok(Json(view))
}

/// Cancel a run: at once when no worker holds it, else within one lease renewal.
#[utoipa::path(post, path = "/api/v1/runs/{run_id}/cancel", tag = "runs",
    params(("run_id" = String, Path)),
    responses(
        (status = 200, description = "Cancelled", body = RunView),
        (status = 202, description = "A worker holds the run; it stops within one renewal interval", body = RunView),
        (status = 404, body = ErrorBody), (status = 409, description = "The run already finished", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let run_id = path_id(&run_id, "run_id")?;
    let mut tx = state.pool.begin().await?;
    let status = match cancel_run(&mut tx, run_id).await? {
        None => return Err(ApiError::not_found("run")),
        Some(Cancellation::Finished(s)) => {
            return Err(ApiError::conflict(
                "run_finished",
                format!("the run already ended ({})", s.as_str()),
            ))
        }
        Some(Cancellation::Requested) => StatusCode::ACCEPTED,
        Some(Cancellation::AlreadyCancelled | Cancellation::Cancelled) => StatusCode::OK,
    };
    let view = load_run(&mut tx, run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    tx.commit().await?;
    Ok((status, Json(view)).into_response())
}

/// An execution request (ticket) of a run.
#[derive(Debug, Serialize, ToSchema, sqlx::FromRow)]
pub struct ExecutionRequestView {
    #[schema(value_type = String)]
    #[sqlx(try_from = "Uuid")]
    pub request_id: Id,
    #[schema(value_type = String)]
    #[sqlx(try_from = "Uuid")]
    pub run_id: Id,
    /// `run` or `verification`.
    pub kind: String,
    pub state: String,
    pub attempt: i32,
    pub max_attempts: i32,
    pub lease_epoch: i64,
    pub lease_owner: Option<String>,
    pub lease_deadline: Option<DateTime<Utc>>,
    pub max_commands: i32,
    pub max_wall_seconds: i32,
    pub used_commands: i32,
    pub used_wall_ms: i64,
    pub used_cpu_ms: i64,
    pub stop_reason: Option<String>,
    pub reconciliation_step: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub checkpoint: Option<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    pub resume_context: Option<serde_json::Value>,
    pub cancel_requested_at: Option<DateTime<Utc>>,
    pub admitted_at: DateTime<Utc>,
    pub claimed_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ExecutionRequestList {
    pub execution_requests: Vec<ExecutionRequestView>,
}

/// The execution requests of a run (publication and cancellation state, leases, usage).
#[utoipa::path(get, path = "/api/v1/runs/{run_id}/execution-requests", tag = "runs",
    params(("run_id" = String, Path)),
    responses((status = 200, body = ExecutionRequestList), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn execution_requests(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<ExecutionRequestList>, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    let rows: Vec<ExecutionRequestView> = sqlx::query_as(
        "SELECT id AS request_id, run_id, kind, state, attempt, max_attempts, lease_epoch, lease_owner,
                lease_deadline, max_commands, max_wall_seconds, used_commands, used_wall_ms, used_cpu_ms,
                stop_reason, reconciliation_step, checkpoint, resume_context, cancel_requested_at,
                admitted_at, claimed_at, finished_at
           FROM execution_requests WHERE run_id = $1 ORDER BY admitted_at, id",
    )
    .bind(run_id)
    .fetch_all(&state.pool)
    .await?;
    if rows.is_empty() {
        return Err(ApiError::not_found("run"));
    }
    Ok(Json(ExecutionRequestList {
        execution_requests: rows,
    }))
}

/// One step of the journal: its intent, and its receipt once it ended.
#[derive(Debug, Serialize, ToSchema, sqlx::FromRow)]
pub struct JournalStep {
    #[schema(value_type = String)]
    #[sqlx(try_from = "Uuid")]
    pub request_id: Id,
    pub step_key: String,
    pub step_index: i32,
    pub idempotent: bool,
    /// `completed` (a receipt exists) or `unknown_outcome` (an intent without receipt).
    pub status: String,
    pub intent_epoch: i64,
    pub intent_attempt: i32,
    pub started_at: DateTime<Utc>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: Option<bool>,
    pub wall_ms: Option<i64>,
    pub cpu_ms: Option<i64>,
    pub output_digest: Option<String>,
    pub stdout_tail: Option<String>,
    pub stderr_tail: Option<String>,
    pub output_artifact: Option<String>,
    pub receipt_epoch: Option<i64>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The snapshot holding the step's effects, committed with its receipt: the receipt
    /// counts as done only on a tree at this snapshot or a later one of its lineage.
    #[schema(value_type = Option<String>)]
    pub snapshot_id: Option<Id>,
    /// How the tree the step ran on was acquired: `adopt`, `checkpoint`, `baseline`, `cold`.
    pub tree_tier: Option<String>,
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
#[utoipa::path(get, path = "/api/v1/runs/{run_id}/journal", tag = "runs",
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
                CASE WHEN r.step_key IS NULL THEN 'unknown_outcome' ELSE 'completed' END AS status,
                i.lease_epoch AS intent_epoch, i.attempt AS intent_attempt, i.started_at,
                r.exit_code, r.signal, r.timed_out, r.wall_ms, r.cpu_ms, r.output_digest,
                r.stdout_tail, r.stderr_tail, r.output_artifact, r.lease_epoch AS receipt_epoch, r.finished_at,
                r.snapshot_id, r.tree_tier
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
