//! A continuation's candidate: whether it can be admitted now, and what it binds, as a
//! pure function of the facts the handler gathered and the recovery policy. It starts
//! no work and reads nothing itself.

use cairn_common::digest;
use cairn_common::ids::Id;
use cairn_common::policy::{Policy, MAX_WINDOW_SECONDS};
use cairn_common::request::action::ActionKind;
use cairn_common::run::JobKind;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;
use uuid::Uuid;

/// Which kind of continuation a route serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Checkpoint,
    FinalOutcome,
}

impl Kind {
    pub fn action(self) -> ActionKind {
        match self {
            Kind::Checkpoint => ActionKind::CheckpointContinuation,
            Kind::FinalOutcome => ActionKind::FinalOutcomeContinuation,
        }
    }

    pub fn name(self) -> &'static str {
        self.action().as_str()
    }

    pub fn job_kind(self) -> JobKind {
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
    /// The work context's current tree is not the tree the request's work stands on
    /// (another run moved it on, or it was restored elsewhere).
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
    /// The checkpoint's snapshot was retired or reclaimed (a retention policy, a
    /// credential rotation): a continuation would start without the work its receipts
    /// describe.
    CheckpointReclaimed,
    /// The current implementation's source profile is not registered as qualified, or
    /// the checkpoint was retained under one that is not.
    IncompatibleQualification,
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
    /// The digest of the current implementation's source profile
    /// (`GET /api/v1/qualification`).
    pub source_profile: String,
}

/// What the candidate is computed from: the request as read (locked, when admitting),
/// its journal and its retained report.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Facts {
    pub run_id: Uuid,
    pub request_id: Uuid,
    pub state: String,
    pub attempt: i32,
    pub max_attempts: i32,
    pub lease_epoch: i64,
    pub live_owner: bool,
    pub max_commands: i32,
    pub max_wall_seconds: i32,
    pub used_commands: i32,
    pub used_wall_ms: i64,
    pub used_cpu_ms: i64,
    pub checkpoint: Option<serde_json::Value>,
    /// Receipts stand on snapshots, and the lineage has no restorable head any more.
    pub checkpoint_reclaimed: bool,
    /// The digest of the tree the request's receipts stand on (its latest snapshot's;
    /// with no such receipt, the tree its work context had when it started).
    pub journal_source: Option<String>,
    /// The digest of the work context's current tree (its lineage head's, or the empty
    /// tree's), what a continuation goes on from.
    pub source_digest: Option<String>,
    pub deadline: Option<DateTime<Utc>>,
    pub operator_id: Option<Uuid>,
    pub operator_revoked: bool,
    pub operator_role: Option<String>,
    /// Steps that started, have no receipt, and may not run again.
    #[sqlx(skip)]
    pub unknown_effects: Vec<String>,
    /// The digest of the request's receipts now.
    #[sqlx(skip)]
    pub journal_digest: String,
    /// The retained final report, if any.
    #[sqlx(skip)]
    pub report: Option<Report>,
    #[sqlx(skip)]
    pub qualification: Qualification,
}

/// The source profiles a candidate stands on: the current implementation's, and the
/// one its checkpoint was retained under.
#[derive(Debug, Clone, Default)]
pub struct Qualification {
    pub current: String,
    pub current_qualified: bool,
    /// The checkpoint's profile, when it records one.
    pub retained: Option<String>,
    pub retained_qualified: bool,
}

/// A retained final report as a candidate sees it.
#[derive(Debug, Clone)]
pub struct Report {
    pub outcome: String,
    pub followup_kind: Option<String>,
    pub body: serde_json::Value,
    /// Already accepted (consumed).
    pub consumed: bool,
}

/// Computes the candidate of `kind` from `facts` and `policy`. `caller` matters for
/// final-outcome continuations, which only the run's original operator with admin
/// access may take.
pub fn evaluate(
    kind: Kind,
    facts: Facts,
    policy: &Policy,
    caller: Uuid,
    now: DateTime<Utc>,
) -> Candidate {
    let f = facts;
    let mut holds = Holds::default();
    let allowed = general_holds(kind, &f, policy, now, &mut holds);
    qualification_holds(kind, &f, &mut holds);
    let (retained_outcome, report_digest) = match kind {
        Kind::Checkpoint => {
            checkpoint_holds(&f, &mut holds);
            (None, None)
        }
        Kind::FinalOutcome => report_holds(&f, caller, &mut holds),
    };
    let holds = holds.0;

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
        "journal_digest": f.journal_digest,
        "source_digest": f.source_digest,
        "report_digest": report_digest,
        "operator": f.operator_id,
        "policy": [policy.revision, allowed, window],
        "source_profile": f.qualification.current,
    });
    Candidate {
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
        source_profile: f.qualification.current,
    }
}

/// The holds a candidate collects, each with its reason and message.
#[derive(Default)]
struct Holds(Vec<Hold>);

impl Holds {
    fn add(&mut self, reason: HoldReason, message: &str) {
        self.0.push(Hold {
            reason,
            message: message.to_string(),
        });
    }
}

/// The holds of either kind: the policy, a live owner, unknown effects, a revoked
/// operator, spent limits. Returns whether the policy allows the kind.
fn general_holds(
    kind: Kind,
    f: &Facts,
    policy: &Policy,
    now: DateTime<Utc>,
    holds: &mut Holds,
) -> bool {
    let allowed = match kind {
        Kind::Checkpoint => policy.allows_checkpoint_continuation(),
        Kind::FinalOutcome => policy.allows_final_outcome_continuation(),
    };
    if !allowed {
        holds.add(
            HoldReason::PolicyDisabled,
            "the recovery policy does not allow this continuation",
        );
    }
    if f.live_owner {
        holds.add(
            HoldReason::LiveOwner,
            "a worker holds a live lease on the request",
        );
    }
    if !f.unknown_effects.is_empty() {
        holds.add(
            HoldReason::UnknownEffect,
            &format!(
                "steps with an unknown outcome need reconciliation: {}",
                f.unknown_effects.join(", ")
            ),
        );
    }
    if f.operator_revoked {
        holds.add(
            HoldReason::RevokedAccess,
            "the token that submitted the run was revoked",
        );
    }
    let exhausted = f.used_commands >= f.max_commands
        || f.used_wall_ms >= i64::from(f.max_wall_seconds) * 1000
        || f.deadline.is_some_and(|d| d <= now);
    if exhausted {
        holds.add(
            HoldReason::ExhaustedLimits,
            "the request's commands, wall time or deadline are spent",
        );
    }
    allowed
}

/// The qualification holds: the current implementation's profile must be registered as
/// qualified, and a checkpoint must have been retained under a qualified profile.
fn qualification_holds(kind: Kind, f: &Facts, holds: &mut Holds) {
    let q = &f.qualification;
    if !q.current_qualified {
        holds.add(
            HoldReason::IncompatibleQualification,
            &format!(
                "this implementation's source profile {}… is not registered as qualified",
                short(&q.current)
            ),
        );
    }
    if kind != Kind::Checkpoint || f.checkpoint.is_none() {
        return;
    }
    match q.retained.as_deref() {
        None => holds.add(
            HoldReason::IncompatibleQualification,
            "the checkpoint records no source profile",
        ),
        Some(retained) if retained != q.current && !q.retained_qualified => holds.add(
            HoldReason::IncompatibleQualification,
            &format!(
                "the checkpoint was retained under source profile {}…, which is not qualified",
                short(retained)
            ),
        ),
        Some(_) => {}
    }
}

/// A checkpoint continuation's holds: the request stopped at a checkpoint that is
/// retained, matches the journal, is not reclaimed, and has the current source.
fn checkpoint_holds(f: &Facts, holds: &mut Holds) {
    if f.state != "stopped_at_checkpoint" {
        holds.add(
            HoldReason::NotRecoverable,
            &format!("the request is {}, not stopped at a checkpoint", f.state),
        );
    }
    match &f.checkpoint {
        None => holds.add(HoldReason::MissingCustody, "no retained checkpoint"),
        Some(checkpoint) => {
            if checkpoint.get("journal_digest").and_then(|d| d.as_str())
                != Some(f.journal_digest.as_str())
            {
                holds.add(
                    HoldReason::MissingCustody,
                    "the journal no longer matches the retained checkpoint",
                );
            }
            if f.checkpoint_reclaimed {
                holds.add(
                    HoldReason::CheckpointReclaimed,
                    "the checkpoint's snapshot was retired or reclaimed",
                );
            }
            let retained = checkpoint.get("source_digest").and_then(|d| d.as_str());
            source_holds(retained, f, f.checkpoint_reclaimed, holds);
        }
    }
}

/// The source holds: the tree a continuation would go on from (the work context's
/// current head) must be the tree the request's work stands on (`retained`, as its
/// checkpoint or its last receipt recorded it). Missing evidence on either side holds
/// too: nothing proves the source unchanged. `reclaimed_held`: a reclaimed checkpoint
/// already holds the candidate, saying why the current tree is missing.
fn source_holds(retained: Option<&str>, f: &Facts, reclaimed_held: bool, holds: &mut Holds) {
    match (retained, f.source_digest.as_deref()) {
        (Some(retained), Some(current)) if retained == current => {}
        (Some(retained), Some(current)) => holds.add(
            HoldReason::ChangedSource,
            &format!(
                "the source changed since the request's work was retained: its tree {}…, the current tree {}…",
                short(retained),
                short(current)
            ),
        ),
        (None, _) => holds.add(
            HoldReason::MissingCustody,
            "nothing records the tree the request's work stands on (a checkpoint from before tree digests, or a snapshot without one)",
        ),
        (Some(_), None) if reclaimed_held => {}
        (Some(_), None) => holds.add(
            HoldReason::MissingCustody,
            "the work context has no current tree to continue from",
        ),
    }
}

fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

/// A final-outcome continuation's holds (a retained report not yet accepted, on an
/// unchanged source, the request idle awaiting it, the run's own admin asking), and the
/// report's outcome and digest.
fn report_holds(
    f: &Facts,
    caller: Uuid,
    holds: &mut Holds,
) -> (Option<RetainedOutcome>, Option<String>) {
    let (mut retained_outcome, mut report_digest) = (None, None);
    if f.state != "needs_reconciliation" || f.live_owner {
        holds.add(
            HoldReason::NotRecoverable,
            &format!(
                "the request is {}, not idle awaiting acceptance of its report",
                f.state
            ),
        );
    }
    match &f.report {
        None => holds.add(HoldReason::MissingCustody, "no retained final report"),
        Some(report) => {
            source_holds(f.journal_source.as_deref(), f, false, holds);
            if report.consumed {
                holds.add(
                    HoldReason::AlreadyConsumed,
                    "the retained report was already accepted",
                );
            }
            report_digest = Some(cairn_common::report::digest(
                &report.outcome,
                report.followup_kind.as_deref(),
                &report.body,
            ));
            retained_outcome = Some(RetainedOutcome {
                outcome: report.outcome.clone(),
                followup_kind: report.followup_kind.clone(),
            });
        }
    }
    let original_admin = f.operator_id == Some(caller)
        && f.operator_role.as_deref() == Some("admin")
        && !f.operator_revoked;
    if !original_admin {
        holds.add(
            HoldReason::RevokedAccess,
            "only the run's original operator, with current admin access, may accept its report",
        );
    }
    (retained_outcome, report_digest)
}

#[cfg(test)]
mod tests;
