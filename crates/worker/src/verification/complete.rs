//! The completion of a verification: one transaction that measures the source again
//! and, if nothing changed, records the reused results, the completion and reuse
//! receipts and the verdict; and the hand-back on a drain.

use super::reuse::Plan;
use super::{Adoption, Ending};
use crate::error::JobError;
use crate::job::handle::Job;
use crate::scope::{self, SourceScope};
use cairn_common::handoff::{self, NewResult};
use cairn_common::journal;
use cairn_common::lineage;
use cairn_common::request::limits::{self, Moment};
use cairn_common::request::{self, AdoptionEvent, HandoffEvent, RequestEvent};
use serde_json::{json, Value};
use sqlx::PgConnection;
use std::path::Path;
use uuid::Uuid;

/// The completion: the source is measured again first (outside any row lock: a walk
/// may be slow), and must be what every check ran on; then one fenced transaction
/// records the reused results, the completion receipt, the reuse receipt and the
/// verdict at once. A result an earlier attempt recorded on another tree fails it too.
pub(super) async fn complete(
    job: &Job,
    adoption: &Adoption,
    before: &SourceScope,
    plans: &[Plan<'_>],
    root: &Path,
) -> Result<Ending, JobError> {
    let after = scope::measure(root, &job.worker.custody.settings.rules).await;
    let late_change = match &after {
        Ok(after) if after.source_digest != before.source_digest => Some("the source"),
        Ok(after) if after.dependency_digest != before.dependency_digest => {
            Some("the dependency inputs")
        }
        Ok(_) => None,
        Err(_) => Some("the source (it can no longer be measured)"),
    };
    // The environment of a check is a function of its frozen command and the runner's
    // fixed variables only (nothing is inherited from the worker), so it is bound by
    // the witness; what can change under a running verification is the tree.
    if let Some(what) = late_change {
        return Ok(late(&format!("{what} changed while the checks ran")));
    }
    let mut tx = job.begin().await?;
    let current = limits::read(&mut tx, job.request_id(), job.claimed.continuation).await?;
    if let Some(breach) = current.breach(Moment::Completion) {
        let next = "the completion".to_string();
        return Ok(Ending::Breach { breach, next });
    }
    if recorded_elsewhere(&mut tx, adoption, before).await? {
        drop(tx);
        return Ok(late(
            "a check's result was recorded on another tree than the one completed",
        ));
    }

    let reused = record_reused(&mut tx, job, adoption, plans).await?;
    let results: Vec<(i32, bool, bool, Option<i32>)> = sqlx::query_as(
        "SELECT command_index, passed, reused_from IS NOT NULL, exit_code FROM verification_results
          WHERE adoption_id = $1 ORDER BY command_index",
    )
    .bind(adoption.id)
    .fetch_all(&mut *tx)
    .await?;
    let failed: Vec<String> = results
        .iter()
        .filter(|(_, passed, _, _)| !passed)
        .map(|(index, _, _, code)| match code {
            Some(code) => format!("check {index} exited with status {code}"),
            None => format!("check {index} did not finish"),
        })
        .collect();
    let passed = failed.is_empty() && results.len() == plans.len();
    let fresh = results.iter().filter(|(_, _, reused, _)| !reused).count();
    journal_completion(
        &mut tx,
        job,
        adoption,
        before,
        (passed, results.len(), fresh),
        &reused,
    )
    .await?;
    let summary = if passed {
        format!("{} checks passed ({} reused)", results.len(), reused.len())
    } else {
        format!("verification failed: {}", failed.join("; "))
    };
    settle(&mut tx, job, adoption, passed, &summary).await?;
    tx.commit().await?;
    job.worker.metrics.checks_reused.inc_by(reused.len() as u64);
    Ok(Ending::Completed { passed, summary })
}

/// Whether a check's result was recorded on another tree than this one (its source or
/// dependency inputs differ from the ones measured before the checks).
async fn recorded_elsewhere(
    conn: &mut PgConnection,
    adoption: &Adoption,
    before: &SourceScope,
) -> Result<bool, sqlx::Error> {
    let elsewhere: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM verification_results
          WHERE adoption_id = $1 AND reused_from IS NULL
            AND (source_digest <> $2 OR dependency_digest <> $3)",
    )
    .bind(adoption.id)
    .bind(&before.source_digest)
    .bind(&before.dependency_digest)
    .fetch_one(conn)
    .await?;
    Ok(elsewhere > 0)
}

/// The verdict: the handoff passes and the adoption waits for its finishing round
/// (the request is queued for it, on the same attempt), or the handoff fails, the
/// adoption completes and the request fails with the summary.
async fn settle(
    conn: &mut PgConnection,
    job: &Job,
    adoption: &Adoption,
    passed: bool,
    summary: &str,
) -> Result<(), JobError> {
    if passed {
        // The run is not finished yet: a fresh worker round finishes it on this source.
        handoff::handoff_transition_of(&mut *conn, adoption.id, HandoffEvent::Pass).await?;
        let (run_id, request_id) = (job.claimed.run_id, job.request_id());
        let attempt = job.claimed.attempt;
        request::queue_finishing_round(&mut *conn, run_id, request_id, adoption.id, attempt)
            .await?;
        return Ok(());
    }
    handoff::handoff_transition_of(&mut *conn, adoption.id, HandoffEvent::Fail).await?;
    let event = AdoptionEvent::Complete;
    handoff::adoption_transition(&mut *conn, adoption.id, event, Some(summary)).await?;
    let event = RequestEvent::Fail;
    request::transition(&mut *conn, job.request_id(), event, Some(summary), None).await?;
    Ok(())
}

/// Records the results of the checks reused from prior verified executions (each
/// once); returns what the reuse receipt says of each.
async fn record_reused(
    conn: &mut PgConnection,
    job: &Job,
    adoption: &Adoption,
    plans: &[Plan<'_>],
) -> Result<Vec<Value>, JobError> {
    let mut reused = Vec::new();
    for plan in plans {
        let Some(prior) = &plan.prior else { continue };
        let inserted = handoff::record_result(
            &mut *conn,
            &NewResult {
                adoption_id: adoption.id,
                command_index: plan.index_i32(),
                command_digest: &plan.command_digest,
                purpose: plan.check.purpose.as_str(),
                confined: true,
                reusable: true,
                scope_digest: &prior.scope_digest,
                exit_code: prior.exit_code,
                passed: true,
                output_digest: &prior.output_digest,
                reused_from: Some(prior.id),
                started_at: prior.started_at,
                finished_at: prior.finished_at,
                request_id: job.request_id(),
                agent: &job.claimed.agent,
                repository: job.claimed.repository.as_deref(),
                attempt: prior.attempt,
                lease_epoch: prior.lease_epoch,
                step_key: prior.step_key.as_deref(),
                source_digest: &prior.source_digest,
                dependency_digest: &prior.dependency_digest,
                environment_digest: &prior.environment_digest,
                runner_digest: &prior.runner_digest,
                timed_out: false,
                wall_ms: prior.wall_ms,
                stdout_tail: &prior.stdout_tail,
                stderr_tail: &prior.stderr_tail,
                fresh_reason: None,
                sandbox: None,
                limit: None,
            },
        )
        .await?;
        if !inserted {
            continue;
        }
        reused.push(json!({
            "index": plan.index,
            "command_digest": plan.command_digest,
            "reused_result_id": prior.id.simple().to_string(),
            "source_request_id": prior.request_id.map(|id| id.simple().to_string()),
            "source_step_key": prior.step_key,
            "source_attempt": prior.attempt,
            "source_completion_receipt": prior.accepted_by,
        }));
    }
    Ok(reused)
}

/// The completion's journal entry and, when checks were reused, its reuse receipt.
async fn journal_completion(
    conn: &mut PgConnection,
    job: &Job,
    adoption: &Adoption,
    before: &SourceScope,
    (passed, checks, fresh): (bool, usize, usize),
    reused: &[Value],
) -> Result<(), JobError> {
    // The tree the checks ran on, as the work context's lineage has it: the finishing
    // round finishes only while it is still the current one.
    let tree_digest = lineage::current_tree(&mut *conn, job.claimed.work_context).await?;
    let completion_id = journal::entry(
        &mut *conn,
        job.lease(),
        "verification_completion",
        &json!({
        "adoption_id": adoption.id.simple().to_string(),
        "handoff_id": adoption.handoff_id.simple().to_string(),
        "passed": passed,
        "checks": checks,
        "fresh_checks": fresh,
        "reused_checks": reused.len(),
        "source_digest": before.source_digest,
        "dependency_digest": before.dependency_digest,
        "tree_digest": tree_digest,
        "worker": job.worker.settings.worker_id,
        }),
    )
    .await?;
    if !reused.is_empty() {
        journal::entry(
            &mut *conn,
            job.lease(),
            "verification_reuse_receipt",
            &json!({
                "adoption_id": adoption.id.simple().to_string(),
                "completion_receipt": completion_id,
                // Applies to the referenced checks only; the others ran again.
                "new_execution_count": 0,
                "checks": reused,
            }),
        )
        .await?;
    }
    Ok(())
}

/// Drain: the adoption goes back to its queue on the same attempt.
pub(super) async fn hand_back(job: &Job, adoption_id: Uuid) -> Result<(), JobError> {
    let mut tx = job.begin().await?;
    request::requeue::requeue_verification(
        &mut tx,
        job.claimed.run_id,
        job.request_id(),
        adoption_id,
        job.claimed.attempt,
    )
    .await?;
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease());
    Ok(())
}

/// A verification whose source moved: nothing is completed.
fn late(what: &str) -> Ending {
    let message = format!(
        "verification_late_change: {what}; nothing was completed and every check already run stays charged"
    );
    tracing::warn!(%message);
    Ending::Fail(message)
}
