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
    let moved = move_by(conn, request_id, event, (reason, step), None).await?;
    finish_move(conn, request_id, event, moved).await
}

/// What [`transition_releasing`] did. `MovedOnly` leaves the lease as it was: the
/// caller must release it itself, or fail ([`crate::lease::Leases::release_in`]).
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The request moved and its lease was released, in one statement.
    Both(RequestState),
    /// The request moved; the lease was not this holder's to release: the caller's
    /// release reports why ([`crate::lease::Leases::release_in`]).
    MovedOnly(RequestState),
}

/// [`transition`] by `event` that also releases the lease `held` (epoch, owner) in the
/// same statement: the move a job ends with, one row version and one statement instead
/// of two. The lease is released only if `held` still holds it, as
/// [`crate::lease::Leases::release_in`] requires.
pub async fn transition_releasing(
    conn: &mut PgConnection,
    request_id: Uuid,
    event: RequestEvent,
    held: (i64, &str),
) -> Result<Released, Error> {
    let moved = move_by(conn, request_id, event, (None, None), Some(held)).await?;
    if moved.1.is_some() {
        let state = finish_move(conn, request_id, event, moved).await?;
        return Ok(Released::Both(state));
    }
    // Refused, or the lease is no longer `held`'s (which its fence makes unreachable):
    // the move alone tells which.
    transition(conn, request_id, event, None, None)
        .await
        .map(Released::MovedOnly)
}

/// The one statement that moves a request, and its run when it is a run's own request
/// (a publication, a request of its own kind, moves alone); with `release`, the lease
/// that epoch and owner hold goes with it, and nothing moves if they do not hold it.
/// The state it moves to, and the run's id when it moved.
async fn move_by(
    conn: &mut PgConnection,
    request_id: Uuid,
    event: RequestEvent,
    (reason, step): (Option<&str>, Option<&str>),
    release: Option<(i64, &str)>,
) -> Result<(RequestState, Option<Uuid>), sqlx::Error> {
    let (sources, state) = guard::<RequestState>(event);
    let moved = sqlx::query_scalar(
        "WITH moved AS (
           UPDATE execution_requests
              SET state = $2, stop_reason = $3, reconciliation_step = $4, updated_at = now(),
                  finished_at = CASE WHEN $5 THEN now() ELSE finished_at END,
                  lease_owner = CASE WHEN $8 THEN NULL ELSE lease_owner END,
                  lease_deadline = CASE WHEN $8 THEN NULL ELSE lease_deadline END
            WHERE id = $1 AND state = ANY($6)
              AND (NOT $8 OR (lease_epoch = $9 AND lease_owner = $10))
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
    .bind(state.is_terminal())
    .bind(&sources)
    .bind(state.run_state())
    .bind(release.is_some())
    .bind(release.map(|(epoch, _)| epoch))
    .bind(release.map(|(_, owner)| owner))
    .fetch_optional(&mut *conn)
    .await?;
    Ok((state, moved))
}

/// After the statement: a refusal is read and reported; a move retires what it ends.
async fn finish_move(
    conn: &mut PgConnection,
    request_id: Uuid,
    event: RequestEvent,
    (state, moved): (RequestState, Option<Uuid>),
) -> Result<RequestState, Error> {
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
