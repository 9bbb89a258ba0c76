//! Cancellation: asked of a live worker, or done at once when nobody holds the request.

use super::action;
use super::fence::fence_out;
use super::state::{transition, RequestState};
use super::table::{ActionEvent, AdoptionEvent, Error, RequestEvent};
use crate::handoff;
use sqlx::PgConnection;
use uuid::Uuid;

/// What cancelling a run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancellation {
    /// It was cancelled before.
    AlreadyCancelled,
    /// It had already ended otherwise: nothing changed.
    Finished(RequestState),
    /// A worker holds a live lease: it was asked to stop, and ends the request
    /// `cancelled` as soon as its step stops (the request's signal wakes its keeper at
    /// once; without it, within one renewal).
    Requested,
    /// Nobody held it: it is cancelled now, its epoch moved on.
    Cancelled,
}

/// Cancels a run's request, locking it first. `None` when the run does not exist.
pub async fn cancel_run(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Option<Cancellation>, Error> {
    let request: Option<(Uuid, RequestState, bool)> = sqlx::query_as(
        "SELECT id, state, COALESCE(lease_owner IS NOT NULL AND lease_deadline > clock_timestamp(), FALSE)
           FROM execution_requests WHERE run_id = $1 AND kind = 'run' FOR UPDATE",
    )
    .bind(run_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((request_id, state, live)) = request else {
        return Ok(None);
    };
    let outcome = match state {
        RequestState::Cancelled => Cancellation::AlreadyCancelled,
        s if s.is_terminal() => Cancellation::Finished(s),
        RequestState::Executing if live => {
            mark_requested(&mut *conn, request_id).await?;
            Cancellation::Requested
        }
        _ => {
            // Nobody holds it: cancel now, and move the epoch so a paused former owner
            // can write nothing more.
            mark_requested(&mut *conn, request_id).await?;
            fence_out(&mut *conn, request_id).await?;
            let reason = format!("cancelled while {}", state.as_str());
            cancel_now(&mut *conn, request_id, &reason).await?;
            Cancellation::Cancelled
        }
    };
    Ok(Some(outcome))
}

/// Records that cancellation was asked (on the request and its run).
async fn mark_requested(conn: &mut PgConnection, request_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH e AS (UPDATE execution_requests SET cancel_requested_at = COALESCE(cancel_requested_at, now())
                     WHERE id = $1 RETURNING run_id)
         UPDATE runs SET cancel_requested_at = COALESCE(cancel_requested_at, now()), updated_at = now()
          WHERE id = (SELECT run_id FROM e)",
    )
    .bind(request_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Ends a request `cancelled` with `reason`, and with it whatever continuation was
/// admitting it: an action fails, an adoption is cancelled and its handoff failed. The
/// caller holds the request (fenced, or locked with nobody holding it).
pub async fn cancel_now(
    conn: &mut PgConnection,
    request_id: Uuid,
    reason: &str,
) -> Result<(), Error> {
    transition(
        &mut *conn,
        request_id,
        RequestEvent::Cancel,
        Some(reason),
        None,
    )
    .await?;
    let open_actions: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM continuation_actions WHERE request_id = $1 AND status IN ('queued', 'executing')",
    )
    .bind(request_id)
    .fetch_all(&mut *conn)
    .await?;
    for action_id in open_actions {
        action::transition(&mut *conn, action_id, ActionEvent::Fail).await?;
    }
    let open_adoptions: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM verification_adoptions WHERE execution_request_id = $1 AND status IN ('queued', 'executing')",
    )
    .bind(request_id)
    .fetch_all(&mut *conn)
    .await?;
    for adoption_id in open_adoptions {
        let cancelled = Some("cancelled");
        handoff::adoption_transition(&mut *conn, adoption_id, AdoptionEvent::Cancel, cancelled)
            .await?;
        handoff::fail_unless_passed(&mut *conn, adoption_id).await?;
    }
    Ok(())
}
