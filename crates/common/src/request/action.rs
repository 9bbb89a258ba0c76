//! Reviewed continuation actions: one saved decision per caller-owned id and per
//! retained checkpoint, which admits the existing ticket for a finite window.

pub use super::states::{ActionKind, ActionStatus};
use super::table::{self, ActionEvent, Error};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

/// A saved action.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Action {
    pub id: Uuid,
    pub kind: ActionKind,
    pub run_id: Uuid,
    pub request_id: Uuid,
    pub input_digest: String,
    pub candidate_digest: String,
    pub witness_digest: String,
    pub admission_seal: String,
    pub valid_for_seconds: i32,
    pub window_ends_at: DateTime<Utc>,
    pub status: ActionStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str =
    "id, kind, run_id, request_id, input_digest, candidate_digest, witness_digest,
        admission_seal, valid_for_seconds, window_ends_at, status, created_at, updated_at";

/// What a new action records.
#[derive(Debug, Clone)]
pub struct NewAction<'a> {
    pub id: Uuid,
    pub kind: ActionKind,
    pub run_id: Uuid,
    pub request_id: Uuid,
    /// What it continues from: one action per retained checkpoint (or report).
    pub checkpoint_ref: &'a str,
    pub operator_id: Uuid,
    pub input: &'a serde_json::Value,
    pub input_digest: &'a str,
    pub candidate_digest: &'a str,
    pub witness_digest: &'a str,
    pub admission_seal: &'a str,
    pub valid_for_seconds: i32,
    pub window_ends_at: DateTime<Utc>,
}

/// Saves a new action, `queued`.
pub async fn save(conn: &mut PgConnection, new: &NewAction<'_>) -> Result<Action, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO continuation_actions (id, kind, run_id, request_id, checkpoint_ref, operator_id, input,
                input_digest, candidate_digest, witness_digest, admission_seal, valid_for_seconds,
                window_ends_at, status)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
      RETURNING {COLUMNS}"
    ))
    .bind(new.id)
    .bind(new.kind)
    .bind(new.run_id)
    .bind(new.request_id)
    .bind(new.checkpoint_ref)
    .bind(new.operator_id)
    .bind(new.input)
    .bind(new.input_digest)
    .bind(new.candidate_digest)
    .bind(new.witness_digest)
    .bind(new.admission_seal)
    .bind(new.valid_for_seconds)
    .bind(new.window_ends_at)
    .bind(ActionStatus::Queued)
    .fetch_one(conn)
    .await
}

/// The action with this id.
pub async fn find(conn: &mut PgConnection, id: Uuid) -> Result<Option<Action>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM continuation_actions WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await
}

/// The latest action of this kind on a request.
pub async fn latest(
    conn: &mut PgConnection,
    request_id: Uuid,
    kind: ActionKind,
) -> Result<Option<Action>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM continuation_actions WHERE request_id = $1 AND kind = $2
          ORDER BY created_at DESC LIMIT 1"
    ))
    .bind(request_id)
    .bind(kind)
    .fetch_optional(conn)
    .await
}

/// Whether an action that did not expire was already saved for this retained checkpoint
/// (or report).
pub async fn taken(
    conn: &mut PgConnection,
    request_id: Uuid,
    kind: ActionKind,
    checkpoint_ref: &str,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM continuation_actions
                         WHERE request_id = $1 AND kind = $2 AND checkpoint_ref = $3 AND status <> 'expired')",
    )
    .bind(request_id)
    .bind(kind)
    .bind(checkpoint_ref)
    .fetch_one(conn)
    .await
}

/// Moves an action by `event`, as the transition table allows.
pub async fn transition(
    conn: &mut PgConnection,
    action_id: Uuid,
    event: ActionEvent,
) -> Result<ActionStatus, Error> {
    table::apply::<ActionStatus>(conn, action_id, event).await
}

/// A worker claimed the action: it executes now, under this lease epoch.
pub async fn claim(conn: &mut PgConnection, action_id: Uuid, epoch: i64) -> Result<(), Error> {
    transition(&mut *conn, action_id, ActionEvent::Claim).await?;
    sqlx::query("UPDATE continuation_actions SET claimed_epoch = $2 WHERE id = $1")
        .bind(action_id)
        .bind(epoch)
        .execute(conn)
        .await?;
    Ok(())
}

/// Whether the action's window is still open.
pub async fn window_open(conn: &mut PgConnection, action_id: Uuid) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT window_ends_at > now() FROM continuation_actions WHERE id = $1")
        .bind(action_id)
        .fetch_one(conn)
        .await
}
