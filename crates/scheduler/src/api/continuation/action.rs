//! A continuation action as the API shows it; its strict version-1 bodies and their
//! rules are `cairn_common::action_input`, shared with `cairnctl`.

use super::candidate::Kind;
use crate::api::error::ApiError;
use cairn_common::action_input::InputError;
pub use cairn_common::action_input::{
    ActionInput, CheckpointContinuationInputV1, FinalOutcomeContinuationInputV1,
};
use cairn_common::ids::Id;
use cairn_common::request::action::Action;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

impl From<InputError> for ApiError {
    fn from(e: InputError) -> Self {
        ApiError::unprocessable(e.field, e.message)
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
