//! The states the transition table moves: requests', continuation actions',
//! verification handoffs' and adoptions'. They live apart from their writers (`state`,
//! `action`, the `handoff` module), so the table depends on no writer.

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

crate::text_enum! {
    /// States of an execution request (and of its run, which mirrors it).
    #[derive(Serialize, Deserialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum RequestState {
        /// Admitted and announced; waiting for a worker.
        Queued => "queued",
        /// A worker holds the lease and runs steps.
        Executing => "executing",
        /// The final report asked for verification; the request waits on its handoff.
        AwaitingVerification => "awaiting_verification",
        /// The lease lapsed with attempts spent (or a continuation's window ended): only a
        /// reviewed checkpoint continuation takes it further.
        StoppedAtCheckpoint => "stopped_at_checkpoint",
        /// A step's outcome is unknown, or a retained report awaits acceptance.
        NeedsReconciliation => "needs_reconciliation",
        Completed => "completed",
        Failed => "failed",
        Cancelled => "cancelled",
    }
}

impl RequestState {
    /// No worker will touch the request again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RequestState::Completed | RequestState::Failed | RequestState::Cancelled
        )
    }

    /// The run's state for a request state (`executing` shows as `running`).
    pub fn run_state(self) -> &'static str {
        match self {
            RequestState::Executing => "running",
            other => other.as_str(),
        }
    }
}

crate::text_enum! {
    /// The kind of a reviewed continuation.
    #[derive(Serialize, Deserialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum ActionKind {
        /// Continue a request stopped at its retained checkpoint, on the same ticket.
        CheckpointContinuation => "checkpoint_continuation",
        /// Accept a retained final report without running anything.
        FinalOutcomeContinuation => "final_outcome_continuation",
    }
}

crate::text_enum! {
    /// Where a saved action stands.
    #[derive(Serialize, Deserialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum ActionStatus {
        Queued => "queued",
        Executing => "executing",
        Completed => "completed",
        Failed => "failed",
        NeedsReconciliation => "needs_reconciliation",
        /// Its window ended before a worker claimed it: it admitted nothing, and frees
        /// its checkpoint (or report) for another review.
        Expired => "expired",
    }
}
