//! Bulk actions over a filter: cancel every matching run, or retry each (a rerun: a new
//! run from its spec, linked to it). A dry run counts and lists what would be acted on,
//! and changes nothing; a real one acts on at most [`MAX_BULK`] runs, all in one
//! transaction.

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::json::StrictJson;
use crate::api::AppState;
use axum::extract::State;
use axum::Json;
use cairn_common::ids::Id;
use cairn_common::request::cancel::{cancel_run, Cancellation};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;
use uuid::Uuid;

use super::rerun::admit_rerun;
use super::view::run_states;

/// The most runs one bulk action acts on.
pub const MAX_BULK: i64 = 1000;

/// What a bulk action does to each matching run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BulkAction {
    /// Cancel it (a running step is stopped; a finished run is left as it is).
    Cancel,
    /// Rerun it: a new run from its spec, linked by `rerun_of`.
    Retry,
}

/// Which runs: every given criterion must hold, and at least one is given.
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkFilter {
    /// A run state (as runs show it; `executing` is `running`).
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub agent: Option<String>,
    /// Labels the runs carry, all of them.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Only runs created within this many seconds before now (1 to 31622400).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 31622400)]
    pub created_within_seconds: Option<u32>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    pub action: BulkAction,
    pub filter: BulkFilter,
    /// Count and list the matching runs; change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// What a bulk action did to one run.
#[derive(Debug, Serialize, ToSchema)]
pub struct BulkOutcome {
    #[schema(value_type = String)]
    pub run_id: Id,
    /// `cancelled`, `cancel_requested` (a worker stops it within one renewal),
    /// `already_ended` (left as it was), or `rerun` (see `new_run_id`).
    pub outcome: String,
    #[schema(value_type = Option<String>)]
    pub new_run_id: Option<Id>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BulkResponse {
    pub action: BulkAction,
    pub dry_run: bool,
    /// How many runs match the filter.
    pub matched: i64,
    /// The matching runs, oldest first (at most 1000).
    #[schema(value_type = Vec<String>)]
    pub run_ids: Vec<Id>,
    /// What was done to each (empty on a dry run).
    pub outcomes: Vec<BulkOutcome>,
}

/// Cancel or retry every run that matches a filter; `dry_run` counts them first.
#[utoipa::path(post, operation_id = "create_runs_bulk_action", tag = "runs", path = "/api/v1/runs/bulk",
    request_body = BulkRequest,
    responses((status = 200, body = BulkResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, description = "More than 1000 runs match: narrow the filter", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn bulk(
    State(state): State<AppState>,
    caller: Caller,
    StrictJson(request): StrictJson<BulkRequest>,
) -> Result<Json<BulkResponse>, ApiError> {
    caller.require(Role::Operator)?;
    let filter = check(&request.filter)?;
    let mut tx = state.pool.begin().await?;
    let (matched, ids) = matching(&mut tx, &filter, caller.scope()).await?;
    let mut outcomes = Vec::new();
    if !request.dry_run {
        if matched > MAX_BULK {
            return Err(ApiError::conflict(
                "too_many_matches",
                format!("{matched} runs match; one bulk action takes at most {MAX_BULK}: narrow the filter (nothing was changed)"),
            ));
        }
        for id in &ids {
            outcomes.push(act(&mut tx, &caller, request.action, *id).await?);
        }
    }
    tx.commit().await?;
    if !request.dry_run {
        tracing::info!(action = ?request.action, runs = outcomes.len(), "bulk action applied");
    }
    Ok(Json(BulkResponse {
        action: request.action,
        dry_run: request.dry_run,
        matched,
        run_ids: ids.into_iter().map(Id::from).collect(),
        outcomes,
    }))
}

/// A checked filter, as SQL parameters.
struct Checked {
    state: Option<String>,
    agent: Option<String>,
    labels: serde_json::Value,
    within: Option<f64>,
}

fn check(filter: &BulkFilter) -> Result<Checked, ApiError> {
    let empty = filter.state.is_none()
        && filter.agent.is_none()
        && filter.labels.is_empty()
        && filter.created_within_seconds.is_none();
    if empty {
        return Err(ApiError::unprocessable(
            "filter",
            "name at least one of state, agent, labels, created_within_seconds: a bulk action never takes every run",
        ));
    }
    let state = match filter.state.as_deref() {
        Some("executing") => Some("running".to_string()),
        Some(s) if run_states().contains(&s) => Some(s.to_string()),
        Some(s) => {
            let all = run_states().join(", ");
            return Err(ApiError::unprocessable(
                "filter.state",
                format!("unknown state {s:?}: one of {all}"),
            ));
        }
        None => None,
    };
    if let Some(agent) = &filter.agent {
        if !cairn_common::run::valid_name(agent, 128) {
            return Err(ApiError::unprocessable(
                "filter.agent",
                "1 to 128 of A-Z a-z 0-9 . _ -",
            ));
        }
    }
    cairn_common::labels::check(&filter.labels, "filter.labels")
        .map_err(|e| ApiError::unprocessable(e.field, e.message))?;
    let within = filter.created_within_seconds;
    if within.is_some_and(|s| !(1..=31_622_400).contains(&s)) {
        return Err(ApiError::unprocessable(
            "filter.created_within_seconds",
            "1 to 31622400",
        ));
    }
    Ok(Checked {
        state,
        agent: filter.agent.clone(),
        labels: serde_json::to_value(&filter.labels).unwrap_or_default(),
        within: within.map(f64::from),
    })
}

/// How many runs match, and the oldest [`MAX_BULK`] of them, locked for the action.
async fn matching(
    conn: &mut sqlx::PgConnection,
    f: &Checked,
    tenant: Option<&str>,
) -> Result<(i64, Vec<Uuid>), sqlx::Error> {
    let rows: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT r.id, count(*) OVER () FROM runs r
           JOIN execution_requests e ON e.run_id = r.id AND e.kind = 'run'
          WHERE ($1::text IS NULL OR r.state = CASE WHEN $1 = 'paused' THEN 'running' ELSE $1 END)
            AND ($1::text IS DISTINCT FROM 'paused' OR e.paused_at IS NOT NULL)
            AND ($1::text IS DISTINCT FROM 'running' OR e.paused_at IS NULL)
            AND ($2::text IS NULL OR r.agent = $2)
            AND r.labels @> $3
            AND ($4::float8 IS NULL OR r.created_at > now() - make_interval(secs => $4))
            AND ($5::text IS NULL OR r.tenant_id = $5)
          ORDER BY r.created_at, r.id
          LIMIT $6",
    )
    .bind(&f.state)
    .bind(&f.agent)
    .bind(&f.labels)
    .bind(f.within)
    .bind(tenant)
    .bind(MAX_BULK)
    .fetch_all(conn)
    .await?;
    let matched = rows.first().map_or(0, |r| r.1);
    Ok((matched, rows.into_iter().map(|r| r.0).collect()))
}

async fn act(
    conn: &mut sqlx::PgConnection,
    caller: &Caller,
    action: BulkAction,
    run_id: Uuid,
) -> Result<BulkOutcome, ApiError> {
    let (outcome, new_run_id) = match action {
        BulkAction::Cancel => {
            let outcome = match cancel_run(&mut *conn, run_id).await? {
                Some(Cancellation::Requested) => "cancel_requested",
                Some(Cancellation::Cancelled | Cancellation::AlreadyCancelled) => "cancelled",
                Some(Cancellation::Finished(_)) | None => "already_ended",
            };
            (outcome, None)
        }
        BulkAction::Retry => ("rerun", admit_rerun(&mut *conn, caller, run_id).await?),
    };
    Ok(BulkOutcome {
        run_id: run_id.into(),
        outcome: outcome.to_string(),
        new_run_id: new_run_id.map(Id::from),
    })
}
