//! One check run fresh: in the step sandbox without the network, with a private scratch
//! home, a cleared environment, journaled like a step.

use super::reuse::Plan;
use super::Adoption;
use crate::error::JobError;
use crate::job::ending::spawn_failure;
use crate::job::handle::Job;
use crate::scope;
use crate::step::{self, Interruption, StepCommand, StepOutcome};
use cairn_common::handoff::{self, NewResult};
use cairn_common::journal::{self, Receipt};
use cairn_common::request::limits::{self, Breach, Moment};
use cairn_common::verification as checks;
use chrono::{DateTime, Utc};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// How one check went.
pub(super) enum Checked {
    Ran,
    /// It ran, and changed the source (or its lock files) it was to verify: its result
    /// does not pass.
    Changed,
    /// The job was stopped mid-check.
    Stopped,
    /// A limit of the contract was reached before it started: nothing was written.
    Breach(Breach),
}

/// Runs one check fresh: witness, intent and charge first (if the contract's limits
/// still allow a command), then the confined command, then its receipt and result.
pub(super) async fn run(
    job: &Job,
    adoption: &Adoption,
    plan: &Plan<'_>,
    root: &Path,
    confined: bool,
) -> Result<Checked, JobError> {
    let step_key = checks::step_key(adoption.id, plan.index);
    let wall_left_ms = match intend(job, adoption, plan, confined, &step_key).await? {
        Ok(wall_left_ms) => wall_left_ms,
        Err(breach) => return Ok(Checked::Breach(breach)),
    };
    let sandbox = &job.worker.isolation;
    let command = command(job, plan, root, wall_left_ms, &step_key);
    job.worker.metrics.checks_run.inc();
    if !confined {
        job.worker.metrics.checks_unconfined.inc();
    }
    let started_at = Utc::now();
    tracing::info!(check = plan.index, confined, "verification check started");
    let custody = &job.worker.custody;
    let made = crate::disk::make(&custody.disk, &plan.scratch, custody.run_disk_mb).await;
    let outcome = match made {
        Err(e) => spawn_failure(&format!("check {}: no scratch directory: {e}", plan.index)),
        Ok(()) => match step::run(&command, sandbox, &job.stop).await {
            Ok(outcome) => outcome,
            Err(e) => spawn_failure(&format!("check {}: {e}", plan.index)),
        },
    };
    let _ = tokio::fs::remove_dir_all(&plan.scratch).await;
    if outcome.interrupted == Some(Interruption::Stopped) {
        return Ok(Checked::Stopped);
    }
    let finished_at = Utc::now();
    tracing::info!(check = plan.index, result = %outcome.describe(), "verification check ended");
    // The witness must be what the check ran on: measured again after it, outside any
    // row lock. A check that changed its source fails the verification, and its result
    // never passes, so no later attempt or run can keep or reuse it.
    let after = scope::measure(root, &job.worker.custody.settings.rules).await;
    let changed = after.map_or(true, |after| {
        after.source_digest != plan.scope.source_digest
            || after.dependency_digest != plan.scope.dependency_digest
    });

    let ran = Ran {
        step_key: &step_key,
        outcome: &outcome,
        confined,
        changed,
        started_at,
        finished_at,
    };
    record(job, adoption, plan, &ran).await?;
    Ok(if changed {
        Checked::Changed
    } else {
        Checked::Ran
    })
}

/// The check's scope entry and intent, in one fenced transaction, if the contract
/// still allows a command; returns the wall time left.
async fn intend(
    job: &Job,
    adoption: &Adoption,
    plan: &Plan<'_>,
    confined: bool,
    step_key: &str,
) -> Result<Result<i64, Breach>, JobError> {
    let mut tx = job.begin().await?;
    let current = limits::read(&mut tx, job.request_id(), job.claimed.continuation).await?;
    if let Some(breach) = current.breach(Moment::Intent) {
        return Ok(Err(breach));
    }
    let wall_left_ms = current.wall_left_ms();
    journal::entry(
        &mut tx,
        job.lease(),
        "verification_build_scope",
        &json!({
            "adoption_id": adoption.id.simple().to_string(),
            "index": plan.index,
            "command_digest": plan.command_digest,
            "purpose": plan.check.purpose,
            "confined": confined,
            "source_digest": plan.scope.source_digest,
            "dependency_digest": plan.scope.dependency_digest,
            "environment_digest": plan.scope.environment_digest,
            "runner_digest": plan.scope.runner_digest,
            "scope_digest": plan.scope.digest(),
        }),
    )
    .await?;
    // Source checks may run again after an unknown outcome; checks of changing
    // services or generated output may not.
    journal::write_intent(
        &mut tx,
        job.lease(),
        job.claimed.attempt,
        step_key,
        plan.index,
        plan.check.purpose.reuse_eligible(),
        None,
    )
    .await?;
    tx.commit().await?;
    Ok(Ok(wall_left_ms))
}

/// The check's command: its frozen argv and environment in the tree, no network, its
/// scratch directory as home, bounded by its timeout and the wall time left.
fn command(
    job: &Job,
    plan: &Plan<'_>,
    root: &Path,
    wall_left_ms: i64,
    step_key: &str,
) -> StepCommand {
    let sandbox = &job.worker.isolation;
    StepCommand {
        argv: plan.check.argv.clone(),
        env: plan.env.clone(),
        place: crate::isolation::Spec {
            workspace: root.to_path_buf(),
            cwd: plan.check.cwd.clone(),
            home: plan.scratch.clone(),
            network: cairn_common::egress::Effective::flag(false),
            limits: sandbox.limits(None),
            identity: None,
            volumes: Vec::new(),
        },
        timeout: Duration::from_secs(u64::from(plan.check.timeout_seconds)).min(
            Duration::from_millis(u64::try_from(wall_left_ms).unwrap_or(0)),
        ),
        output_base: crate::step_output::output_base(
            &job.worker.settings.artifacts_dir,
            job.request_id(),
            step_key,
            job.lease().epoch,
        ),
        live: None,
        max_output: job.worker.settings.output_max_bytes,
        tail_bytes: job.worker.settings.output_tail_bytes,
        redact: job.worker.settings.redact_output,
        kill_grace: job.worker.settings.kill_grace,
        input: None,
    }
}

/// How a check that ran went.
struct Ran<'a> {
    step_key: &'a str,
    outcome: &'a StepOutcome,
    confined: bool,
    /// Its source or dependency inputs changed while it ran.
    changed: bool,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
}

/// The check's receipt (on no snapshot: checks change nothing to capture) and its
/// result, in one fenced transaction.
async fn record(
    job: &Job,
    adoption: &Adoption,
    plan: &Plan<'_>,
    ran: &Ran<'_>,
) -> Result<(), JobError> {
    let (outcome, confined, changed) = (ran.outcome, ran.confined, ran.changed);
    let (started_at, finished_at) = (ran.started_at, ran.finished_at);
    let mut tx = job.begin().await?;
    let journaled = outcome.journal();
    let receipt = Receipt {
        step_key: ran.step_key,
        attempt: job.claimed.attempt,
        outcome: &journaled,
        tier: None,
    };
    // Checks change nothing to capture: their receipts stand on no snapshot.
    journal::record_receipt(&mut tx, job.lease(), &receipt, None).await?;
    let scope_digest = plan.scope.digest();
    handoff::record_result(
        &mut tx,
        &NewResult {
            adoption_id: adoption.id,
            command_index: plan.index_i32(),
            command_digest: &plan.command_digest,
            purpose: plan.check.purpose.as_str(),
            confined,
            // Only a confined run that left its source as it was can ever stand for a
            // later one.
            reusable: plan.reusable && confined && !changed,
            scope_digest: &scope_digest,
            exit_code: outcome.exit_code,
            passed: outcome.succeeded() && !changed,
            output_digest: &outcome.output_digest,
            reused_from: None,
            started_at,
            finished_at,
            request_id: job.request_id(),
            agent: &job.claimed.agent,
            repository: job.claimed.repository.as_deref(),
            attempt: job.claimed.attempt,
            lease_epoch: job.lease().epoch,
            step_key: Some(ran.step_key),
            source_digest: &plan.scope.source_digest,
            dependency_digest: &plan.scope.dependency_digest,
            environment_digest: &plan.scope.environment_digest,
            runner_digest: &plan.scope.runner_digest,
            timed_out: outcome.interrupted == Some(Interruption::TimedOut),
            wall_ms: outcome.wall_ms,
            stdout_tail: &outcome.stdout_tail,
            stderr_tail: &outcome.stderr_tail,
            fresh_reason: plan.fresh_reason,
            sandbox: Some(&outcome.sandbox),
            limit: outcome.limit.map(|l| l.as_str()),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
