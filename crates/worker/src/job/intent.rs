//! A step's intent and its command's charge, written in the caller's fenced
//! transaction only if the contract still allows another step.

use super::handle::Job;
use cairn_common::journal;
use cairn_common::request::limits::{self, Breach, Moment};
use cairn_common::run::StepSpec;
use sqlx::PgConnection;

/// Reads the limits as they stand and, unless one is reached, writes step `index`'s
/// intent; the wall time the contract leaves, or the limit reached (nothing written).
pub async fn write(
    conn: &mut PgConnection,
    job: &Job,
    step: &StepSpec,
    (index, resume_context): (usize, Option<&serde_json::Value>),
) -> Result<Result<i64, Breach>, sqlx::Error> {
    let claimed = &job.claimed;
    let current = limits::read(&mut *conn, job.request_id(), claimed.continuation).await?;
    if let Some(breach) = current.breach(Moment::Intent) {
        return Ok(Err(breach));
    }
    let settings = &job.worker.custody.settings;
    let store = Some((settings.store_id, settings.store.store().url()));
    let intent = journal::IntentOf {
        attempt: claimed.attempt,
        step_key: &step.key,
        index,
        idempotent: step.idempotent,
        output_store: store,
    };
    journal::write_intent_resuming(conn, job.lease(), &intent, resume_context).await?;
    Ok(Ok(current.wall_left_ms()))
}
