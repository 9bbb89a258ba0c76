//! The strict version-1 bodies of a reviewed continuation action, and their rules: the
//! scheduler enforces them, and `cairnctl` checks a body with the same code before it
//! sends anything.

use crate::digest;
use crate::policy::MAX_WINDOW_SECONDS;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A rule a body breaks: the field to blame and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    pub field: String,
    pub message: String,
}

impl InputError {
    fn new(field: &str, message: &str) -> Self {
        InputError {
            field: field.to_string(),
            message: message.to_string(),
        }
    }
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Strict version-1 body of a checkpoint continuation action.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"version": 1, "candidate_digest": "3f1c0b6a9d2e4f5a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a", "valid_for_seconds": 300, "acknowledge_retained_response_consumed_once": true, "acknowledge_no_completed_effect_replay": true, "acknowledge_same_request_attempt_and_budgets": true, "acknowledge_finite_ownership_lease": true})))]
pub struct CheckpointContinuationInputV1 {
    /// Integer 1.
    #[schema(minimum = 1, maximum = 1)]
    pub version: u32,
    /// The exact current candidate's 64-character digest.
    #[schema(pattern = "^[0-9a-f]{64}$")]
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
#[schema(examples(json!({"version": 1, "candidate_digest": "3f1c0b6a9d2e4f5a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a", "valid_for_seconds": 300, "acknowledge_already_consumed_final_output": true, "acknowledge_no_completed_effect_replay": true, "acknowledge_same_request_attempt_and_budgets": true, "acknowledge_finite_ownership_lease": true})))]
pub struct FinalOutcomeContinuationInputV1 {
    /// Integer 1.
    #[schema(minimum = 1, maximum = 1)]
    pub version: u32,
    /// The exact current candidate's 64-character digest.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub candidate_digest: String,
    /// The claim window, 1 to the candidate's `maximum_window_seconds`.
    #[schema(minimum = 1, maximum = 7200)]
    pub valid_for_seconds: u32,
    /// Boolean `true`.
    pub acknowledge_already_consumed_final_output: bool,
    /// Boolean `true`.
    pub acknowledge_no_completed_effect_replay: bool,
    /// Boolean `true`.
    pub acknowledge_same_request_attempt_and_budgets: bool,
    /// Boolean `true`.
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
    fn validated<T: Serialize>(body: &T, c: Common<'_>) -> Result<Self, InputError> {
        if c.version != 1 {
            return Err(InputError::new("version", "version must be 1"));
        }
        if !digest::is_digest(c.candidate_digest) {
            return Err(InputError::new(
                "candidate_digest",
                "a 64-character lowercase hex digest",
            ));
        }
        if !(1..=MAX_WINDOW_SECONDS as u32).contains(&c.valid_for_seconds) {
            return Err(InputError::new("valid_for_seconds", "from 1 to 7200"));
        }
        let acknowledgements =
            std::iter::once(c.own).chain(SHARED_ACKNOWLEDGEMENTS.into_iter().zip(c.shared));
        if let Some((name, _)) = acknowledgements.into_iter().find(|(_, given)| !given) {
            return Err(InputError::new(name, "this acknowledgement must be true"));
        }
        // A derived Serialize of plain fields cannot fail; were it to, the digest would
        // be of nothing, so it is refused rather than defaulted.
        let raw = serde_json::to_value(body)
            .map_err(|_| InputError::new("body", "the body could not be kept for its digest"))?;
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
            type Error = InputError;

            fn try_from(b: $body) -> Result<Self, InputError> {
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

/// The acknowledgements of a version-1 body: its kind's own (a checkpoint's, or a final
/// outcome's), then those both share.
pub fn acknowledgements(checkpoint: bool) -> [&'static str; 4] {
    let own = if checkpoint {
        "acknowledge_retained_response_consumed_once"
    } else {
        "acknowledge_already_consumed_final_output"
    };
    let [a, b, c] = SHARED_ACKNOWLEDGEMENTS;
    [own, a, b, c]
}

/// Checks a JSON body of a checkpoint's (or a final outcome's) action as the scheduler
/// reads it: exactly its fields, of their JSON types (`1` or `"true"` is no
/// acknowledgement), then its rules.
pub fn check(checkpoint: bool, body: &serde_json::Value) -> Result<ActionInput, String> {
    fn read<T>(body: &serde_json::Value) -> Result<ActionInput, String>
    where
        T: serde::de::DeserializeOwned,
        ActionInput: TryFrom<T, Error = InputError>,
    {
        let typed = serde_json::from_value::<T>(body.clone()).map_err(|e| e.to_string())?;
        ActionInput::try_from(typed).map_err(|e| e.to_string())
    }
    if checkpoint {
        read::<CheckpointContinuationInputV1>(body)
    } else {
        read::<FinalOutcomeContinuationInputV1>(body)
    }
}
