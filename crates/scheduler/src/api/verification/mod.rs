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
use cairn_common::policy;
use cairn_common::request::{self, RequestEvent};
use cairn_common::run::{JobKind, JobMessage};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

pub mod adoption;
pub mod candidate;

pub use adoption::{
    AdoptionView, CheckResult, ReusableBuildCheck, SourceExecution, VerificationAdoptionInput,
};
pub use candidate::{Budget, CandidateCommand, HandoffCandidate, ReusableCandidate};

use adoption::{adoption_view, validate_input};
use candidate::Facts;

/// The candidate, or a 409 when the run has no pending handoff.
fn evaluate(
    run_id: Uuid,
    facts: &Facts,
    agent: String,
    policy: &cairn_common::policy::Policy,
) -> Result<
    (
        HandoffCandidate,
        Vec<cairn_common::verification::CheckCommand>,
    ),
    ApiError,
> {
    candidate::evaluate(run_id, facts, agent, policy)
        .map_err(|why| ApiError::conflict("no_pending_handoff", why))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CandidateQuery {
    /// The provider (agent) the verification runs under: the run's own agent. Required.
    #[param(required = true, pattern = "^[A-Za-z0-9._-]{1,128}$")]
    pub agent: Option<String>,
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

/// The providers whose verification only an administrator may approve: they run a
/// coding CLI with the factory's own credentials (Codex CLI, Claude Code CLI).
const ADMIN_PROVIDERS: &[&str] = &["codex", "claude"];

/// The role that may approve a verification under `agent`: execute access (operator),
/// or administrator access for the providers that need it. Agent names are free text,
/// so any name that names one of them (`Claude`, `claude-code`) counts as it.
pub fn approval_role(agent: &str) -> Role {
    let agent = agent.to_ascii_lowercase();
    if ADMIN_PROVIDERS.iter().any(|p| agent.contains(p)) {
        Role::Admin
    } else {
        Role::Operator
    }
}

fn require_approval_access(caller: &Caller, agent: &str) -> Result<(), ApiError> {
    let role = approval_role(agent);
    if caller.role >= role {
        return Ok(());
    }
    Err(ApiError::forbidden(format!(
        "approving verification under the {agent} provider needs the {} role; the token has {}",
        role.as_str(),
        caller.role.as_str()
    )))
}

/// Inspect the pending verification handoff of a run; starts no work.
#[utoipa::path(get, operation_id = "list_verification_candidates", tag = "verification", path = "/api/v1/runs/{run_id}/verification-handoffs/candidates", params(("run_id" = String, Path), CandidateQuery),
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
    let policy = policy::load_of_run(&state.pool, run_id).await?;
    let mut conn = state.pool.acquire().await?;
    let facts = facts(&mut conn, run_id, false).await?;
    let agent = check_agent(query.agent.as_deref(), &facts.agent)?;
    evaluate(run_id, &facts, agent, &policy).map(|(c, _)| Json(c))
}

/// Adopt the pending handoff's frozen checks, once per caller-owned request id
/// (operator). The same id and input return the same receipt; the same id with other
/// input is a 409.
#[utoipa::path(post, operation_id = "adopt_verification_handoff", tag = "verification", path = "/api/v1/runs/{run_id}/verification-handoffs/adoptions", params(("run_id" = String, Path)),
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

    let mut tx = state.pool.begin().await?;
    // The policy is read under a lock held to the commit; every admission of this run
    // serializes on its request row.
    let policy = policy::load_locked(&mut tx, run_id).await?;
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
    require_approval_access(&caller, &agent)?;
    let (current, frozen) = evaluate(run_id, &facts, agent, &policy)?;
    still_current(&input, &current)?;
    let reusable_digests = reusable(&input, &current, frozen.len())?;

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
        tenant: None,
        kind: JobKind::Verification,
        run_id,
        request_id: facts.request_id,
        action_id: Some(adoption_id),
        attempt: Some(facts.attempt),
    };
    request::readmit(&mut tx, &message, RequestEvent::AdoptVerification).await?;
    let view = adoption_view(&mut tx, run_id, adoption_id)
        .await?
        .ok_or_else(|| ApiError::not_found("verification adoption of this run"))?;
    tx.commit().await?;
    state.metrics.verifications_adopted.inc();
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// Whether the adoption quotes the candidate as it is now, and it is ready.
fn still_current(
    input: &VerificationAdoptionInput,
    current: &HandoffCandidate,
) -> Result<(), ApiError> {
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
    Ok(())
}

/// The checks declared reusable, each a build check of the candidate, if the ones that
/// must run fresh (of `checks` in all) fit what is left of the command budget.
fn reusable(
    input: &VerificationAdoptionInput,
    current: &HandoffCandidate,
    checks: usize,
) -> Result<Vec<String>, ApiError> {
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
    let must_run = checks - reusable_digests.len();
    if i64::from(current.budget.remaining_commands) < must_run as i64 {
        return Err(ApiError::conflict(
            "budget_exhausted",
            format!(
                "{must_run} checks must run fresh and only {} commands remain in the budget",
                current.budget.remaining_commands
            ),
        ));
    }
    Ok(reusable_digests)
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AdoptionList {
    /// Every adoption of the run, oldest first, with its checks' results.
    pub adoptions: Vec<AdoptionView>,
}

/// List a run's adoptions, their status and every check's result.
#[utoipa::path(get, operation_id = "list_verification_adoptions", tag = "verification", path = "/api/v1/runs/{run_id}/verification-handoffs/adoptions", params(("run_id" = String, Path)),
    responses((status = 200, body = AdoptionList), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn adoptions(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<AdoptionList>, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    let mut conn = state.pool.acquire().await?;
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT a.id FROM runs r LEFT JOIN verification_adoptions a ON a.run_id = r.id
          WHERE r.id = $1 ORDER BY a.created_at, a.id",
    )
    .bind(run_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(ApiError::from)
    .and_then(|ids: Vec<Option<Uuid>>| {
        if ids.is_empty() {
            Err(ApiError::not_found("run"))
        } else {
            Ok(ids.into_iter().flatten().collect())
        }
    })?;
    let mut adoptions = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(view) = adoption_view(&mut conn, run_id, id).await? {
            adoptions.push(view);
        }
    }
    Ok(Json(AdoptionList { adoptions }))
}

/// Read a saved adoption, its status and every check's result.
#[utoipa::path(get, operation_id = "get_verification_adoption", tag = "verification", path = "/api/v1/runs/{run_id}/verification-handoffs/adoptions/{request_id}", params(("run_id" = String, Path), ("request_id" = String, Path)),
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
