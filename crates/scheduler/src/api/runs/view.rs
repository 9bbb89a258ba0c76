//! Reading runs: one run, a page of runs, a run's execution requests.

use crate::api::auth::{Caller, Role};
use crate::api::cursor;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::path_id;
use crate::api::AppState;
use axum::extract::{Path, Query, State};
use axum::Json;
use cairn_common::egress::NetworkSpec;
use cairn_common::ids::Id;
use cairn_common::request::RequestState;
use cairn_common::run::{Budgets, StepSpec};
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
    /// The tenant the run belongs to.
    pub tenant: String,
    pub agent: String,
    pub repository: Option<String>,
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    /// `queued`, `running`, `paused` (its worker paused it: `POST .../resume`),
    /// `awaiting_verification`, `stopped_at_checkpoint`, `needs_reconciliation`,
    /// `completed`, `failed` or `cancelled`.
    pub state: String,
    pub steps: Vec<StepSpec>,
    /// The labels it was submitted with.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Flow control: its concurrency key and limit, priority and rate limit, as
    /// submitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency_limit: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<cairn_common::run::RateLimit>,
    /// Queued and held by flow control: its key, rate or the workers' free slots do not
    /// let it start yet (`cairnctl queues`).
    pub held_by_flow_control: bool,
    /// While a failed step waits for its retry: when it may run again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The run this one reruns (`POST /api/v1/runs/{run_id}/rerun`), if any.
    #[schema(value_type = Option<String>)]
    pub rerun_of: Option<Id>,
    /// The tenant's layer of the egress policy as it stands (absent: it narrows
    /// nothing). A step's network is the operator's policy, narrowed by this, then by the
    /// step's own `network`; each receipt's `sandbox.egress` says what the step had.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_network: Option<NetworkSpec>,
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
pub(super) struct RunRow {
    pub(super) id: Uuid,
    request_id: Uuid,
    tenant_id: String,
    agent: String,
    repository: Option<String>,
    git_ref: Option<String>,
    state: String,
    steps: serde_json::Value,
    labels: serde_json::Value,
    rerun_of: Option<Uuid>,
    concurrency_key: Option<String>,
    concurrency_limit: Option<i32>,
    priority: Option<i32>,
    rate_key: Option<String>,
    rate_per_second: Option<i32>,
    held_by_gate: bool,
    next_attempt_at: Option<DateTime<Utc>>,
    tenant_network: Option<sqlx::types::Json<NetworkSpec>>,
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

pub(super) const RUN_SELECT: &str =
    "SELECT r.id, e.id AS request_id, r.tenant_id, r.agent, r.repository, r.git_ref,
        CASE WHEN r.state = 'running' AND e.paused_at IS NOT NULL THEN 'paused' ELSE r.state END AS state,
        r.steps, r.labels, r.rerun_of, r.concurrency_key, r.concurrency_limit, r.priority, r.rate_key,
        r.rate_per_second, e.held_by_gate AND e.state = 'queued' AS held_by_gate,
        CASE WHEN e.held_by_gate AND e.state = 'queued' THEN e.release_after END AS next_attempt_at, r.max_commands, r.max_wall_seconds, r.max_attempts, r.deadline, e.attempt,
        e.used_commands, e.used_wall_ms, e.used_cpu_ms, e.stop_reason, e.reconciliation_step,
        r.cancel_requested_at, r.created_at, r.updated_at, r.finished_at,
        np.network AS tenant_network
   FROM runs r JOIN execution_requests e ON e.run_id = r.id AND e.kind = 'run'
   LEFT JOIN network_policy np ON np.tenant_id = r.tenant_id";

impl From<RunRow> for RunView {
    fn from(row: RunRow) -> Self {
        RunView {
            run_id: row.id.into(),
            request_id: row.request_id.into(),
            tenant: row.tenant_id,
            agent: row.agent,
            repository: row.repository,
            git_ref: row.git_ref,
            state: row.state,
            steps: serde_json::from_value(row.steps).unwrap_or_default(),
            labels: serde_json::from_value(row.labels).unwrap_or_default(),
            rerun_of: row.rerun_of.map(Id::from),
            concurrency_key: row.concurrency_key,
            concurrency_limit: row.concurrency_limit,
            priority: row.priority,
            rate_limit: row.rate_key.zip(row.rate_per_second).map(|(key, n)| {
                cairn_common::run::RateLimit {
                    key,
                    per_second: u32::try_from(n).unwrap_or(1),
                }
            }),
            held_by_flow_control: row.held_by_gate,
            next_attempt_at: row.next_attempt_at,
            tenant_network: row.tenant_network.map(|n| n.0),
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

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only runs in this state (`executing`, the request's name for it, is `running`;
    /// `running` leaves out `paused` runs).
    #[param(
        pattern = "^(queued|running|executing|paused|awaiting_verification|stopped_at_checkpoint|needs_reconciliation|completed|failed|cancelled)$"
    )]
    pub state: Option<String>,
    /// Only runs of this agent.
    #[param(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    pub agent: Option<String>,
    /// Only runs with all these labels: `key=value[,key=value…]`.
    #[param(
        pattern = "^[a-z0-9._/-]{1,63}=[A-Za-z0-9._-]{0,63}(,[a-z0-9._/-]{1,63}=[A-Za-z0-9._-]{0,63}){0,31}$"
    )]
    pub label: Option<String>,
    /// Only runs whose id starts with these hex digits (4 to 32).
    #[param(pattern = "^[0-9a-f]{4,32}$")]
    pub run_id: Option<String>,
    /// Page size, 1..=500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(
        pattern = "^(-?[0-9]{1,16}|1[0-9]{17}|2[0-4][0-9]{16}|25[0-2][0-9]{15}|253[0-3][0-9]{14})_[0-9a-f]{32}$"
    )]
    pub cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RunPage {
    pub runs: Vec<RunView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// List runs, newest first.
#[utoipa::path(get, operation_id = "list_runs", tag = "runs", path = "/api/v1/runs", params(ListQuery),
    responses((status = 200, body = RunPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 422, body = ErrorBody)),
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
    let run_state = query.state.as_deref().map(shown_state).transpose()?;
    check_agent_filter(query.agent.as_deref())?;
    let labels = label_filter(query.label.as_deref())?;
    let ids = query.run_id.as_deref().map(id_range).transpose()?;
    let cursor = cursor::from_query(query.cursor.as_deref())?;
    let rows: Vec<RunRow> = sqlx::query_as(&format!(
        "{RUN_SELECT}
          WHERE ($1::text IS NULL OR r.state = CASE WHEN $1 = 'paused' THEN 'running' ELSE $1 END)
            AND ($1::text IS DISTINCT FROM 'paused' OR e.paused_at IS NOT NULL)
            AND ($1::text IS DISTINCT FROM 'running' OR e.paused_at IS NULL)
            AND ($5::text IS NULL OR r.agent = $5)
            AND ($6::text IS NULL OR r.tenant_id = $6)
            AND ($7::jsonb IS NULL OR r.labels @> $7)
            AND ($2::timestamptz IS NULL OR (r.created_at, r.id) < ($2, $3))
            AND ($8::uuid IS NULL OR r.id BETWEEN $8 AND $9)
          ORDER BY r.created_at DESC, r.id DESC
          LIMIT $4"
    ))
    .bind(run_state)
    .bind(cursor.map(|c| c.0))
    .bind(cursor.map(|c| c.1).unwrap_or_default())
    .bind(limit + 1)
    .bind(&query.agent)
    .bind(caller.scope())
    .bind(labels)
    .bind(ids.map(|(low, _)| low))
    .bind(ids.map(|(_, high)| high))
    .fetch_all(&state.pool)
    .await?;
    let mut runs: Vec<RunView> = rows.into_iter().map(RunView::from).collect();
    let next_cursor = if runs.len() as i64 > limit {
        runs.truncate(usize::try_from(limit).unwrap_or(50));
        runs.last().map(|r| cursor::of(r.created_at, r.run_id))
    } else {
        None
    };
    Ok(Json(RunPage { runs, next_cursor }))
}

/// Every state a run shows: its request's, with `executing` as `running`, and
/// `paused` for a running run whose worker paused it.
pub fn run_states() -> Vec<&'static str> {
    let mut states: Vec<&'static str> = RequestState::ALL.iter().map(|s| s.run_state()).collect();
    states.insert(2, "paused");
    states
}

/// The run state a list filter names (`executing` is `running`), or a 400 that lists
/// them all.
fn shown_state(asked: &str) -> Result<String, ApiError> {
    let asked = if asked == "executing" {
        "running"
    } else {
        asked
    };
    if run_states().contains(&asked) {
        return Ok(asked.to_string());
    }
    Err(ApiError::bad_request(
        "invalid_query",
        format!(
            "unknown state {asked:?}: one of {}",
            run_states().join(", ")
        ),
    )
    .with_field("state"))
}

/// A `label` filter as the JSON its rows must contain; a 400 naming what is wrong, or a
/// 422 for a filter the document allows but no run can match (a key asked two values).
pub fn label_filter(text: Option<&str>) -> Result<Option<serde_json::Value>, ApiError> {
    use cairn_common::labels::SelectorError;
    let Some(text) = text else { return Ok(None) };
    let wanted = cairn_common::labels::selector(text).map_err(|why| match why {
        SelectorError::Malformed(why) => {
            ApiError::bad_request("invalid_query", format!("label: {why}")).with_field("label")
        }
        SelectorError::Contradictory(why) => {
            ApiError::unprocessable("label", format!("label: {why}"))
        }
    })?;
    Ok(Some(serde_json::to_value(wanted).unwrap_or_default()))
}

/// The ids a `run_id` prefix stands for, lowest and highest; a 400 for one that is not 4
/// to 32 lowercase hex digits.
fn id_range(prefix: &str) -> Result<(Uuid, Uuid), ApiError> {
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    if !(4..=32).contains(&prefix.len()) || !prefix.chars().all(hex) {
        return Err(ApiError::bad_request(
            "invalid_query",
            "run_id is 4 to 32 lowercase hexadecimal digits: the start of a run id",
        )
        .with_field("run_id"));
    }
    let bound = |fill: char| {
        let text: String = prefix
            .chars()
            .chain(std::iter::repeat(fill))
            .take(32)
            .collect();
        Uuid::parse_str(&text).unwrap_or_default()
    };
    Ok((bound('0'), bound('f')))
}

fn check_agent_filter(agent: Option<&str>) -> Result<(), ApiError> {
    match agent {
        Some(a) if !cairn_common::run::valid_name(a, 128) => Err(ApiError::bad_request(
            "invalid_query",
            "agent is 1 to 128 of A-Z a-z 0-9 . _ -",
        )
        .with_field("agent")),
        _ => Ok(()),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CountQuery {
    /// Only runs of this agent.
    #[param(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    pub agent: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RunCounts {
    /// Every run state, with how many runs are in it (0 included).
    pub counts: std::collections::BTreeMap<String, i64>,
}

/// How many runs are in each state.
#[utoipa::path(get, operation_id = "count_runs", tag = "runs", path = "/api/v1/runs/counts", params(CountQuery),
    responses((status = 200, body = RunCounts), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn counts(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<CountQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RunCounts>, ApiError> {
    caller.require(Role::Viewer)?;
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    check_agent_filter(query.agent.as_deref())?;
    // Counted from the runs' own state index; only running runs are joined to their
    // request, to tell the paused ones (a few, against every ended run).
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT r.state, count(*) FROM runs r
          WHERE ($1::text IS NULL OR r.agent = $1) AND ($2::text IS NULL OR r.tenant_id = $2)
          GROUP BY r.state
         UNION ALL
         SELECT 'paused', count(*)
           FROM runs r JOIN execution_requests e ON e.run_id = r.id AND e.kind = 'run'
          WHERE r.state = 'running' AND e.paused_at IS NOT NULL
            AND ($1::text IS NULL OR r.agent = $1) AND ($2::text IS NULL OR r.tenant_id = $2)",
    )
    .bind(&query.agent)
    .bind(caller.scope())
    .fetch_all(&state.pool)
    .await?;
    let mut counts: std::collections::BTreeMap<String, i64> = run_states()
        .into_iter()
        .map(|s| (s.to_string(), 0))
        .collect();
    counts.extend(rows);
    let paused = counts.get("paused").copied().unwrap_or(0);
    if let Some(running) = counts.get_mut("running") {
        *running -= paused;
    }
    Ok(Json(RunCounts { counts }))
}

/// Read one run.
#[utoipa::path(get, operation_id = "get_run", tag = "runs", path = "/api/v1/runs/{run_id}",
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
#[utoipa::path(get, operation_id = "list_execution_requests", tag = "runs", path = "/api/v1/runs/{run_id}/execution-requests",
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
