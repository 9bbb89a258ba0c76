//! State changes of an execution request (the ticket), shared by the worker and the
//! scheduler's lease sweeper. Every function runs inside the caller's transaction, on a
//! row the caller has fenced ([`crate::lease::Lease::fence`]) or locked.

use crate::digest;
use crate::outbox;
use crate::queue::JobQueue;
use crate::run::{JobKind, JobMessage, RequestState};
use sqlx::PgConnection;
use uuid::Uuid;

/// Digest of a request's receipts: what a retained checkpoint binds.
pub async fn journal_digest(
    conn: &mut PgConnection,
    request_id: Uuid,
) -> Result<String, sqlx::Error> {
    let receipts: Vec<(String, Option<i32>, String)> = sqlx::query_as(
        "SELECT step_key, exit_code, output_digest FROM journal_receipts WHERE request_id = $1 ORDER BY step_key",
    )
    .bind(request_id)
    .fetch_all(&mut *conn)
    .await?;
    Ok(digest::of(&receipts))
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
    .bind(state.as_str())
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

/// Clears the lease and moves the epoch on, so whoever held it can write nothing more.
pub async fn fence_out(conn: &mut PgConnection, request_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE execution_requests
            SET lease_epoch = lease_epoch + 1, lease_owner = NULL, lease_deadline = NULL, updated_at = now()
          WHERE id = $1",
    )
    .bind(request_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Queues a plain run's request again through the outbox: a new attempt when
/// `next_attempt`, else the same one (a drain hand-back, or a claim that never started).
pub async fn requeue(
    conn: &mut PgConnection,
    request_id: Uuid,
    next_attempt: bool,
) -> Result<i32, sqlx::Error> {
    fence_out(&mut *conn, request_id).await?;
    let (run_id, attempt): (Uuid, i32) = sqlx::query_as(
        "UPDATE execution_requests
            SET attempt = attempt + CASE WHEN $2 THEN 1 ELSE 0 END, queued_at = now()
          WHERE id = $1
      RETURNING run_id, attempt",
    )
    .bind(request_id)
    .bind(next_attempt)
    .fetch_one(&mut *conn)
    .await?;
    set_state(&mut *conn, request_id, RequestState::Queued, None, None).await?;
    let message = JobMessage {
        kind: JobKind::Run,
        run_id,
        request_id,
        action_id: None,
        attempt: Some(attempt),
    };
    outbox::enqueue(
        &mut *conn,
        JobQueue::Runs.routing_key(),
        &serde_json::to_value(message).unwrap_or_default(),
    )
    .await?;
    Ok(attempt)
}

/// Stops a request at its last checkpoint: the journal as it stands is retained
/// (digest, next sequence, source digest), the lease is fenced out, and only a reviewed
/// checkpoint continuation can take it further.
pub async fn stop_at_checkpoint(
    conn: &mut PgConnection,
    request_id: Uuid,
    reason: &str,
) -> Result<(), sqlx::Error> {
    let journal = journal_digest(&mut *conn, request_id).await?;
    fence_out(&mut *conn, request_id).await?;
    sqlx::query(
        "UPDATE execution_requests
            SET checkpoint = jsonb_build_object(
                    'sequence', COALESCE((checkpoint->>'sequence')::bigint, 0) + 1,
                    'journal_digest', $2::text,
                    'source_digest', source_digest,
                    'receipts', (SELECT count(*) FROM journal_receipts WHERE request_id = $1),
                    'stopped_at', now())
          WHERE id = $1",
    )
    .bind(request_id)
    .bind(journal)
    .execute(&mut *conn)
    .await?;
    set_state(
        &mut *conn,
        request_id,
        RequestState::StoppedAtCheckpoint,
        Some(reason),
        None,
    )
    .await
}

/// Sets the status of a continuation action.
pub async fn set_action_status(
    conn: &mut PgConnection,
    action_id: Uuid,
    status: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE continuation_actions SET status = $2, updated_at = now() WHERE id = $1")
        .bind(action_id)
        .bind(status)
        .execute(conn)
        .await?;
    Ok(())
}

/// Sets the status of a verification adoption (and its reason, when one is given).
pub async fn set_adoption_status(
    conn: &mut PgConnection,
    adoption_id: Uuid,
    status: &str,
    reason: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE verification_adoptions SET status = $2, stop_reason = COALESCE($3, stop_reason), updated_at = now() WHERE id = $1",
    )
    .bind(adoption_id)
    .bind(status)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// Sets the state of the handoff an adoption adopted.
pub async fn set_handoff_state_of(
    conn: &mut PgConnection,
    adoption_id: Uuid,
    state: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE verification_handoffs SET state = $2, updated_at = now()
          WHERE id = (SELECT handoff_id FROM verification_adoptions WHERE id = $1)",
    )
    .bind(adoption_id)
    .bind(state)
    .execute(conn)
    .await?;
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
) -> Result<(), sqlx::Error> {
    fence_out(&mut *conn, request_id).await?;
    sqlx::query("UPDATE execution_requests SET attempt = $2, queued_at = now() WHERE id = $1")
        .bind(request_id)
        .bind(attempt)
        .execute(&mut *conn)
        .await?;
    set_state(&mut *conn, request_id, RequestState::Queued, None, None).await?;
    set_adoption_status(&mut *conn, adoption_id, "queued", None).await?;
    let message = JobMessage {
        kind: JobKind::Verification,
        run_id,
        request_id,
        action_id: Some(adoption_id),
        attempt: Some(attempt),
    };
    outbox::enqueue(
        &mut *conn,
        JobQueue::Verifications.routing_key(),
        &serde_json::to_value(message).unwrap_or_default(),
    )
    .await?;
    Ok(())
}

/// Which continuation an attempt belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continuation {
    /// A plain run's automatic attempt.
    None,
    /// A reviewed checkpoint continuation (its action id).
    Checkpoint(Uuid),
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
) -> Result<AttemptEnd, sqlx::Error> {
    let (run_id, attempt, max_attempts): (Uuid, i32, i32) = sqlx::query_as(
        "SELECT run_id, attempt, max_attempts FROM execution_requests WHERE id = $1",
    )
    .bind(request_id)
    .fetch_one(&mut *conn)
    .await?;
    match continuation {
        Continuation::Checkpoint(action_id) => {
            set_action_status(&mut *conn, action_id, "failed").await?;
            stop_at_checkpoint(&mut *conn, request_id, reason).await?;
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
) -> Result<(), sqlx::Error> {
    fence_out(&mut *conn, request_id).await?;
    set_adoption_status(
        &mut *conn,
        adoption_id,
        "failed",
        Some("verification_attempts_exhausted"),
    )
    .await?;
    set_handoff_state_of(&mut *conn, adoption_id, "pending").await?;
    set_state(
        &mut *conn,
        request_id,
        RequestState::AwaitingVerification,
        Some("verification_attempts_exhausted"),
        None,
    )
    .await
}
