//! The states of verification handoffs and adoptions. They live beside the transition
//! table that moves them, so the table depends on no writer (the `handoff` module
//! writes their rows).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

crate::text_enum! {
    /// Where a handoff stands.
    #[derive(Serialize, Deserialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum HandoffState {
        /// Waiting for an adoption.
        Pending => "pending",
        Adopted => "adopted",
        Passed => "passed",
        Failed => "failed",
    }
}

crate::text_enum! {
    /// Where an adoption stands.
    #[derive(Serialize, Deserialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum AdoptionStatus {
        Queued => "queued",
        Executing => "executing",
        Completed => "completed",
        Failed => "failed",
        Cancelled => "cancelled",
    }
}
