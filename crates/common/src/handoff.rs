//! Verification handoffs: the frozen checks a final report asks for, the adoptions that
//! admit them, and every check's result. The one writer of `verification_handoffs`,
//! `verification_adoptions` and `verification_results`.

pub use crate::request::states::{AdoptionStatus, HandoffState};
use crate::request::table::{self, AdoptionEvent, Error, HandoffEvent};
use crate::verification::{self as checks, VerificationRequest};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

/// Opens the handoff of an accepted report that asks for verification: the frozen
/// checks and the source they verify. A report without valid checks opens none (the
/// request still waits, and its candidate says there is nothing to adopt).
pub async fn open(
    conn: &mut PgConnection,
    request_id: Uuid,
    report: &serde_json::Value,
    source_digest: Option<&str>,
) -> Result<(), sqlx::Error> {
    let request = report
        .get("verification")
        .cloned()
        .map(serde_json::from_value::<VerificationRequest>);
    let commands = match request {
        Some(Ok(request)) if request.validate("verification.").is_ok() => request.commands,
        _ => {
            tracing::warn!(request_id = %request_id.simple(), "the report asks for verification without valid checks; no handoff opened");
            return Ok(());
        }
    };
    let frozen = serde_json::to_value(&commands).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    sqlx::query(
        "INSERT INTO verification_handoffs (id, run_id, request_id, commands, commands_digest, state, agent, source_digest)
         SELECT $1, e.run_id, e.id, $3, $4, $5, r.agent, $6
           FROM execution_requests e JOIN runs r ON r.id = e.run_id WHERE e.id = $2
         ON CONFLICT DO NOTHING",
    )
    .bind(Uuid::new_v4())
    .bind(request_id)
    .bind(frozen)
    .bind(checks::commands_digest(&commands))
    .bind(HandoffState::Pending)
    .bind(source_digest)
    .execute(conn)
    .await?;
    Ok(())
}

/// What an adoption records.
#[derive(Debug, Clone)]
pub struct NewAdoption<'a> {
    pub id: Uuid,
    pub run_id: Uuid,
    pub handoff_id: Uuid,
    pub request_id: Uuid,
    pub operator_id: Uuid,
    pub input: &'a serde_json::Value,
    pub input_digest: &'a str,
    pub agent: &'a str,
    pub policy_digest: &'a str,
    /// The candidate it adopted, as read.
    pub candidate: &'a serde_json::Value,
    /// Command digests the operator declared reusable.
    pub reusable_digests: &'a [String],
}

/// Saves an adoption (`queued`) and marks its handoff adopted.
pub async fn adopt(conn: &mut PgConnection, new: &NewAdoption<'_>) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO verification_adoptions (id, run_id, handoff_id, execution_request_id, operator_id, input,
                input_digest, agent, policy_digest, candidate, reusable_digests, status)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(new.id)
    .bind(new.run_id)
    .bind(new.handoff_id)
    .bind(new.request_id)
    .bind(new.operator_id)
    .bind(new.input)
    .bind(new.input_digest)
    .bind(new.agent)
    .bind(new.policy_digest)
    .bind(new.candidate)
    .bind(new.reusable_digests)
    .bind(AdoptionStatus::Queued)
    .execute(&mut *conn)
    .await?;
    table::apply::<HandoffState>(conn, new.handoff_id, HandoffEvent::Adopt).await?;
    Ok(())
}

/// The adoption a worker claimed: it executes now, under this epoch.
pub async fn claim_adoption(
    conn: &mut PgConnection,
    adoption_id: Uuid,
    epoch: i64,
) -> Result<(), Error> {
    table::apply::<AdoptionStatus>(&mut *conn, adoption_id, AdoptionEvent::Claim).await?;
    sqlx::query("UPDATE verification_adoptions SET claimed_epoch = $2 WHERE id = $1")
        .bind(adoption_id)
        .bind(epoch)
        .execute(conn)
        .await?;
    Ok(())
}

/// Moves an adoption by `event`, as the transition table allows, with its reason when
/// one is given.
pub async fn adoption_transition(
    conn: &mut PgConnection,
    adoption_id: Uuid,
    event: AdoptionEvent,
    reason: Option<&str>,
) -> Result<AdoptionStatus, Error> {
    let status = table::apply::<AdoptionStatus>(&mut *conn, adoption_id, event).await?;
    if reason.is_some() {
        sqlx::query("UPDATE verification_adoptions SET stop_reason = $2 WHERE id = $1")
            .bind(adoption_id)
            .bind(reason)
            .execute(conn)
            .await?;
    }
    Ok(status)
}

/// Moves the handoff an adoption adopted by `event`, as the transition table allows.
pub async fn handoff_transition_of(
    conn: &mut PgConnection,
    adoption_id: Uuid,
    event: HandoffEvent,
) -> Result<HandoffState, Error> {
    let handoff_id: Uuid =
        sqlx::query_scalar("SELECT handoff_id FROM verification_adoptions WHERE id = $1")
            .bind(adoption_id)
            .fetch_one(&mut *conn)
            .await?;
    table::apply::<HandoffState>(conn, handoff_id, event).await
}

/// Whether the checks of the handoff an adoption adopted passed: the adoption then
/// stands for its finishing round.
pub async fn checks_passed(conn: &mut PgConnection, adoption_id: Uuid) -> Result<bool, Error> {
    let state: HandoffState = sqlx::query_scalar(
        "SELECT h.state FROM verification_adoptions a JOIN verification_handoffs h ON h.id = a.handoff_id
          WHERE a.id = $1",
    )
    .bind(adoption_id)
    .fetch_one(conn)
    .await?;
    Ok(state == HandoffState::Passed)
}

/// Fails the handoff an adoption adopted, when its adoption ends without a verdict; a
/// handoff whose checks passed keeps that verdict (its finishing round ended instead).
pub async fn fail_unless_passed(conn: &mut PgConnection, adoption_id: Uuid) -> Result<(), Error> {
    if !checks_passed(&mut *conn, adoption_id).await? {
        handoff_transition_of(conn, adoption_id, HandoffEvent::Fail).await?;
    }
    Ok(())
}

/// One check's result: run fresh, or (with `reused_from`) standing on an earlier one.
#[derive(Debug, Clone)]
pub struct NewResult<'a> {
    pub adoption_id: Uuid,
    pub command_index: i32,
    pub command_digest: &'a str,
    pub purpose: &'a str,
    pub confined: bool,
    /// Whether it may ever stand for a later check.
    pub reusable: bool,
    pub scope_digest: &'a str,
    pub exit_code: Option<i32>,
    pub passed: bool,
    pub output_digest: &'a str,
    /// The original result this one reuses.
    pub reused_from: Option<Uuid>,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub request_id: Uuid,
    pub agent: &'a str,
    pub repository: Option<&'a str>,
    pub attempt: i32,
    pub lease_epoch: i64,
    pub step_key: Option<&'a str>,
    pub source_digest: &'a str,
    pub dependency_digest: &'a str,
    pub environment_digest: &'a str,
    pub runner_digest: &'a str,
    pub timed_out: bool,
    pub wall_ms: i64,
    pub stdout_tail: &'a str,
    pub stderr_tail: &'a str,
    /// Why it ran fresh instead of being reused (`not_declared`, `source_changed`, …).
    pub fresh_reason: Option<&'a str>,
    /// The sandbox the check ran in (none for a reused result).
    pub sandbox: Option<&'a serde_json::Value>,
    /// The sandbox limit that ended the check, if one did.
    pub limit: Option<&'a str>,
}

/// Records a check's result, once per adoption and check: whether it was recorded now.
pub async fn record_result(
    conn: &mut PgConnection,
    r: &NewResult<'_>,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO verification_results (id, adoption_id, command_index, command_digest, purpose, confined, reusable,
                scope_digest, exit_code, passed, output_digest, reused_from, started_at, finished_at, request_id,
                agent, repository, attempt, lease_epoch, step_key, source_digest, dependency_digest,
                environment_digest, runner_digest, timed_out, wall_ms, stdout_tail, stderr_tail, fresh_reason,
                sandbox, limit_breached)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21,
                 $22, $23, $24, $25, $26, $27, $28, $29, $30, $31)
         ON CONFLICT (adoption_id, command_index) DO NOTHING",
    )
    .bind(Uuid::new_v4())
    .bind(r.adoption_id)
    .bind(r.command_index)
    .bind(r.command_digest)
    .bind(r.purpose)
    .bind(r.confined)
    .bind(r.reusable)
    .bind(r.scope_digest)
    .bind(r.exit_code)
    .bind(r.passed)
    .bind(r.output_digest)
    .bind(r.reused_from)
    .bind(r.started_at)
    .bind(r.finished_at)
    .bind(r.request_id)
    .bind(r.agent)
    .bind(r.repository)
    .bind(r.attempt)
    .bind(r.lease_epoch)
    .bind(r.step_key)
    .bind(r.source_digest)
    .bind(r.dependency_digest)
    .bind(r.environment_digest)
    .bind(r.runner_digest)
    .bind(r.timed_out)
    .bind(r.wall_ms)
    .bind(r.stdout_tail)
    .bind(r.stderr_tail)
    .bind(r.fresh_reason)
    .bind(r.sandbox)
    .bind(r.limit)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
