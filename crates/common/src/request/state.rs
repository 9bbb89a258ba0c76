//! Request states, and recording a move between them.

use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use utoipa::ToSchema;
use uuid::Uuid;

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

/// Moves a request (and its run) to `state`. Terminal states record `finished_at`.
pub async fn set_state(
    conn: &mut PgConnection,
    request_id: Uuid,
    state: RequestState,
    stop_reason: Option<&str>,
    reconciliation_step: Option<&str>,
) -> Result<(), sqlx::Error> {
    let terminal = state.is_terminal();
    let run_id: Uuid = sqlx::query_scalar(
        "UPDATE execution_requests
            SET state = $2, stop_reason = $3, reconciliation_step = $4, updated_at = now(),
                finished_at = CASE WHEN $5 THEN now() ELSE finished_at END
          WHERE id = $1
      RETURNING run_id",
    )
    .bind(request_id)
    .bind(state)
    .bind(stop_reason)
    .bind(reconciliation_step)
    .bind(terminal)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE runs SET state = $2, updated_at = now(),
                finished_at = CASE WHEN $3 THEN now() ELSE finished_at END
          WHERE id = $1 AND EXISTS (SELECT 1 FROM execution_requests WHERE id = $4 AND kind = 'run')",
    )
    .bind(run_id)
    .bind(state.run_state())
    .bind(terminal)
    .bind(request_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
