//! Request states, and recording a move between them through the transition table.

pub use super::states::RequestState;
use super::table::{guard, refusal, Error, RequestEvent};
use sqlx::PgConnection;
use uuid::Uuid;

/// A request's state and stop reason, as committed (`None` when it does not exist).
pub async fn state_of(
    conn: &mut PgConnection,
    request_id: Uuid,
) -> Result<Option<(RequestState, Option<String>)>, sqlx::Error> {
    sqlx::query_as("SELECT state, stop_reason FROM execution_requests WHERE id = $1")
        .bind(request_id)
        .fetch_optional(conn)
        .await
}

/// Moves a request (and its run) by `event`, as the transition table allows from its
/// current state; anything else is [`Refused`](super::table::Refused) and changes
/// nothing. Records `reason` and `step` (cleared when `None`); a terminal state records
/// `finished_at`; a failed or cancelled run's lineage retires with it.
pub async fn transition(
    conn: &mut PgConnection,
    request_id: Uuid,
    event: RequestEvent,
    reason: Option<&str>,
    step: Option<&str>,
) -> Result<RequestState, Error> {
    let (sources, state) = guard::<RequestState>(event);
    let terminal = state.is_terminal();
    // One statement moves both: a run's own request moves its run too (a publication,
    // a request of its own kind, does not).
    let moved: Option<Uuid> = sqlx::query_scalar(
        "WITH moved AS (
           UPDATE execution_requests
              SET state = $2, stop_reason = $3, reconciliation_step = $4, updated_at = now(),
                  finished_at = CASE WHEN $5 THEN now() ELSE finished_at END
            WHERE id = $1 AND state = ANY($6)
        RETURNING run_id, kind),
              run AS (
           UPDATE runs SET state = $7, updated_at = now(),
                  finished_at = CASE WHEN $5 THEN now() ELSE finished_at END
            WHERE id = (SELECT run_id FROM moved WHERE kind = 'run'))
         SELECT run_id FROM moved",
    )
    .bind(request_id)
    .bind(state)
    .bind(reason)
    .bind(step)
    .bind(terminal)
    .bind(&sources)
    .bind(state.run_state())
    .fetch_optional(&mut *conn)
    .await?;
    if moved.is_none() {
        return Err(refusal::<RequestState>(conn, request_id, event).await);
    }
    retire_ended_task(conn, request_id, state).await?;
    Ok(state)
}

/// A run that failed or was cancelled ended its task: no continuation can take it
/// further, so its lineage retires with the move, in its transaction (a completed one
/// retires when its tree is released, unless its report asks for more).
async fn retire_ended_task(
    conn: &mut PgConnection,
    request_id: Uuid,
    state: RequestState,
) -> Result<(), sqlx::Error> {
    let reason = match state {
        RequestState::Failed => "task_failed",
        RequestState::Cancelled => "task_cancelled",
        _ => return Ok(()),
    };
    let context: Option<Uuid> = sqlx::query_scalar(
        "SELECT r.work_context_id FROM runs r JOIN execution_requests e ON e.run_id = r.id
          WHERE e.id = $1 AND e.kind = 'run'",
    )
    .bind(request_id)
    .fetch_optional(&mut *conn)
    .await?;
    match context {
        Some(context) => crate::lineage::retire(conn, context, reason).await,
        None => Ok(()),
    }
}
