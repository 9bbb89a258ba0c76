//! Verification handoffs: the candidate of a run's pending handoff, adoptions (saved once
//! per caller-owned request id) and their status with every check's result.
//!
//! A candidate binds the pending request, the source the checks verify, the frozen
//! commands, the current policy and the provider; an adoption must quote all five
//! digests exactly. Selecting a check as reusable declares that it tests the retained
//! source independently of time and external state; checks that depend on changing
//! services or inspect generated output can never be selected.

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::json::StrictJson;
use super::path_id;
use super::AppState;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::digest;
use cairn_common::handoff::{self, NewAdoption};
use cairn_common::ids::Id;
use cairn_common::policy;
use cairn_common::request::{self, RequestState};
use cairn_common::run::{JobKind, JobMessage};
use cairn_common::verification::{self as checks, CheckCommand, Purpose, MAX_CHECKS};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgConnection;
use std::collections::HashSet;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// The only purpose a reusable declaration may name.
const SOURCE_BUILD: &str = "source_build";
/// The runner profile verification checks run under (part of the provider digest).
const RUNNER_PROFILE: &str = "linux-netns-v1";

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct CandidateQuery {
    /// The provider (agent) the verification runs under: the run's own agent.
    pub agent: Option<String>,
}

/// One frozen check as the candidate shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CandidateCommand {
    /// 1-based position in the frozen list.
    pub index: usize,
    pub arguments: Vec<String>,
    pub purpose: Purpose,
    pub cwd: Option<String>,
    pub command_digest: String,
}

/// A check that may be declared reusable.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReusableCandidate {
    pub index: usize,
    pub arguments: Vec<String>,
    pub command_digest: String,
    pub purpose: Purpose,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Budget {
    pub max_commands: i32,
    pub used_commands: i32,
    pub remaining_commands: i32,
}

/// The pending handoff of a run, and the digests an adoption must quote.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HandoffCandidate {
    /// `verification_handoff_candidate`.
    pub kind: String,
    #[schema(value_type = String)]
    pub run_id: Id,
    #[schema(value_type = String)]
    pub request_id: Id,
    #[schema(value_type = String)]
    pub handoff_id: Id,
    pub agent: String,
    /// `READY`, or `HELD` with reasons.
    pub admission: String,
    pub holds: Vec<String>,
    pub pending_request_digest: String,
    /// Digest of the workspace source when the report was written.
    pub source_digest: Option<String>,
    pub commands_digest: String,
    pub policy_digest: String,
    pub provider_digest: String,
    pub commands: Vec<CandidateCommand>,
    pub reusable_build_candidates: Vec<ReusableCandidate>,
    pub budget: Budget,
}

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
    pub request_id: String,
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

#[derive(sqlx::FromRow)]
struct Facts {
    request_id: Uuid,
    state: String,
    attempt: i32,
    max_commands: i32,
    used_commands: i32,
    agent: String,
    handoff_id: Option<Uuid>,
    commands: Option<serde_json::Value>,
    commands_digest: Option<String>,
    source_digest: Option<String>,
}

/// The run's execution request and its open handoff; locked when `lock`.
async fn facts(conn: &mut PgConnection, run_id: Uuid, lock: bool) -> Result<Facts, ApiError> {
    let sql = format!(
        "SELECT e.id AS request_id, e.state, e.attempt, e.max_commands, e.used_commands, r.agent,
                h.id AS handoff_id, h.commands, h.commands_digest, h.source_digest
           FROM runs r JOIN execution_requests e ON e.run_id = r.id AND e.kind = 'run'
           LEFT JOIN verification_handoffs h ON h.request_id = e.id AND h.state = 'pending'
          WHERE r.id = $1 {}",
        if lock { "FOR UPDATE OF e" } else { "" }
    );
    sqlx::query_as(&sql)
        .bind(run_id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))
}

fn policy_digest(policy: &policy::Policy) -> String {
    digest::of(policy)
}

fn provider_digest(agent: &str) -> String {
    digest::of_json(&json!({"agent": agent, "runner": RUNNER_PROFILE}))
}

fn check_agent(agent: Option<&str>, run_agent: &str) -> Result<String, ApiError> {
    let agent = agent.ok_or_else(|| {
        ApiError::bad_request("invalid_query", "agent is required").with_field("agent")
    })?;
    if agent != run_agent {
        return Err(ApiError::unprocessable(
            "agent",
            format!("verification runs under the run's own agent ({run_agent})"),
        ));
    }
    Ok(agent.to_string())
}

/// The current candidate, or why there is none.
fn candidate(
    run_id: Uuid,
    facts: &Facts,
    agent: String,
    policy: &policy::Policy,
) -> Result<(HandoffCandidate, Vec<CheckCommand>), ApiError> {
    let (Some(handoff_id), Some(commands), Some(commands_digest)) =
        (facts.handoff_id, &facts.commands, &facts.commands_digest)
    else {
        return Err(ApiError::conflict(
            "no_pending_handoff",
            format!(
                "the run has no pending verification handoff (its request is {})",
                facts.state
            ),
        ));
    };
    let frozen: Vec<CheckCommand> = serde_json::from_value(commands.clone()).map_err(|_| {
        ApiError::conflict("no_pending_handoff", "the handoff's checks cannot be read")
    })?;
    let mut holds = Vec::new();
    if facts.source_digest.is_none() {
        holds.push("missing_source_witness".to_string());
    }
    if facts.state != RequestState::AwaitingVerification.as_str() {
        holds.push("request_not_awaiting_verification".to_string());
    }
    let pending_request_digest = digest::of_json(&json!({
        "request_id": facts.request_id,
        "handoff_id": handoff_id,
        "state": facts.state,
        "attempt": facts.attempt,
        "used_commands": facts.used_commands,
    }));
    let listed: Vec<CandidateCommand> = frozen
        .iter()
        .enumerate()
        .map(|(i, c)| CandidateCommand {
            index: i + 1,
            arguments: c.argv.clone(),
            purpose: c.purpose,
            cwd: c.cwd.clone(),
            command_digest: checks::command_digest(c),
        })
        .collect();
    let reusable_build_candidates = listed
        .iter()
        .filter(|c| c.purpose.reuse_eligible())
        .map(|c| ReusableCandidate {
            index: c.index,
            arguments: c.arguments.clone(),
            command_digest: c.command_digest.clone(),
            purpose: c.purpose,
        })
        .collect();
    let candidate = HandoffCandidate {
        kind: "verification_handoff_candidate".into(),
        run_id: run_id.into(),
        request_id: facts.request_id.into(),
        handoff_id: handoff_id.into(),
        admission: if holds.is_empty() { "READY" } else { "HELD" }.into(),
        holds,
        pending_request_digest,
        source_digest: facts.source_digest.clone(),
        commands_digest: commands_digest.clone(),
        policy_digest: policy_digest(policy),
        provider_digest: provider_digest(&agent),
        agent,
        commands: listed,
        reusable_build_candidates,
        budget: Budget {
            max_commands: facts.max_commands,
            used_commands: facts.used_commands,
            remaining_commands: (facts.max_commands - facts.used_commands).max(0),
        },
    };
    Ok((candidate, frozen))
}

/// Inspect the pending verification handoff of a run; starts no work.
#[utoipa::path(get, path = "/api/v1/runs/{run_id}/verification-handoffs/candidates",
    tag = "verification handoffs", params(("run_id" = String, Path), CandidateQuery),
    responses((status = 200, body = HandoffCandidate), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn candidates(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    query: Result<Query<CandidateQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<HandoffCandidate>, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let policy = policy::load(&state.pool).await?;
    let mut conn = state.pool.acquire().await?;
    let facts = facts(&mut conn, run_id, false).await?;
    let agent = check_agent(query.agent.as_deref(), &facts.agent)?;
    candidate(run_id, &facts, agent, &policy).map(|(c, _)| Json(c))
}

/// Checks the body's shape before anything is read.
fn validate_input(input: &VerificationAdoptionInput) -> Result<Uuid, ApiError> {
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

async fn adoption_view(
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
    let results = results
        .into_iter()
        .map(|r| {
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
        })
        .collect();
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

/// Adopt the pending handoff's frozen checks, once per caller-owned request id
/// (operator). The same id and input return the same receipt; the same id with other
/// input is a 409.
#[utoipa::path(post, path = "/api/v1/runs/{run_id}/verification-handoffs/adoptions",
    tag = "verification handoffs", params(("run_id" = String, Path)),
    request_body = VerificationAdoptionInput,
    responses((status = 201, body = AdoptionView), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn adopt(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    StrictJson(input): StrictJson<VerificationAdoptionInput>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let run_id = path_id(&run_id, "run_id")?;
    let adoption_id = validate_input(&input)?;
    let input_value = serde_json::to_value(&input).unwrap_or_default();
    let input_digest = digest::of_json(&input_value);

    let policy = policy::load(&state.pool).await?;
    let mut tx = state.pool.begin().await?;
    // Every admission of this run serializes on its request row.
    let facts = facts(&mut tx, run_id, true).await?;
    let saved: Option<(Uuid, String)> =
        sqlx::query_as("SELECT run_id, input_digest FROM verification_adoptions WHERE id = $1")
            .bind(adoption_id)
            .fetch_optional(&mut *tx)
            .await?;
    if let Some((saved_run, saved_digest)) = saved {
        if saved_run == run_id && saved_digest == input_digest {
            let view = adoption_view(&mut tx, run_id, adoption_id)
                .await?
                .ok_or_else(|| ApiError::not_found("verification adoption of this run"))?;
            return Ok((StatusCode::CREATED, Json(view)).into_response());
        }
        return Err(ApiError::conflict(
            "request_id_conflict",
            "this request_id was saved with different input; read its status instead of submitting again",
        )
        .with_field("request_id"));
    }
    let agent = check_agent(Some(&input.agent), &facts.agent)?;
    let (current, frozen) = candidate(run_id, &facts, agent, &policy)?;
    if current.admission != "READY" {
        return Err(ApiError::conflict(
            "candidate_held",
            format!(
                "the candidate is held ({}); nothing was adopted",
                current.holds.join(", ")
            ),
        ));
    }
    for (field, quoted, now) in [
        (
            "pending_request_digest",
            &input.pending_request_digest,
            &current.pending_request_digest,
        ),
        (
            "source_digest",
            &input.source_digest,
            current.source_digest.as_ref().unwrap_or(&String::new()),
        ),
        (
            "commands_digest",
            &input.commands_digest,
            &current.commands_digest,
        ),
        (
            "policy_digest",
            &input.policy_digest,
            &current.policy_digest,
        ),
        (
            "provider_digest",
            &input.provider_digest,
            &current.provider_digest,
        ),
    ] {
        if quoted != now {
            return Err(ApiError::conflict(
                "stale_candidate",
                format!("{field} is not the current candidate's; read the candidate again"),
            )
            .with_field(field));
        }
    }
    for (i, selected) in input.reusable_build_checks.iter().enumerate() {
        let field = format!("reusable_build_checks[{i}].command_digest");
        let Some(command) = current
            .commands
            .iter()
            .find(|c| c.command_digest == selected.command_digest)
        else {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown_command_digest",
                "not a command of the current candidate",
            )
            .with_field(field));
        };
        if !command.purpose.reuse_eligible() {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "not_reusable",
                format!(
                    "check {} is {}: it always needs a fresh execution, whatever is declared",
                    command.index,
                    command.purpose.as_str()
                ),
            )
            .with_field(field));
        }
    }
    let reusable_digests: Vec<String> = input
        .reusable_build_checks
        .iter()
        .map(|c| c.command_digest.clone())
        .collect();
    // Checks that cannot be reused must fit what is left of the command budget.
    let must_run = frozen.len() - reusable_digests.len();
    if i64::from(current.budget.remaining_commands) < must_run as i64 {
        return Err(ApiError::conflict(
            "budget_exhausted",
            format!(
                "{must_run} checks must run fresh and only {} commands remain in the budget",
                current.budget.remaining_commands
            ),
        ));
    }

    let candidate = serde_json::to_value(&current).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    handoff::adopt(
        &mut tx,
        &NewAdoption {
            id: adoption_id,
            run_id,
            handoff_id: current.handoff_id.uuid(),
            request_id: facts.request_id,
            operator_id: caller.token_id,
            input: &input_value,
            input_digest: &input_digest,
            agent: &current.agent,
            policy_digest: &current.policy_digest,
            candidate: &candidate,
            reusable_digests: &reusable_digests,
        },
    )
    .await?;
    // The same ticket is queued again: same attempt, budgets and charged usage.
    let message = JobMessage {
        kind: JobKind::Verification,
        run_id,
        request_id: facts.request_id,
        action_id: Some(adoption_id),
        attempt: Some(facts.attempt),
    };
    request::readmit(&mut tx, &message).await?;
    let view = adoption_view(&mut tx, run_id, adoption_id)
        .await?
        .ok_or_else(|| ApiError::not_found("verification adoption of this run"))?;
    tx.commit().await?;
    state.metrics.verifications_adopted.inc();
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// Read a saved adoption, its status and every check's result.
#[utoipa::path(get, path = "/api/v1/runs/{run_id}/verification-handoffs/adoptions/{request_id}",
    tag = "verification handoffs", params(("run_id" = String, Path), ("request_id" = String, Path)),
    responses((status = 200, body = AdoptionView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn adoption(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, request_id)): Path<(String, String)>,
) -> Result<Json<AdoptionView>, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    let adoption_id = path_id(&request_id, "request_id")?;
    let mut conn = state.pool.acquire().await?;
    adoption_view(&mut conn, run_id, adoption_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("verification adoption of this run"))
}
