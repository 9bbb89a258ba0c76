//! A continuation action: its strict version-1 bodies, and the saved action as the API
//! shows it.

use super::candidate::Kind;
use crate::api::error::ApiError;
use cairn_common::digest;
use cairn_common::ids::Id;
use cairn_common::policy::MAX_WINDOW_SECONDS;
use cairn_common::request::action::Action;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Strict version-1 body of a checkpoint continuation action.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointContinuationInputV1 {
    /// Integer 1.
    #[schema(minimum = 1, maximum = 1)]
    pub version: u32,
    /// The exact current candidate's 64-character digest.
    pub candidate_digest: String,
    /// 1 to the candidate's `maximum_window_seconds` (at most 7,200).
    #[schema(minimum = 1, maximum = 7200)]
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
    #[schema(minimum = 1, maximum = 1)]
    pub version: u32,
    pub candidate_digest: String,
    /// The claim window, 1 to the candidate's `maximum_window_seconds`.
    #[schema(minimum = 1, maximum = 7200)]
    pub valid_for_seconds: u32,
    pub acknowledge_already_consumed_final_output: bool,
    pub acknowledge_no_completed_effect_replay: bool,
    pub acknowledge_same_request_attempt_and_budgets: bool,
    pub acknowledge_finite_ownership_lease: bool,
}

/// What both bodies share once validated.
pub struct ActionInput {
    pub candidate_digest: String,
    pub valid_for_seconds: u32,
    /// The exact body, for its digest.
    pub raw: serde_json::Value,
}

/// The acknowledgements both version-1 bodies share, after their kind's own first one.
const SHARED_ACKNOWLEDGEMENTS: [&str; 3] = [
    "acknowledge_no_completed_effect_replay",
    "acknowledge_same_request_attempt_and_budgets",
    "acknowledge_finite_ownership_lease",
];

/// What both version-1 bodies hold, read from either.
struct Common<'a> {
    version: u32,
    candidate_digest: &'a str,
    valid_for_seconds: u32,
    /// The kind's own acknowledgement.
    own: (&'static str, bool),
    shared: [bool; 3],
}

impl ActionInput {
    /// Checks what both version-1 bodies share and keeps the exact body for its digest.
    fn validated<T: Serialize>(body: &T, c: Common<'_>) -> Result<Self, ApiError> {
        if c.version != 1 {
            return Err(ApiError::unprocessable("version", "version must be 1"));
        }
        if !digest::is_digest(c.candidate_digest) {
            return Err(ApiError::unprocessable(
                "candidate_digest",
                "a 64-character lowercase hex digest",
            ));
        }
        if !(1..=MAX_WINDOW_SECONDS as u32).contains(&c.valid_for_seconds) {
            return Err(ApiError::unprocessable(
                "valid_for_seconds",
                "from 1 to 7200",
            ));
        }
        let acknowledgements =
            std::iter::once(c.own).chain(SHARED_ACKNOWLEDGEMENTS.into_iter().zip(c.shared));
        if let Some((name, _)) = acknowledgements.into_iter().find(|(_, given)| !given) {
            return Err(ApiError::unprocessable(
                name,
                "this acknowledgement must be true",
            ));
        }
        // A derived Serialize of plain fields cannot fail; were it to, the digest would
        // be of nothing, so it is refused rather than defaulted.
        let raw = serde_json::to_value(body).map_err(|_| {
            ApiError::unprocessable("body", "the body could not be kept for its digest")
        })?;
        Ok(ActionInput {
            candidate_digest: c.candidate_digest.to_string(),
            valid_for_seconds: c.valid_for_seconds,
            raw,
        })
    }
}

/// Both version-1 bodies validate the same way; each has one acknowledgement of its own.
macro_rules! action_input_from {
    ($body:ty, $own:ident) => {
        impl TryFrom<$body> for ActionInput {
            type Error = ApiError;

            fn try_from(b: $body) -> Result<Self, ApiError> {
                let common = Common {
                    version: b.version,
                    candidate_digest: &b.candidate_digest,
                    valid_for_seconds: b.valid_for_seconds,
                    own: (stringify!($own), b.$own),
                    shared: [
                        b.acknowledge_no_completed_effect_replay,
                        b.acknowledge_same_request_attempt_and_budgets,
                        b.acknowledge_finite_ownership_lease,
                    ],
                };
                Self::validated(&b, common)
            }
        }
    };
}

action_input_from!(
    CheckpointContinuationInputV1,
    acknowledge_retained_response_consumed_once
);
action_input_from!(
    FinalOutcomeContinuationInputV1,
    acknowledge_already_consumed_final_output
);

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

pub fn action_view(kind: Kind, row: Action) -> ActionView {
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
