//! A verification handoff's candidate: what an adoption must quote (the pending
//! request, the source, the frozen commands, the policy and the provider) and whether
//! it can be adopted now, as a pure function of the facts the handler gathered.

use cairn_common::digest;
use cairn_common::ids::Id;
use cairn_common::policy::Policy;
use cairn_common::request::RequestState;
use cairn_common::verification::{self as checks, CheckCommand, Purpose};
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;
use uuid::Uuid;

/// The runner profile verification checks run under (part of the provider digest).
const RUNNER_PROFILE: &str = "linux-netns-v1";

/// One frozen check as the candidate shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CandidateCommand {
    /// 1-based position in the frozen list.
    #[schema(minimum = 1)]
    pub index: usize,
    pub arguments: Vec<String>,
    pub purpose: Purpose,
    pub cwd: Option<String>,
    pub command_digest: String,
}

/// A check that may be declared reusable.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReusableCandidate {
    /// The check's 1-based position in the frozen list.
    #[schema(minimum = 1)]
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

/// What a candidate is computed from: the run's execution request and its open handoff.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Facts {
    pub request_id: Uuid,
    pub state: String,
    pub attempt: i32,
    pub max_commands: i32,
    pub used_commands: i32,
    pub agent: String,
    pub handoff_id: Option<Uuid>,
    pub commands: Option<serde_json::Value>,
    pub commands_digest: Option<String>,
    pub source_digest: Option<String>,
}

pub fn policy_digest(policy: &Policy) -> String {
    digest::of(policy)
}

pub fn provider_digest(agent: &str) -> String {
    digest::of_json(&json!({"agent": agent, "runner": RUNNER_PROFILE}))
}

/// The current candidate and its frozen checks, or why there is none (the request has
/// no pending handoff, or its checks cannot be read).
pub fn evaluate(
    run_id: Uuid,
    facts: &Facts,
    agent: String,
    policy: &Policy,
) -> Result<(HandoffCandidate, Vec<CheckCommand>), String> {
    let (Some(handoff_id), Some(commands), Some(commands_digest)) =
        (facts.handoff_id, &facts.commands, &facts.commands_digest)
    else {
        return Err(format!(
            "the run has no pending verification handoff (its request is {})",
            facts.state
        ));
    };
    let frozen: Vec<CheckCommand> = serde_json::from_value(commands.clone())
        .map_err(|_| "the handoff's checks cannot be read".to_string())?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn policy() -> Policy {
        Policy {
            enabled: true,
            allow_checkpoint_continuation: true,
            allow_final_outcome_continuation: true,
            maximum_window_seconds: 3600,
            revision: 3,
            updated_at: Utc::now(),
        }
    }

    fn pending() -> Facts {
        Facts {
            request_id: Uuid::from_u128(2),
            state: "awaiting_verification".into(),
            attempt: 1,
            max_commands: 10,
            used_commands: 4,
            agent: "coder".into(),
            handoff_id: Some(Uuid::from_u128(3)),
            commands: Some(json!([
                {"argv": ["cargo", "build"], "purpose": "source_build"},
                {"argv": ["cargo", "test"], "purpose": "test"},
                {"argv": ["psql", "-c", "select 1"], "purpose": "database_integration"},
            ])),
            commands_digest: Some("d".repeat(64)),
            source_digest: Some("s".repeat(64)),
        }
    }

    fn evaluated(facts: &Facts) -> Result<HandoffCandidate, String> {
        evaluate(Uuid::from_u128(1), facts, "coder".into(), &policy()).map(|(c, _)| c)
    }

    #[test]
    fn a_pending_handoff_is_ready_and_offers_only_reusable_kinds() {
        let candidate = evaluated(&pending()).expect("a candidate");
        assert_eq!(candidate.admission, "READY", "{:?}", candidate.holds);
        assert_eq!(candidate.commands.len(), 3);
        let offered: Vec<usize> = candidate
            .reusable_build_candidates
            .iter()
            .map(|c| c.index)
            .collect();
        assert_eq!(
            offered,
            [1, 2],
            "a database check is never offered for reuse"
        );
        assert_eq!(candidate.budget.remaining_commands, 6);
        assert_eq!(candidate.provider_digest, provider_digest("coder"));
    }

    #[test]
    fn a_candidate_is_held_without_a_source_witness_or_off_its_state() {
        let unwitnessed = Facts {
            source_digest: None,
            ..pending()
        };
        let held = evaluated(&unwitnessed).expect("a candidate");
        assert_eq!(held.admission, "HELD");
        assert_eq!(held.holds, ["missing_source_witness"]);
        let moved = Facts {
            state: "executing".into(),
            ..pending()
        };
        assert_eq!(
            evaluated(&moved).expect("a candidate").holds,
            ["request_not_awaiting_verification"]
        );
    }

    #[test]
    fn no_pending_handoff_is_no_candidate_and_the_digest_binds_the_request() {
        let none = Facts {
            handoff_id: None,
            ..pending()
        };
        assert!(evaluated(&none).is_err());
        let unreadable = Facts {
            commands: Some(json!({"not": "a list"})),
            ..pending()
        };
        assert!(evaluated(&unreadable).is_err());
        let base = evaluated(&pending())
            .expect("a candidate")
            .pending_request_digest;
        let charged = Facts {
            used_commands: 5,
            ..pending()
        };
        assert_ne!(
            base,
            evaluated(&charged)
                .expect("a candidate")
                .pending_request_digest
        );
    }
}
