//! Reviewed continuations of saved work: candidates, actions and status, for both kinds.
//!
//! A **checkpoint continuation** lets a request that stopped at its retained checkpoint
//! continue on the same ticket (same attempt, budgets and charged usage). A
//! **final-outcome continuation** lets a worker accept a retained final report without
//! re-running anything; its window is for claiming only. A candidate starts no work;
//! an action is saved once per caller-owned id and admits the existing ticket through
//! the outbox.

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::json::StrictJson;
use super::path_id;
use super::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::digest;
use cairn_common::ids::Id;
use cairn_common::journal;
use cairn_common::policy::{self, Policy, MAX_WINDOW_SECONDS};
use cairn_common::request::{
    self,
    action::{self, Action, ActionKind, NewAction},
};
use cairn_common::run::{JobKind, JobMessage};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgConnection;
use utoipa::ToSchema;
use uuid::Uuid;

/// Which kind of continuation a route serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Checkpoint,
    FinalOutcome,
}

impl Kind {
    fn action(self) -> ActionKind {
        match self {
            Kind::Checkpoint => ActionKind::CheckpointContinuation,
            Kind::FinalOutcome => ActionKind::FinalOutcomeContinuation,
        }
    }

    fn name(self) -> &'static str {
        self.action().as_str()
    }

    fn job_kind(self) -> JobKind {
        match self {
            Kind::Checkpoint => JobKind::CheckpointContinuation,
            Kind::FinalOutcome => JobKind::FinalOutcomeContinuation,
        }
    }
}

/// Why a candidate cannot be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HoldReason {
    /// The recovery policy does not allow this kind of continuation.
    PolicyDisabled,
    /// The request is not where this kind continues from (stopped at a checkpoint, or
    /// idle awaiting acceptance of its report).
    NotRecoverable,
    /// A worker holds a live lease on the request.
    LiveOwner,
    /// The source changed since the checkpoint was retained.
    ChangedSource,
    /// The retained checkpoint or report is missing, or the journal no longer matches it.
    MissingCustody,
    /// A step started and has no receipt, and is not declared idempotent.
    UnknownEffect,
    /// The authority behind the run was revoked, or the caller may not act on it.
    RevokedAccess,
    /// Commands, wall time or the deadline are spent.
    ExhaustedLimits,
    /// The retained report was already accepted (consumed).
    AlreadyConsumed,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Hold {
    pub reason: HoldReason,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChargedUsage {
    pub commands: i32,
    pub wall_ms: i64,
    pub cpu_ms: i64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Limits {
    pub max_commands: i32,
    pub max_wall_seconds: i32,
    pub deadline: Option<DateTime<Utc>>,
}

/// The retained final report a final-outcome continuation would accept.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RetainedOutcome {
    /// `complete`, `blocked`, `clarification` or `failed`.
    pub outcome: String,
    pub followup_kind: Option<String>,
}

/// What a candidate binds, and whether it can be admitted now.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Candidate {
    /// `checkpoint_continuation_candidate` or `final_outcome_continuation_candidate`.
    pub kind: String,
    #[schema(value_type = String)]
    pub run_id: Id,
    #[schema(value_type = String)]
    pub request_id: Id,
    /// `READY` or `HELD`.
    pub admission: String,
    pub holds: Vec<Hold>,
    /// SHA-256 over everything the candidate binds; an action must quote it exactly.
    pub candidate_digest: String,
    pub request_state: String,
    pub attempt: i32,
    pub max_attempts: i32,
    pub charged_usage: ChargedUsage,
    pub limits: Limits,
    /// The longest `valid_for_seconds` an action may ask for now.
    pub maximum_window_seconds: i32,
    /// The retained checkpoint (checkpoint continuations).
    #[schema(value_type = Option<Object>)]
    pub checkpoint: Option<serde_json::Value>,
    /// The retained report (final-outcome continuations).
    pub retained_outcome: Option<RetainedOutcome>,
    /// `claim_only` for final-outcome continuations: the window is for claiming.
    pub admission_window_purpose: Option<String>,
    pub policy_revision: i64,
}

#[derive(sqlx::FromRow)]
struct RequestFacts {
    run_id: Uuid,
    request_id: Uuid,
    state: String,
    attempt: i32,
    max_attempts: i32,
    lease_epoch: i64,
    live_owner: bool,
    max_commands: i32,
    max_wall_seconds: i32,
    used_commands: i32,
    used_wall_ms: i64,
    used_cpu_ms: i64,
    checkpoint: Option<serde_json::Value>,
    source_digest: Option<String>,
    deadline: Option<DateTime<Utc>>,
    operator_id: Option<Uuid>,
    operator_revoked: bool,
    operator_role: Option<String>,
}

async fn facts(
    conn: &mut PgConnection,
    run_id: Uuid,
    request_id: Uuid,
    lock: bool,
) -> Result<Option<RequestFacts>, sqlx::Error> {
    let sql = format!(
        "SELECT r.id AS run_id, e.id AS request_id, e.state, e.attempt, e.max_attempts, e.lease_epoch,
                COALESCE(e.lease_owner IS NOT NULL AND e.lease_deadline > clock_timestamp(), FALSE) AS live_owner,
                e.max_commands, e.max_wall_seconds, e.used_commands, e.used_wall_ms, e.used_cpu_ms,
                e.checkpoint, e.source_digest, r.deadline, r.operator_id,
                COALESCE(t.revoked_at IS NOT NULL, FALSE) AS operator_revoked, t.role AS operator_role
           FROM execution_requests e
           JOIN runs r ON r.id = e.run_id
           LEFT JOIN api_tokens t ON t.id = r.operator_id
          WHERE e.id = $1 AND e.run_id = $2 AND e.kind = 'run'{}",
        if lock { " FOR UPDATE OF e" } else { "" }
    );
    sqlx::query_as(&sql)
        .bind(request_id)
        .bind(run_id)
        .fetch_optional(&mut *conn)
        .await
}

/// Computes the candidate from the current facts. `caller` matters for final-outcome
/// continuations, which only the run's original operator with admin access may take.
async fn candidate(
    conn: &mut PgConnection,
    kind: Kind,
    policy: &Policy,
    run_id: Uuid,
    request_id: Uuid,
    caller: &Caller,
    lock: bool,
) -> Result<Candidate, ApiError> {
    let f = facts(conn, run_id, request_id, lock)
        .await?
        .ok_or_else(|| ApiError::not_found("execution request of this run"))?;
    let now = Utc::now();
    let mut holds = Vec::new();
    let mut hold = |reason, message: &str| {
        holds.push(Hold {
            reason,
            message: message.to_string(),
        })
    };

    let allowed = match kind {
        Kind::Checkpoint => policy.allows_checkpoint_continuation(),
        Kind::FinalOutcome => policy.allows_final_outcome_continuation(),
    };
    if !allowed {
        hold(
            HoldReason::PolicyDisabled,
            "the recovery policy does not allow this continuation",
        );
    }
    if f.live_owner {
        hold(
            HoldReason::LiveOwner,
            "a worker holds a live lease on the request",
        );
    }
    let unknown: Vec<String> = journal::unknown_outcomes(conn, request_id, "")
        .await?
        .into_iter()
        .filter(|(_, idempotent)| !idempotent)
        .map(|(key, _)| key)
        .collect();
    if !unknown.is_empty() {
        hold(
            HoldReason::UnknownEffect,
            &format!(
                "steps with an unknown outcome need reconciliation: {}",
                unknown.join(", ")
            ),
        );
    }
    if f.operator_revoked {
        hold(
            HoldReason::RevokedAccess,
            "the token that submitted the run was revoked",
        );
    }
    let exhausted = f.used_commands >= f.max_commands
        || f.used_wall_ms >= i64::from(f.max_wall_seconds) * 1000
        || f.deadline.is_some_and(|d| d <= now);
    if exhausted {
        hold(
            HoldReason::ExhaustedLimits,
            "the request's commands, wall time or deadline are spent",
        );
    }
    let journal = journal::digest(conn, request_id).await?;

    let mut retained_outcome = None;
    let mut report_digest = None;
    match kind {
        Kind::Checkpoint => {
            if f.state != "stopped_at_checkpoint" {
                hold(
                    HoldReason::NotRecoverable,
                    &format!("the request is {}, not stopped at a checkpoint", f.state),
                );
            }
            match &f.checkpoint {
                None => hold(HoldReason::MissingCustody, "no retained checkpoint"),
                Some(checkpoint) => {
                    if checkpoint.get("journal_digest").and_then(|d| d.as_str())
                        != Some(journal.as_str())
                    {
                        hold(
                            HoldReason::MissingCustody,
                            "the journal no longer matches the retained checkpoint",
                        );
                    }
                    let retained_source = checkpoint.get("source_digest").and_then(|d| d.as_str());
                    if let (Some(retained), Some(current)) =
                        (retained_source, f.source_digest.as_deref())
                    {
                        if retained != current {
                            hold(
                                HoldReason::ChangedSource,
                                "the source changed since the checkpoint",
                            );
                        }
                    }
                }
            }
        }
        Kind::FinalOutcome => {
            if f.state != "needs_reconciliation" || f.live_owner {
                hold(
                    HoldReason::NotRecoverable,
                    &format!(
                        "the request is {}, not idle awaiting acceptance of its report",
                        f.state
                    ),
                );
            }
            let report: Option<(String, Option<String>, serde_json::Value, bool)> = sqlx::query_as(
                "SELECT f.outcome, f.followup_kind, f.body, c.request_id IS NOT NULL
                   FROM final_reports f LEFT JOIN report_consumptions c ON c.request_id = f.request_id
                  WHERE f.request_id = $1",
            )
            .bind(request_id)
            .fetch_optional(&mut *conn)
            .await?;
            match report {
                None => hold(HoldReason::MissingCustody, "no retained final report"),
                Some((outcome, followup_kind, body, consumed)) => {
                    if consumed {
                        hold(
                            HoldReason::AlreadyConsumed,
                            "the retained report was already accepted",
                        );
                    }
                    report_digest = Some(digest::of(
                        &json!({"outcome": outcome, "followup_kind": followup_kind, "body": body}),
                    ));
                    retained_outcome = Some(RetainedOutcome {
                        outcome,
                        followup_kind,
                    });
                }
            }
            let original_admin = f.operator_id == Some(caller.token_id)
                && f.operator_role.as_deref() == Some("admin")
                && !f.operator_revoked;
            if !original_admin {
                hold(
                    HoldReason::RevokedAccess,
                    "only the run's original operator, with current admin access, may accept its report",
                );
            }
        }
    }

    let window = policy.window_limit().min(MAX_WINDOW_SECONDS);
    let bound = json!({
        "kind": kind.name(),
        "run_id": f.run_id,
        "request_id": f.request_id,
        "state": f.state,
        "attempt": f.attempt,
        "lease_epoch": f.lease_epoch,
        "usage": [f.used_commands, f.used_wall_ms, f.used_cpu_ms],
        "limits": [f.max_commands, f.max_wall_seconds, f.deadline],
        "checkpoint": f.checkpoint,
        "journal_digest": journal,
        "source_digest": f.source_digest,
        "report_digest": report_digest,
        "operator": f.operator_id,
        "policy": [policy.revision, allowed, window],
    });
    Ok(Candidate {
        kind: format!("{}_candidate", kind.name()),
        run_id: f.run_id.into(),
        request_id: f.request_id.into(),
        admission: if holds.is_empty() { "READY" } else { "HELD" }.to_string(),
        holds,
        candidate_digest: digest::of_json(&bound),
        request_state: f.state,
        attempt: f.attempt,
        max_attempts: f.max_attempts,
        charged_usage: ChargedUsage {
            commands: f.used_commands,
            wall_ms: f.used_wall_ms,
            cpu_ms: f.used_cpu_ms,
        },
        limits: Limits {
            max_commands: f.max_commands,
            max_wall_seconds: f.max_wall_seconds,
            deadline: f.deadline,
        },
        maximum_window_seconds: window,
        checkpoint: f.checkpoint,
        retained_outcome,
        admission_window_purpose: (kind == Kind::FinalOutcome).then(|| "claim_only".to_string()),
        policy_revision: policy.revision,
    })
}

/// Strict version-1 body of a checkpoint continuation action.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointContinuationInputV1 {
    /// Integer 1.
    pub version: u32,
    /// The exact current candidate's 64-character digest.
    pub candidate_digest: String,
    /// 1 to the candidate's `maximum_window_seconds` (at most 7,200).
    pub valid_for_seconds: u32,
    /// Boolean `true`.
    pub acknowledge_retained_response_consumed_once: bool,
    /// Boolean `true`.
    pub acknowledge_no_completed_effect_replay: bool,
    /// Boolean `true`.
    pub acknowledge_same_request_attempt_and_budgets: bool,
    /// Boolean `true`.
    pub acknowledge_finite_ownership_lease: bool,
}

/// Strict version-1 body of a final-outcome continuation action.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinalOutcomeContinuationInputV1 {
    /// Integer 1.
    pub version: u32,
    pub candidate_digest: String,
    /// The claim window, 1 to the candidate's `maximum_window_seconds`.
    pub valid_for_seconds: u32,
    pub acknowledge_already_consumed_final_output: bool,
    pub acknowledge_no_completed_effect_replay: bool,
    pub acknowledge_same_request_attempt_and_budgets: bool,
    pub acknowledge_finite_ownership_lease: bool,
}

/// What both bodies share once validated.
struct ActionInput {
    candidate_digest: String,
    valid_for_seconds: u32,
    raw: serde_json::Value,
}

impl ActionInput {
    /// Checks what both version-1 bodies share and keeps the exact body for its digest.
    fn validated<T: Serialize>(
        body: &T,
        version: u32,
        candidate_digest: &str,
        valid_for_seconds: u32,
        acknowledgements: &[(&'static str, bool)],
    ) -> Result<Self, ApiError> {
        if version != 1 {
            return Err(ApiError::unprocessable("version", "version must be 1"));
        }
        if !digest::is_digest(candidate_digest) {
            return Err(ApiError::unprocessable(
                "candidate_digest",
                "a 64-character lowercase hex digest",
            ));
        }
        if !(1..=MAX_WINDOW_SECONDS as u32).contains(&valid_for_seconds) {
            return Err(ApiError::unprocessable(
                "valid_for_seconds",
                "from 1 to 7200",
            ));
        }
        if let Some((name, _)) = acknowledgements.iter().find(|(_, given)| !given) {
            return Err(ApiError::unprocessable(
                *name,
                "this acknowledgement must be true",
            ));
        }
        Ok(ActionInput {
            candidate_digest: candidate_digest.to_string(),
            valid_for_seconds,
            raw: serde_json::to_value(body).unwrap_or_default(),
        })
    }
}

impl TryFrom<CheckpointContinuationInputV1> for ActionInput {
    type Error = ApiError;

    fn try_from(b: CheckpointContinuationInputV1) -> Result<Self, ApiError> {
        let acknowledgements = [
            (
                "acknowledge_retained_response_consumed_once",
                b.acknowledge_retained_response_consumed_once,
            ),
            (
                "acknowledge_no_completed_effect_replay",
                b.acknowledge_no_completed_effect_replay,
            ),
            (
                "acknowledge_same_request_attempt_and_budgets",
                b.acknowledge_same_request_attempt_and_budgets,
            ),
            (
                "acknowledge_finite_ownership_lease",
                b.acknowledge_finite_ownership_lease,
            ),
        ];
        Self::validated(
            &b,
            b.version,
            &b.candidate_digest,
            b.valid_for_seconds,
            &acknowledgements,
        )
    }
}

impl TryFrom<FinalOutcomeContinuationInputV1> for ActionInput {
    type Error = ApiError;

    fn try_from(b: FinalOutcomeContinuationInputV1) -> Result<Self, ApiError> {
        let acknowledgements = [
            (
                "acknowledge_already_consumed_final_output",
                b.acknowledge_already_consumed_final_output,
            ),
            (
                "acknowledge_no_completed_effect_replay",
                b.acknowledge_no_completed_effect_replay,
            ),
            (
                "acknowledge_same_request_attempt_and_budgets",
                b.acknowledge_same_request_attempt_and_budgets,
            ),
            (
                "acknowledge_finite_ownership_lease",
                b.acknowledge_finite_ownership_lease,
            ),
        ];
        Self::validated(
            &b,
            b.version,
            &b.candidate_digest,
            b.valid_for_seconds,
            &acknowledgements,
        )
    }
}

/// The finite lease an action grants.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FiniteLease {
    pub valid_for_seconds: i32,
    pub window_ends_at: DateTime<Utc>,
    /// `execution` for checkpoint continuations, `claim_only` for final-outcome ones.
    pub admission_window_purpose: String,
}

/// A saved action (the receipt of a POST) and, in status reads, its worker outcome.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ActionView {
    /// `checkpoint_continuation_status` or `final_outcome_continuation_status`.
    pub kind: String,
    #[schema(value_type = String)]
    pub run_id: Id,
    #[schema(value_type = String)]
    pub request_id: Id,
    /// Absent when no action was saved (`not_recovered`).
    #[schema(value_type = Option<String>)]
    pub action_id: Option<Id>,
    /// `not_recovered`, `queued`, `executing`, `completed`, `failed` or `needs_reconciliation`.
    pub status: String,
    pub witness_digest: Option<String>,
    pub admission_seal: Option<String>,
    pub candidate_digest: Option<String>,
    pub input_digest: Option<String>,
    pub lease: Option<FiniteLease>,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
}

fn action_view(kind: Kind, row: Action) -> ActionView {
    ActionView {
        kind: format!("{}_status", kind.name()),
        run_id: row.run_id.into(),
        request_id: row.request_id.into(),
        action_id: Some(row.id.into()),
        status: row.status.as_str().to_string(),
        witness_digest: Some(row.witness_digest),
        admission_seal: Some(row.admission_seal),
        candidate_digest: Some(row.candidate_digest),
        input_digest: Some(row.input_digest),
        lease: Some(FiniteLease {
            valid_for_seconds: row.valid_for_seconds,
            window_ends_at: row.window_ends_at,
            admission_window_purpose: match kind {
                Kind::Checkpoint => "execution",
                Kind::FinalOutcome => "claim_only",
            }
            .to_string(),
        }),
        created_at: Some(row.created_at),
        updated_at: Some(row.updated_at),
    }
}

async fn read_candidate(
    state: &AppState,
    kind: Kind,
    caller: &Caller,
    run_id: &str,
    request_id: &str,
) -> Result<Candidate, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(run_id, "run_id")?;
    let request_id = path_id(request_id, "request_id")?;
    let policy = policy::load(&state.pool).await?;
    let mut conn = state.pool.acquire().await?;
    candidate(&mut conn, kind, &policy, run_id, request_id, caller, false).await
}

async fn save_action(
    state: &AppState,
    kind: Kind,
    caller: &Caller,
    ids: (String, String, String),
    input: ActionInput,
) -> Result<Response, ApiError> {
    caller.require(Role::Admin)?;
    let run_id = path_id(&ids.0, "run_id")?;
    let request_id = path_id(&ids.1, "request_id")?;
    let action_id = path_id(&ids.2, "action_id")?;
    let input_digest = digest::of_json(&input.raw);

    let mut tx = state.pool.begin().await?;
    // Serialize every admission of this request on its row.
    let policy = policy::load(&state.pool).await?;
    let current = candidate(&mut tx, kind, &policy, run_id, request_id, caller, true).await?;

    if let Some(row) = action::find(&mut tx, action_id).await? {
        let same = row.kind == kind.action()
            && row.run_id == run_id
            && row.request_id == request_id
            && row.input_digest == input_digest;
        if same {
            // The same action and input: the same receipt, and nothing more admitted.
            return Ok((StatusCode::CREATED, Json(action_view(kind, row))).into_response());
        }
        return Err(ApiError::conflict(
            "action_id_conflict",
            "this action id was saved with different input; read its status instead of submitting again",
        ));
    }
    let checkpoint_ref = match kind {
        Kind::Checkpoint => format!(
            "checkpoint:{}",
            current
                .checkpoint
                .as_ref()
                .and_then(|c| c.get("sequence"))
                .map(|s| s.to_string())
                .unwrap_or_default()
        ),
        Kind::FinalOutcome => "final_report".to_string(),
    };
    if action::taken(&mut tx, request_id, kind.action(), &checkpoint_ref).await? {
        return Err(ApiError::conflict(
            "checkpoint_already_admitted",
            "another action was already saved for this checkpoint",
        ));
    }
    if current.admission != "READY" {
        let reasons: Vec<String> = current
            .holds
            .iter()
            .map(|h| {
                serde_json::to_value(h.reason)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default()
            })
            .collect();
        return Err(ApiError::conflict(
            "candidate_held",
            format!(
                "the candidate is held ({}); nothing was admitted",
                reasons.join(", ")
            ),
        ));
    }
    if input.candidate_digest != current.candidate_digest {
        return Err(ApiError::conflict(
            "candidate_digest_mismatch",
            "candidate_digest is not the current candidate's; read the candidate again",
        )
        .with_field("candidate_digest"));
    }
    if input.valid_for_seconds > current.maximum_window_seconds as u32 {
        return Err(ApiError::unprocessable(
            "valid_for_seconds",
            format!(
                "at most the candidate's maximum_window_seconds ({})",
                current.maximum_window_seconds
            ),
        ));
    }

    let now = Utc::now();
    let window_ends_at = now + chrono::Duration::seconds(i64::from(input.valid_for_seconds));
    let witness_digest = digest::of_json(&json!({
        "candidate_digest": current.candidate_digest,
        "holds": [],
        "checked_at": now,
        "checked_by": caller.token_id,
    }));
    let admission_seal = digest::of_json(&json!({
        "action_id": action_id,
        "input_digest": input_digest,
        "witness_digest": witness_digest,
        "window_ends_at": window_ends_at,
    }));
    let row = action::save(
        &mut tx,
        &NewAction {
            id: action_id,
            kind: kind.action(),
            run_id,
            request_id,
            checkpoint_ref: &checkpoint_ref,
            operator_id: caller.token_id,
            input: &input.raw,
            input_digest: &input_digest,
            candidate_digest: &current.candidate_digest,
            witness_digest: &witness_digest,
            admission_seal: &admission_seal,
            valid_for_seconds: i32::try_from(input.valid_for_seconds).unwrap_or(MAX_WINDOW_SECONDS),
            window_ends_at,
        },
    )
    .await?;
    // The same ticket is queued again: no new attempt, no budget reset.
    let message = JobMessage {
        kind: kind.job_kind(),
        run_id,
        request_id,
        action_id: Some(action_id),
        attempt: Some(current.attempt),
    };
    request::readmit(&mut tx, &message).await?;
    tx.commit().await?;
    state.metrics.continuations_admitted.inc();
    Ok((StatusCode::CREATED, Json(action_view(kind, row))).into_response())
}

async fn read_status(
    state: &AppState,
    kind: Kind,
    caller: &Caller,
    run_id: &str,
    request_id: &str,
) -> Result<ActionView, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(run_id, "run_id")?;
    let request_id = path_id(request_id, "request_id")?;
    let exists: Option<(Uuid,)> =
        sqlx::query_as("SELECT id FROM execution_requests WHERE id = $1 AND run_id = $2")
            .bind(request_id)
            .bind(run_id)
            .fetch_optional(&state.pool)
            .await?;
    if exists.is_none() {
        return Err(ApiError::not_found("execution request of this run"));
    }
    let mut conn = state.pool.acquire().await?;
    let row = action::latest(&mut conn, request_id, kind.action()).await?;
    Ok(match row {
        Some(row) => action_view(kind, row),
        None => ActionView {
            kind: format!("{}_status", kind.name()),
            run_id: run_id.into(),
            request_id: request_id.into(),
            action_id: None,
            status: "not_recovered".into(),
            witness_digest: None,
            admission_seal: None,
            candidate_digest: None,
            input_digest: None,
            lease: None,
            created_at: None,
            updated_at: None,
        },
    })
}

/// Inspect a checkpoint continuation candidate; starts no work.
#[utoipa::path(get, path = "/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}/candidate",
    tag = "checkpoint continuations", params(("run_id" = String, Path), ("request_id" = String, Path)),
    responses((status = 200, body = Candidate), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn checkpoint_candidate(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, request_id)): Path<(String, String)>,
) -> Result<Json<Candidate>, ApiError> {
    read_candidate(&state, Kind::Checkpoint, &caller, &run_id, &request_id)
        .await
        .map(Json)
}

/// Save one reviewed checkpoint continuation on the existing ticket (admin).
#[utoipa::path(post, path = "/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}/actions/{action_id}",
    tag = "checkpoint continuations",
    params(("run_id" = String, Path), ("request_id" = String, Path), ("action_id" = String, Path, description = "Caller-owned, 32 lowercase hex")),
    request_body = CheckpointContinuationInputV1,
    responses((status = 201, description = "Saved (or the identical earlier receipt)", body = ActionView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn checkpoint_action(
    State(state): State<AppState>,
    caller: Caller,
    Path(ids): Path<(String, String, String)>,
    StrictJson(body): StrictJson<CheckpointContinuationInputV1>,
) -> Result<Response, ApiError> {
    let input = ActionInput::try_from(body)?;
    save_action(&state, Kind::Checkpoint, &caller, ids, input).await
}

/// Read the saved checkpoint continuation and its worker status.
#[utoipa::path(get, path = "/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}/status",
    tag = "checkpoint continuations", params(("run_id" = String, Path), ("request_id" = String, Path)),
    responses((status = 200, body = ActionView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn checkpoint_status(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, request_id)): Path<(String, String)>,
) -> Result<Json<ActionView>, ApiError> {
    read_status(&state, Kind::Checkpoint, &caller, &run_id, &request_id)
        .await
        .map(Json)
}

/// Review a retained final report and current eligibility; changes nothing.
#[utoipa::path(get, path = "/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}/candidate",
    tag = "final-outcome continuations", params(("run_id" = String, Path), ("request_id" = String, Path)),
    responses((status = 200, body = Candidate), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn final_candidate(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, request_id)): Path<(String, String)>,
) -> Result<Json<Candidate>, ApiError> {
    read_candidate(&state, Kind::FinalOutcome, &caller, &run_id, &request_id)
        .await
        .map(Json)
}

/// Save one reviewed final-outcome acceptance (the run's original operator, as admin).
#[utoipa::path(post, path = "/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}/actions/{action_id}",
    tag = "final-outcome continuations",
    params(("run_id" = String, Path), ("request_id" = String, Path), ("action_id" = String, Path)),
    request_body = FinalOutcomeContinuationInputV1,
    responses((status = 201, body = ActionView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn final_action(
    State(state): State<AppState>,
    caller: Caller,
    Path(ids): Path<(String, String, String)>,
    StrictJson(body): StrictJson<FinalOutcomeContinuationInputV1>,
) -> Result<Response, ApiError> {
    let input = ActionInput::try_from(body)?;
    // Only the run's original operator may act; checked before anything else is read.
    let run_id = path_id(&ids.0, "run_id")?;
    let operator: Option<Option<Uuid>> =
        sqlx::query_scalar("SELECT operator_id FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_optional(&state.pool)
            .await?;
    match operator {
        None => return Err(ApiError::not_found("run")),
        Some(op) if op != Some(caller.token_id) => {
            return Err(ApiError::forbidden(
                "only the run's original operator may accept its report",
            ))
        }
        Some(_) => {}
    }
    save_action(&state, Kind::FinalOutcome, &caller, ids, input).await
}

/// Read the saved final-outcome action and its worker outcome.
#[utoipa::path(get, path = "/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}/status",
    tag = "final-outcome continuations", params(("run_id" = String, Path), ("request_id" = String, Path)),
    responses((status = 200, body = ActionView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn final_status(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, request_id)): Path<(String, String)>,
) -> Result<Json<ActionView>, ApiError> {
    read_status(&state, Kind::FinalOutcome, &caller, &run_id, &request_id)
        .await
        .map(Json)
}
