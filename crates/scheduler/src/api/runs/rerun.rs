//! Rerun: a new run from an earlier run's spec, linked to it (`rerun_of`), in the
//! earlier run's tenant, by the caller.

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::path_id;
use crate::api::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::request::admit;
use cairn_common::run::{Budgets, RateLimit, RunSpec, StepSpec};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::view::{load_run, RunView};

#[derive(sqlx::FromRow)]
struct SpecRow {
    tenant_id: String,
    agent: String,
    repository: Option<String>,
    git_ref: Option<String>,
    steps: serde_json::Value,
    labels: serde_json::Value,
    max_commands: i32,
    max_wall_seconds: i32,
    max_attempts: i32,
    deadline: Option<DateTime<Utc>>,
    concurrency_key: Option<String>,
    concurrency_limit: Option<i32>,
    priority: Option<i32>,
    rate_key: Option<String>,
    rate_per_second: Option<i32>,
}

/// The spec a run was admitted with (flow control included), and its tenant. A deadline that has passed is left
/// out: a rerun of it would start already late.
pub async fn spec_of(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Option<(RunSpec, String)>, sqlx::Error> {
    let row: Option<SpecRow> = sqlx::query_as(
        "SELECT tenant_id, agent, repository, git_ref, steps, labels, max_commands, max_wall_seconds,
                max_attempts, deadline, concurrency_key, concurrency_limit, priority, rate_key,
                rate_per_second
           FROM runs WHERE id = $1",
    )
    .bind(run_id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|row| {
        let steps: Vec<StepSpec> = serde_json::from_value(row.steps).unwrap_or_default();
        let spec = RunSpec {
            agent: row.agent,
            repository: row.repository,
            git_ref: row.git_ref,
            steps,
            budgets: Budgets {
                max_commands: u32::try_from(row.max_commands).unwrap_or(0),
                max_wall_seconds: u32::try_from(row.max_wall_seconds).unwrap_or(0),
            },
            deadline: row.deadline.filter(|d| *d > Utc::now()),
            max_attempts: u32::try_from(row.max_attempts).ok(),
            labels: serde_json::from_value(row.labels).unwrap_or_default(),
            concurrency_limit: row
                .concurrency_key
                .as_ref()
                .and(row.concurrency_limit)
                .and_then(|n| u32::try_from(n).ok()),
            concurrency_key: row.concurrency_key,
            priority: row.priority,
            // Each step was stored with the run's policy already applied.
            retry: None,
            rate_limit: row
                .rate_key
                .zip(row.rate_per_second)
                .map(|(key, n)| RateLimit {
                    key,
                    per_second: u32::try_from(n).unwrap_or(1),
                }),
        };
        (spec, row.tenant_id)
    }))
}

/// Admits a rerun of `run_id` by `caller`, in the caller's transaction; its id.
pub async fn admit_rerun(
    conn: &mut PgConnection,
    caller: &Caller,
    run_id: Uuid,
) -> Result<Option<Uuid>, ApiError> {
    let Some((spec, tenant)) = spec_of(&mut *conn, run_id).await? else {
        return Ok(None);
    };
    spec.validate("", Utc::now())?;
    let ids = admit::admit(
        &mut *conn,
        std::slice::from_ref(&spec),
        caller.token_id,
        &tenant,
        None,
    )
    .await?;
    admit::link_rerun(&mut *conn, ids[0], run_id).await?;
    Ok(Some(ids[0]))
}

/// Rerun a run: a new run from its spec (agent, repository, steps, budgets, attempts,
/// labels; its deadline if still ahead), linked to it by `rerun_of`. Any run may be
/// rerun, finished or not; the earlier one is not touched.
#[utoipa::path(post, operation_id = "create_run_rerun", tag = "runs", path = "/api/v1/runs/{run_id}/rerun",
    params(("run_id" = String, Path)),
    responses((status = 201, description = "The new run", body = RunView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn rerun(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let run_id = path_id(&run_id, "run_id")?;
    let mut tx = state.pool.begin().await?;
    let new_id = admit_rerun(&mut tx, &caller, run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    let view = load_run(&mut tx, new_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    tx.commit().await?;
    state.metrics.runs_admitted.inc();
    Ok((StatusCode::CREATED, Json(view)).into_response())
}
