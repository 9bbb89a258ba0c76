//! Queuing a request again, and ending an attempt that has no result.

use super::action;
use super::fence::fence_out;
use super::state::transition;
use super::stop::stop_at_checkpoint;
use super::table::{ActionEvent, AdoptionEvent, Error, HandoffEvent, RequestEvent};
use crate::handoff;
use crate::outbox;
use crate::run::{JobKind, JobMessage};

use sqlx::PgConnection;
use uuid::Uuid;

/// Queues a plain run's (or a publication's) request again through the outbox: a new
/// attempt when `next_attempt`, else the same one (a drain hand-back, or a claim that
/// never started).
pub async fn requeue(
    conn: &mut PgConnection,
    request_id: Uuid,
    next_attempt: bool,
) -> Result<i32, Error> {
    fence_out(&mut *conn, request_id).await?;
    let (run_id, attempt, kind): (Uuid, i32, String) = sqlx::query_as(
        "UPDATE execution_requests SET attempt = attempt + CASE WHEN $2 THEN 1 ELSE 0 END
          WHERE id = $1
      RETURNING run_id, attempt, kind",
    )
    .bind(request_id)
    .bind(next_attempt)
    .fetch_one(&mut *conn)
    .await?;
    let message = JobMessage {
        tenant: None,
        kind: job_kind_of(&kind),
        run_id,
        request_id,
        action_id: None,
        attempt: Some(attempt),
    };
    readmit(conn, &message, RequestEvent::Requeue).await?;
    Ok(attempt)
}

/// The message a queued request was announced with: its queued verification adoption,
/// its queued continuation action, or a plain run's attempt.
pub fn queued_message(
    run_id: Uuid,
    request_id: Uuid,
    attempt: i32,
    action: Option<(Uuid, action::ActionKind)>,
    verification: Option<Uuid>,
) -> JobMessage {
    let (kind, action_id) = match (verification, action) {
        (Some(adoption), _) => (JobKind::Verification, Some(adoption)),
        (None, Some((id, action::ActionKind::CheckpointContinuation))) => {
            (JobKind::CheckpointContinuation, Some(id))
        }
        (None, Some((id, action::ActionKind::FinalOutcomeContinuation))) => {
            (JobKind::FinalOutcomeContinuation, Some(id))
        }
        (None, None) => (JobKind::Run, None),
    };
    JobMessage {
        tenant: None,
        kind,
        run_id,
        request_id,
        action_id,
        attempt: Some(attempt),
    }
}

/// The job that runs a request of `kind` (its `execution_requests.kind`) by itself.
pub fn job_kind_of(kind: &str) -> JobKind {
    match kind {
        "publication" => JobKind::Publication,
        _ => JobKind::Run,
    }
}

/// Queues the request a message names by `event`, on the attempt it names, and
/// announces it: a reviewed continuation or an adopted verification admits the existing
/// ticket (same attempt, budgets and charged usage), a requeue a new or the same attempt.
pub async fn readmit(
    conn: &mut PgConnection,
    message: &JobMessage,
    event: RequestEvent,
) -> Result<(), Error> {
    transition(&mut *conn, message.request_id, event, None, None).await?;
    // A run with a concurrency or rate key waits for the gate again: it was not
    // counted against its key while it waited for a person or a verification.
    let held: bool = sqlx::query_scalar(
        "UPDATE execution_requests e SET queued_at = now(), release_after = NULL,
                held_by_gate = e.kind = 'run' AND (r.concurrency_key IS NOT NULL OR r.rate_key IS NOT NULL)
           FROM runs r WHERE r.id = e.run_id AND e.id = $1
      RETURNING e.held_by_gate",
    )
    .bind(message.request_id)
    .fetch_one(&mut *conn)
    .await?;
    if !held {
        outbox::announce(conn, message).await?;
    }
    Ok(())
}

/// Queues an adopted verification again (same adoption, the given attempt), fencing out
/// whoever held it: a worker's drain, or the lease sweeper after a lapse.
pub async fn requeue_verification(
    conn: &mut PgConnection,
    run_id: Uuid,
    request_id: Uuid,
    adoption_id: Uuid,
    attempt: i32,
) -> Result<(), Error> {
    fence_out(&mut *conn, request_id).await?;
    sqlx::query("UPDATE execution_requests SET attempt = $2 WHERE id = $1")
        .bind(request_id)
        .bind(attempt)
        .execute(&mut *conn)
        .await?;
    handoff::adoption_transition(&mut *conn, adoption_id, AdoptionEvent::Requeue, None).await?;
    let message = verification_message(run_id, request_id, adoption_id, attempt);
    readmit(conn, &message, RequestEvent::Requeue).await
}

/// A verification whose checks passed, in its holder's completion transaction: the same
/// adoption is queued, on the same attempt, for the fresh worker round that finishes the
/// run on the verified source. Nothing new is admitted: the round belongs to the
/// adoption. The holder releases its tree, then its lease, as any job does.
pub async fn queue_finishing_round(
    conn: &mut PgConnection,
    run_id: Uuid,
    request_id: Uuid,
    adoption_id: Uuid,
    attempt: i32,
) -> Result<(), Error> {
    let event = AdoptionEvent::ChecksPassed;
    handoff::adoption_transition(&mut *conn, adoption_id, event, None).await?;
    let message = verification_message(run_id, request_id, adoption_id, attempt);
    readmit(conn, &message, RequestEvent::QueueFinishingRound).await
}

/// The announcement of an adoption's next job (its checks, or its finishing round).
fn verification_message(
    run_id: Uuid,
    request_id: Uuid,
    adoption_id: Uuid,
    attempt: i32,
) -> JobMessage {
    JobMessage {
        tenant: None,
        kind: JobKind::Verification,
        run_id,
        request_id,
        action_id: Some(adoption_id),
        attempt: Some(attempt),
    }
}

/// Which continuation an attempt belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continuation {
    /// A plain run's automatic attempt.
    None,
    /// A reviewed checkpoint continuation (its action id).
    Checkpoint(Uuid),
    /// A reviewed final-outcome continuation (its action id): it runs nothing.
    FinalOutcome(Uuid),
    /// An adopted verification (its adoption id).
    Verification(Uuid),
}

/// How an attempt that ended without a result was followed up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Queued again as a new attempt.
    Requeued,
    /// Stopped at its last checkpoint: only a reviewed continuation takes it further.
    Stopped,
    /// A verification with its attempts spent: its handoff waits for a new adoption.
    AwaitingAdoption,
}

/// Ends an attempt that has no result, as the lease sweeper ends one whose lease lapsed:
/// another automatic attempt while any remain, else a stop at the last checkpoint with
/// `reason`. A checkpoint continuation's action fails and the request stops at its
/// checkpoint; a verification is queued again or waits for a new adoption.
pub async fn end_attempt(
    conn: &mut PgConnection,
    request_id: Uuid,
    continuation: Continuation,
    reason: &str,
) -> Result<AttemptEnd, Error> {
    let (run_id, attempt, max_attempts): (Uuid, i32, i32) = sqlx::query_as(
        "SELECT run_id, attempt, max_attempts FROM execution_requests WHERE id = $1",
    )
    .bind(request_id)
    .fetch_one(&mut *conn)
    .await?;
    match continuation {
        Continuation::Checkpoint(action_id) => {
            action::transition(&mut *conn, action_id, ActionEvent::Fail).await?;
            stop_at_checkpoint(&mut *conn, request_id, reason).await?;
            Ok(AttemptEnd::Stopped)
        }
        Continuation::FinalOutcome(action_id) => {
            // Its claim accepts or refuses in one transaction; it has no attempt to end
            // but a failed claim, which leaves the report for another review.
            fence_out(&mut *conn, request_id).await?;
            action::transition(&mut *conn, action_id, ActionEvent::Fail).await?;
            let event = RequestEvent::Reconcile;
            transition(&mut *conn, request_id, event, Some(reason), None).await?;
            Ok(AttemptEnd::Stopped)
        }
        Continuation::Verification(adoption_id) if attempt < max_attempts => {
            requeue_verification(&mut *conn, run_id, request_id, adoption_id, attempt + 1).await?;
            Ok(AttemptEnd::Requeued)
        }
        Continuation::Verification(adoption_id) => {
            verification_attempts_exhausted(&mut *conn, request_id, adoption_id).await?;
            Ok(AttemptEnd::AwaitingAdoption)
        }
        Continuation::None if attempt < max_attempts => {
            requeue(&mut *conn, request_id, true).await?;
            Ok(AttemptEnd::Requeued)
        }
        Continuation::None => {
            stop_at_checkpoint(&mut *conn, request_id, reason).await?;
            Ok(AttemptEnd::Stopped)
        }
    }
}

/// A verification whose attempts are spent: the adoption fails, its handoff waits for a
/// new adoption, and the request says why.
pub async fn verification_attempts_exhausted(
    conn: &mut PgConnection,
    request_id: Uuid,
    adoption_id: Uuid,
) -> Result<(), Error> {
    fence_out(&mut *conn, request_id).await?;
    // Checks that passed stand: only the round that finishes on them is spent, and a
    // person decides (the round adds no new attempt).
    if handoff::checks_passed(&mut *conn, adoption_id).await? {
        let reason = "finishing_round_attempts_exhausted";
        let event = AdoptionEvent::Fail;
        handoff::adoption_transition(&mut *conn, adoption_id, event, Some(reason)).await?;
        let event = RequestEvent::Reconcile;
        transition(&mut *conn, request_id, event, Some(reason), None).await?;
        return Ok(());
    }
    let reason = "verification_attempts_exhausted";
    handoff::adoption_transition(&mut *conn, adoption_id, AdoptionEvent::Fail, Some(reason))
        .await?;
    handoff::handoff_transition_of(&mut *conn, adoption_id, HandoffEvent::Reopen).await?;
    let event = RequestEvent::AwaitVerification;
    transition(&mut *conn, request_id, event, Some(reason), None).await?;
    Ok(())
}
