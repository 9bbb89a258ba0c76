//! Verification handoffs on the worker.
//!
//! A run whose final report asks for verification opens a handoff with its frozen checks
//! and the digest of the source they verify. Once an operator adopts it, a worker claims
//! the same ticket, restores the same work context's tree and runs every check confined
//! (a network namespace with only loopback, a private scratch `HOME`/`TMPDIR`, a cleared
//! environment, its own process group, a timeout), journaling a scope witness, an intent
//! and a receipt for each. A declared check whose earlier passed, confined result matches
//! the current scope is reused instead of run. The source and dependency digests are
//! measured again inside the completion transaction: a late change rolls back the
//! completion and the reuse receipt, and every command already run stays charged.
//!
//! - [`reuse`]: for each check, whether an earlier result can stand for it.
//! - [`check`]: running one check fresh, confined.
//! - [`scratch`]: a check's scratch directory and environment.
//! - [`complete`]: the completion transaction, and the hand-back on a drain.
//! - [`round`]: once the checks passed, the fresh worker round that finishes the run on
//!   the verified source, and its terminal acceptance.

mod check;
mod complete;
mod reuse;
mod round;
mod scratch;

use crate::custody::Release;
use crate::error::JobError;
use crate::job::ending;
use crate::job::handle::{Job, JobOutcome};
use crate::keeper::Reason;
use crate::scope;
use cairn_common::journal;
use cairn_common::request::limits::{Breach, Moment};
use cairn_common::request::RequestEvent;
use cairn_common::verification::CheckCommand;
use serde_json::Value;
use std::collections::HashSet;
use std::path::Path;
use uuid::Uuid;

/// An adoption as the worker runs it.
pub(super) struct Adoption {
    pub(super) id: Uuid,
    pub(super) handoff_id: Uuid,
    pub(super) commands: Vec<CheckCommand>,
    pub(super) source_digest: Option<String>,
    pub(super) declared: HashSet<String>,
    /// Its checks passed: what is left is the round that finishes the run.
    pub(super) checks_passed: bool,
}

async fn load(pool: &sqlx::PgPool, adoption_id: Uuid) -> Result<Option<Adoption>, sqlx::Error> {
    type Row = (Uuid, Value, Option<String>, Vec<String>, bool);
    let row: Option<Row> = sqlx::query_as(
        "SELECT h.id, h.commands, h.source_digest, a.reusable_digests, h.state = 'passed'
           FROM verification_adoptions a JOIN verification_handoffs h ON h.id = a.handoff_id
          WHERE a.id = $1",
    )
    .bind(adoption_id)
    .fetch_optional(pool)
    .await?;
    Ok(row.and_then(
        |(handoff_id, commands, source_digest, declared, checks_passed)| {
            Some(Adoption {
                id: adoption_id,
                handoff_id,
                commands: serde_json::from_value(commands).ok()?,
                source_digest,
                declared: declared.into_iter().collect(),
                checks_passed,
            })
        },
    ))
}

/// How a verification ended, before the lease is given up.
enum Ending {
    /// The completion committed: every check has a result.
    Completed {
        passed: bool,
        summary: String,
    },
    /// Nothing was completed (and nothing is recorded yet).
    Fail(String),
    /// A check that may not run twice started and has no receipt (its step key).
    Reconcile(String),
    Interrupted,
    /// A limit of the contract was reached before `next` (a check, or the completion).
    Breach {
        breach: Breach,
        next: String,
    },
}

/// Runs an adopted verification on its claimed ticket: its checks, or, once they
/// passed, the round that finishes the run.
pub async fn run(job: &Job) -> Result<JobOutcome, JobError> {
    let adoption = match job.claimed.action_id {
        Some(id) => load(&job.worker.pool, id).await?,
        None => None,
    };
    let Some(adoption) = adoption else {
        let message = "the adopted handoff could not be read".to_string();
        ending::finish(job, RequestEvent::Fail, Some(&message), None).await?;
        return Ok(JobOutcome::Failed(message));
    };
    if adoption.checks_passed {
        return round::finish(job, &adoption).await;
    }
    let subject = job.claimed.subject();
    let tree = match ending::acquire_or_end(job, &subject, &crate::custody::NoOpening).await? {
        Ok(tree) => tree,
        Err(ended) => return Ok(ended),
    };
    // Checks add nothing to capture (a changed source fails the verification); a tree
    // adopted with uncaptured work keeps that state, so a drain keeps it held.
    let ending = verify(job, &adoption, &tree.live.workspace.root).await;
    let how = release_for(job, &ending);
    job.worker
        .custody
        .release(job.lease(), &subject, &tree, how)
        .await;
    let _ = tokio::fs::remove_dir_all(scratch::scratch_root(
        &job.worker.settings.workspaces_dir,
        job,
    ))
    .await;
    match ending? {
        Ending::Completed { passed, summary } => {
            let mut tx = job.begin().await?;
            job.worker.leases.release_in(&mut tx, job.lease()).await?;
            tx.commit().await?;
            job.worker.leases.clear_liveness(job.lease());
            if passed {
                crate::fault::point(crate::fault::AFTER_CHECKS_PASSED);
            }
            Ok(if passed {
                JobOutcome::ChecksPassed
            } else {
                JobOutcome::Failed(summary)
            })
        }
        Ending::Fail(message) => {
            ending::finish(job, RequestEvent::Fail, Some(&message), None).await?;
            Ok(JobOutcome::Failed(message))
        }
        Ending::Breach { breach, next } => {
            ending::breached(job, &breach, Moment::Intent, Some(&next)).await
        }
        Ending::Reconcile(step) => {
            let reason = Some("unknown_outcome");
            ending::finish(job, RequestEvent::Reconcile, reason, Some(&step)).await?;
            Ok(JobOutcome::NeedsReconciliation(format!(
                "check {step} started and has no receipt: its outcome is unknown"
            )))
        }
        Ending::Interrupted => match job.cause() {
            Some(Reason::Cancelled) => {
                let reason = Some("cancelled while verifying");
                ending::finish(job, RequestEvent::Cancel, reason, None).await?;
                Ok(JobOutcome::Cancelled)
            }
            Some(Reason::Drain) => {
                complete::hand_back(job, adoption.id).await?;
                Ok(JobOutcome::HandedBack)
            }
            // A verification is never paused (pause applies to a run's own request), and
            // no continuation window applies to it.
            Some(Reason::Fenced | Reason::PauseExpired | Reason::WindowEnded) | None => {
                job.worker.metrics.self_fenced.inc();
                Ok(JobOutcome::Fenced)
            }
        },
    }
}

/// How the tree is released after the checks ended so.
fn release_for(job: &Job, ending: &Result<Ending, JobError>) -> Release {
    let fenced = match ending {
        Err(JobError::Lease(_)) => true,
        Ok(Ending::Interrupted) => matches!(job.cause(), Some(Reason::Fenced) | None),
        _ => false,
    };
    let drained = matches!(ending, Ok(Ending::Interrupted)) && job.cause() == Some(Reason::Drain);
    if fenced {
        Release::Fenced
    } else if drained {
        Release::HandedOn
    } else {
        // Passed or not, the lineage stays: a passed verification's round finishes on
        // its head, and a failed one's run retires it as it fails.
        Release::Ended { retire: false }
    }
}

/// Runs every check not yet answered, then completes the verification.
async fn verify(job: &Job, adoption: &Adoption, root: &Path) -> Result<Ending, JobError> {
    let before = match scope::measure(root, &job.worker.custody.settings.rules).await {
        Ok(scope) => scope,
        Err(e) => return Ok(Ending::Fail(format!("cannot measure the source: {e}"))),
    };
    if adoption.source_digest.as_deref() != Some(before.source_digest.as_str()) {
        return Ok(Ending::Fail(
            "verification_source_changed: the restored workspace is not the source the handoff froze".into(),
        ));
    }
    // Checks are confined when they run in the namespace sandbox, always without the
    // network; only confined results are ever reusable.
    let confined = job.worker.isolation.isolates();
    // Results an earlier attempt of this adoption already recorded stand as they are.
    let recorded: Vec<i32> =
        sqlx::query_scalar("SELECT command_index FROM verification_results WHERE adoption_id = $1")
            .bind(adoption.id)
            .fetch_all(&job.worker.pool)
            .await?;
    // A check that started and has no receipt has an unknown outcome: it runs again
    // only if it is of a kind that may (a source check); otherwise a person decides.
    let mut conn = job.worker.pool.acquire().await?;
    let unknown = journal::unknown_outcomes(
        &mut conn,
        job.request_id(),
        &format!("verify:{}:", adoption.id.simple()),
    )
    .await?;
    drop(conn);
    if let Some((step, _)) = unknown.iter().find(|(_, idempotent)| !idempotent) {
        return Ok(Ending::Reconcile(step.clone()));
    }
    let plans = reuse::plan(job, adoption, &before, confined, &recorded).await?;
    let used_commands: i32 =
        sqlx::query_scalar("SELECT used_commands FROM execution_requests WHERE id = $1")
            .bind(job.request_id())
            .fetch_one(&job.worker.pool)
            .await?;
    let to_run = plans
        .iter()
        .filter(|p| p.prior.is_none() && !recorded.contains(&p.index_i32()))
        .count();
    let remaining = i64::from(job.claimed.max_commands) - i64::from(used_commands);
    if to_run as i64 > remaining {
        // Fail before anything runs, rather than charge some checks and stop midway.
        return Ok(Ending::Fail(format!(
            "budget exhausted: {to_run} checks must run and {} of max_commands ({}) remain",
            remaining.max(0),
            job.claimed.max_commands
        )));
    }
    reuse::journal_intent(job, adoption, &plans).await?;
    for plan in &plans {
        if plan.prior.is_some() || recorded.contains(&plan.index_i32()) {
            // Reused at completion, or already run by an earlier attempt of this adoption.
            continue;
        }
        job.stop_if_draining();
        if job.stopped() {
            return Ok(Ending::Interrupted);
        }
        match check::run(job, adoption, plan, root, confined).await? {
            check::Checked::Ran => {}
            check::Checked::Changed => {
                return Ok(Ending::Fail(format!(
                    "verification_late_change: check {} changed the source it verifies; its result does not pass, and every check already run stays charged",
                    plan.index
                )))
            }
            check::Checked::Stopped => return Ok(Ending::Interrupted),
            check::Checked::Breach(breach) => {
                let next = format!("check {}", plan.index);
                return Ok(Ending::Breach { breach, next });
            }
        }
    }
    complete::complete(job, adoption, &before, &plans, root).await
}
