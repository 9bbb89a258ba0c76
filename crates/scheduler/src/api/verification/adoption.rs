//! Adoptions: the strict body that adopts a handoff's checks, and a saved adoption with
//! every check's result as the API shows it.

use crate::api::error::ApiError;
use axum::http::StatusCode;
use cairn_common::digest;
use cairn_common::ids::Id;
use cairn_common::verification::MAX_CHECKS;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use std::collections::HashSet;
use utoipa::ToSchema;
use uuid::Uuid;

/// The only purpose a reusable declaration may name.
const SOURCE_BUILD: &str = "source_build";

/// One selected check: the caller declares it independent of time and external state.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReusableBuildCheck {
    pub command_digest: String,
    /// Must be `source_build`.
    pub purpose: String,
    /// Must be `true` (a JSON boolean).
    pub independent_of_time_and_external_state: bool,
}

/// The strict adoption body.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VerificationAdoptionInput {
    /// A new caller-owned id: 32 lowercase hexadecimal characters.
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub request_id: String,
    #[schema(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    pub agent: String,
    pub pending_request_digest: String,
    pub source_digest: String,
    pub commands_digest: String,
    pub policy_digest: String,
    pub provider_digest: String,
    #[serde(default)]
    pub reusable_build_checks: Vec<ReusableBuildCheck>,
}

/// Where a reused result came from.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SourceExecution {
    #[schema(value_type = String)]
    pub result_id: Id,
    #[schema(value_type = Option<String>)]
    pub request_id: Option<Id>,
    pub step_key: Option<String>,
    pub attempt: i32,
    pub lease_epoch: i64,
}

/// One check's result.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CheckResult {
    pub index: i32,
    pub command_digest: String,
    pub purpose: String,
    pub passed: bool,
    /// `Executed` or `Reused prior verified result`.
    pub display: String,
    pub reused: bool,
    pub confined: bool,
    /// Whether a later verification may reuse this result.
    pub reusable: bool,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub wall_ms: i64,
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub output_digest: String,
    pub stdout_tail: String,
    pub stderr_tail: String,
    pub scope_digest: String,
    /// Why it ran fresh: `not_declared`, `never_reusable`, `unconfined`,
    /// `no_prior_result`, `source_changed`, `dependencies_changed`,
    /// `environment_changed`, `runner_changed`.
    pub fresh_reason: Option<String>,
    pub source_execution: Option<SourceExecution>,
}

/// An adoption receipt and its progress.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AdoptionView {
    /// `verification_adoption`.
    pub kind: String,
    #[schema(value_type = String)]
    pub request_id: Id,
    #[schema(value_type = String)]
    pub run_id: Id,
    #[schema(value_type = String)]
    pub execution_request_id: Id,
    #[schema(value_type = String)]
    pub handoff_id: Id,
    pub agent: String,
    /// `queued`, `executing`, `completed`, `failed` or `cancelled`.
    pub status: String,
    /// `pending`, `adopted`, `passed` or `failed`.
    pub handoff_state: String,
    #[schema(value_type = Option<String>)]
    pub operator_id: Option<Id>,
    pub input_digest: String,
    pub policy_digest: String,
    pub commands_digest: String,
    pub source_digest: Option<String>,
    pub reusable_build_checks: Vec<String>,
    pub stop_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub results: Vec<CheckResult>,
}

/// Checks the body's shape before anything is read.
pub fn validate_input(input: &VerificationAdoptionInput) -> Result<Uuid, ApiError> {
    let adoption_id = input
        .request_id
        .parse::<Id>()
        .map_err(|_| ApiError::invalid_id("request_id"))?
        .uuid();
    for (field, value) in [
        ("pending_request_digest", &input.pending_request_digest),
        ("source_digest", &input.source_digest),
        ("commands_digest", &input.commands_digest),
        ("policy_digest", &input.policy_digest),
        ("provider_digest", &input.provider_digest),
    ] {
        if !digest::is_digest(value) {
            return Err(ApiError::unprocessable(
                field,
                "64 lowercase hexadecimal characters, copied from the current candidate",
            ));
        }
    }
    if input.reusable_build_checks.len() > MAX_CHECKS {
        return Err(ApiError::unprocessable(
            "reusable_build_checks",
            format!("at most {MAX_CHECKS} checks"),
        ));
    }
    let mut seen = HashSet::new();
    for (i, check) in input.reusable_build_checks.iter().enumerate() {
        let at = |name: &str| format!("reusable_build_checks[{i}].{name}");
        if !digest::is_digest(&check.command_digest) {
            return Err(ApiError::unprocessable(
                at("command_digest"),
                "a command_digest from the current candidate",
            ));
        }
        if check.purpose != SOURCE_BUILD {
            return Err(ApiError::unprocessable(
                at("purpose"),
                "only source_build checks can be declared reusable",
            ));
        }
        if !check.independent_of_time_and_external_state {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "acknowledgement_required",
                "a selected check must be declared independent of time and external state (true); leave it unselected to run it fresh",
            )
            .with_field(at("independent_of_time_and_external_state")));
        }
        if !seen.insert(check.command_digest.as_str()) {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "duplicate_selection",
                "a check is selected more than once",
            )
            .with_field(at("command_digest")));
        }
    }
    Ok(adoption_id)
}

#[derive(sqlx::FromRow)]
struct AdoptionRow {
    id: Uuid,
    run_id: Uuid,
    execution_request_id: Option<Uuid>,
    handoff_id: Uuid,
    agent: String,
    status: String,
    handoff_state: String,
    operator_id: Option<Uuid>,
    input_digest: String,
    policy_digest: String,
    commands_digest: String,
    source_digest: Option<String>,
    reusable_digests: Vec<String>,
    stop_reason: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct ResultRow {
    command_index: i32,
    command_digest: String,
    purpose: String,
    passed: bool,
    confined: bool,
    reusable: bool,
    exit_code: Option<i32>,
    timed_out: bool,
    wall_ms: i64,
    attempt: i32,
    lease_epoch: i64,
    step_key: Option<String>,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
    output_digest: String,
    stdout_tail: String,
    stderr_tail: String,
    scope_digest: String,
    fresh_reason: Option<String>,
    reused_from: Option<Uuid>,
    source_request_id: Option<Uuid>,
}

/// A check's result as the API shows it: executed, or reused with where it came from.
impl From<ResultRow> for CheckResult {
    fn from(r: ResultRow) -> CheckResult {
        let reused = r.reused_from.is_some();
        CheckResult {
            index: r.command_index,
            command_digest: r.command_digest,
            purpose: r.purpose,
            passed: r.passed,
            display: if reused {
                "Reused prior verified result"
            } else {
                "Executed"
            }
            .into(),
            reused,
            confined: r.confined,
            reusable: r.reusable,
            exit_code: r.exit_code,
            timed_out: r.timed_out,
            wall_ms: r.wall_ms,
            attempt: r.attempt,
            started_at: r.started_at,
            finished_at: r.finished_at,
            output_digest: r.output_digest,
            stdout_tail: r.stdout_tail,
            stderr_tail: r.stderr_tail,
            scope_digest: r.scope_digest,
            fresh_reason: r.fresh_reason,
            source_execution: r.reused_from.map(|id| SourceExecution {
                result_id: id.into(),
                request_id: r.source_request_id.map(Id::from),
                step_key: r.step_key.clone(),
                attempt: r.attempt,
                lease_epoch: r.lease_epoch,
            }),
        }
    }
}

pub async fn adoption_view(
    conn: &mut PgConnection,
    run_id: Uuid,
    adoption_id: Uuid,
) -> Result<Option<AdoptionView>, sqlx::Error> {
    let row: Option<AdoptionRow> = sqlx::query_as(
        "SELECT a.id, a.run_id, a.execution_request_id, a.handoff_id, a.agent, a.status, h.state AS handoff_state,
                a.operator_id, a.input_digest, a.policy_digest, h.commands_digest, h.source_digest,
                a.reusable_digests, a.stop_reason, a.created_at, a.updated_at
           FROM verification_adoptions a JOIN verification_handoffs h ON h.id = a.handoff_id
          WHERE a.id = $1 AND a.run_id = $2",
    )
    .bind(adoption_id)
    .bind(run_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let results: Vec<ResultRow> = sqlx::query_as(
        "SELECT r.command_index, r.command_digest, r.purpose, r.passed, r.confined, r.reusable, r.exit_code,
                r.timed_out, r.wall_ms, r.attempt, r.lease_epoch, r.step_key, r.started_at, r.finished_at,
                r.output_digest, r.stdout_tail, r.stderr_tail, r.scope_digest, r.fresh_reason, r.reused_from,
                o.request_id AS source_request_id
           FROM verification_results r LEFT JOIN verification_results o ON o.id = r.reused_from
          WHERE r.adoption_id = $1 ORDER BY r.command_index",
    )
    .bind(adoption_id)
    .fetch_all(&mut *conn)
    .await?;
    let results = results.into_iter().map(CheckResult::from).collect();
    Ok(Some(AdoptionView {
        kind: "verification_adoption".into(),
        request_id: row.id.into(),
        run_id: row.run_id.into(),
        execution_request_id: row.execution_request_id.unwrap_or_default().into(),
        handoff_id: row.handoff_id.into(),
        agent: row.agent,
        status: row.status,
        handoff_state: row.handoff_state,
        operator_id: row.operator_id.map(Id::from),
        input_digest: row.input_digest,
        policy_digest: row.policy_digest,
        commands_digest: row.commands_digest,
        source_digest: row.source_digest,
        reusable_build_checks: row.reusable_digests,
        stop_reason: row.stop_reason,
        created_at: row.created_at,
        updated_at: row.updated_at,
        results,
    }))
}
