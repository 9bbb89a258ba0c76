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

use crate::custody::Release;
use crate::job::{spawn_failure, Claimed, JobError, JobOutcome, Worker};
use crate::renewal::{self, StopReason};
use crate::scope::{self, Scope, SourceScope};
use crate::step::{self, Interruption, StepCommand, StepOutcome};
use cairn_common::handoff::{self, AdoptionStatus, HandoffState, NewResult};
use cairn_common::journal::{self, Receipt};
use cairn_common::request::{self, RequestState};
use cairn_common::verification::{self as checks, CheckCommand};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// An adoption as the worker runs it.
struct Adoption {
    id: Uuid,
    handoff_id: Uuid,
    commands: Vec<CheckCommand>,
    source_digest: Option<String>,
    declared: HashSet<String>,
}

async fn load(pool: &sqlx::PgPool, adoption_id: Uuid) -> Result<Option<Adoption>, sqlx::Error> {
    let row: Option<(Uuid, Value, Option<String>, Vec<String>)> = sqlx::query_as(
        "SELECT h.id, h.commands, h.source_digest, a.reusable_digests
           FROM verification_adoptions a JOIN verification_handoffs h ON h.id = a.handoff_id
          WHERE a.id = $1",
    )
    .bind(adoption_id)
    .fetch_optional(pool)
    .await?;
    Ok(
        row.and_then(|(handoff_id, commands, source_digest, declared)| {
            Some(Adoption {
                id: adoption_id,
                handoff_id,
                commands: serde_json::from_value(commands).ok()?,
                source_digest,
                declared: declared.into_iter().collect(),
            })
        }),
    )
}

/// A passed, confined, reusable result an earlier verification recorded.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Prior {
    id: Uuid,
    request_id: Option<Uuid>,
    attempt: i32,
    lease_epoch: i64,
    step_key: Option<String>,
    exit_code: Option<i32>,
    output_digest: String,
    stdout_tail: String,
    stderr_tail: String,
    wall_ms: i64,
    scope_digest: String,
    source_digest: String,
    dependency_digest: String,
    environment_digest: String,
    runner_digest: String,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
    /// The completion receipt (journal entry) that accepted the original result.
    accepted_by: Option<i64>,
}

impl Prior {
    fn scope(&self) -> Scope {
        Scope {
            source_digest: self.source_digest.clone(),
            dependency_digest: self.dependency_digest.clone(),
            environment_digest: self.environment_digest.clone(),
            runner_digest: self.runner_digest.clone(),
        }
    }
}

/// What to do with one frozen check.
struct Plan<'a> {
    index: usize,
    check: &'a CheckCommand,
    command_digest: String,
    env: BTreeMap<String, String>,
    scratch: PathBuf,
    scope: Scope,
    /// Declared independent of time and external state, and of a reusable kind.
    reusable: bool,
    prior: Option<Prior>,
    fresh_reason: Option<&'static str>,
}

impl Plan<'_> {
    fn index_i32(&self) -> i32 {
        i32::try_from(self.index).unwrap_or(i32::MAX)
    }
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
}

const PRIOR_SELECT: &str = "SELECT r.id, r.request_id, r.attempt, r.lease_epoch, r.step_key, r.exit_code, r.output_digest,
        r.stdout_tail, r.stderr_tail, r.wall_ms, r.scope_digest, r.source_digest, r.dependency_digest,
        r.environment_digest, r.runner_digest, r.started_at, r.finished_at,
        (SELECT j.id FROM journal_entries j
          WHERE j.request_id = r.request_id AND j.entry_kind = 'verification_completion'
            AND j.body->>'adoption_id' = replace(r.adoption_id::text, '-', '')
          ORDER BY j.id DESC LIMIT 1) AS accepted_by
   FROM verification_results r JOIN verification_adoptions a ON a.id = r.adoption_id
  WHERE r.command_digest = $1 AND r.agent = $2 AND r.repository IS NOT DISTINCT FROM $3
    AND r.passed AND r.confined AND r.reusable AND r.reused_from IS NULL AND a.status = 'completed'";

impl Worker {
    /// Runs an adopted verification on its claimed ticket.
    pub(crate) async fn run_verification(
        &self,
        job: &Claimed,
        stop: &CancellationToken,
        reason: &StopReason,
    ) -> Result<JobOutcome, JobError> {
        let adoption = match job.action_id {
            Some(id) => load(&self.pool, id).await?,
            None => None,
        };
        let Some(adoption) = adoption else {
            let message = "the adopted handoff could not be read".to_string();
            self.finish(job, RequestState::Failed, Some(&message), None)
                .await?;
            return Ok(JobOutcome::Failed(message));
        };
        let subject = job.subject();
        let held = match self.acquire_or_end(job, &subject).await? {
            Ok(held) => held,
            Err(ended) => return Ok(ended),
        };
        // Checks add nothing to capture (a changed source fails the verification); a tree
        // adopted with uncaptured work keeps that state, so a drain keeps it held.
        let ending = self
            .verify(job, &adoption, &held.workspace.root, stop)
            .await;
        let fenced = match &ending {
            Err(JobError::Lease(_)) => true,
            Ok(Ending::Interrupted) => matches!(reason.get(), Some(renewal::Reason::Fenced) | None),
            _ => false,
        };
        let drained = matches!(&ending, Ok(Ending::Interrupted))
            && reason.get() == Some(renewal::Reason::Drain);
        let passed = matches!(&ending, Ok(Ending::Completed { passed: true, .. }));
        let how = if fenced {
            Release::Fenced
        } else if drained {
            Release::HandedOn
        } else {
            Release::Ended { retire: passed }
        };
        self.custody.release(&job.lease, &subject, &held, how).await;
        let _ = tokio::fs::remove_dir_all(scratch_root(&self.settings.workspaces_dir, job)).await;
        match ending? {
            Ending::Completed { passed, summary } => {
                let mut tx = job.lease.begin_fenced(&self.pool).await?;
                self.leases.release_in(&mut tx, &job.lease).await?;
                tx.commit().await?;
                self.leases.clear_liveness(&job.lease).await;
                Ok(if passed {
                    JobOutcome::Completed
                } else {
                    JobOutcome::Failed(summary)
                })
            }
            Ending::Fail(message) => {
                self.finish(job, RequestState::Failed, Some(&message), None)
                    .await?;
                Ok(JobOutcome::Failed(message))
            }
            Ending::Reconcile(step) => {
                self.finish(
                    job,
                    RequestState::NeedsReconciliation,
                    Some("unknown_outcome"),
                    Some(&step),
                )
                .await?;
                Ok(JobOutcome::NeedsReconciliation(format!(
                    "check {step} started and has no receipt: its outcome is unknown"
                )))
            }
            Ending::Interrupted => match reason.get() {
                Some(renewal::Reason::Cancelled) => {
                    self.finish(
                        job,
                        RequestState::Cancelled,
                        Some("cancelled while verifying"),
                        None,
                    )
                    .await?;
                    Ok(JobOutcome::Cancelled)
                }
                Some(renewal::Reason::Drain) => {
                    self.hand_back_verification(job, adoption.id).await?;
                    Ok(JobOutcome::HandedBack)
                }
                // A verification is never paused (pause applies to a run's own request).
                Some(renewal::Reason::Fenced | renewal::Reason::PauseExpired) | None => {
                    self.metrics.self_fenced.inc();
                    Ok(JobOutcome::Fenced)
                }
            },
        }
    }

    async fn verify(
        &self,
        job: &Claimed,
        adoption: &Adoption,
        root: &Path,
        stop: &CancellationToken,
    ) -> Result<Ending, JobError> {
        let before = match scope::measure(root, &self.custody.settings.rules).await {
            Ok(scope) => scope,
            Err(e) => return Ok(Ending::Fail(format!("cannot measure the source: {e}"))),
        };
        if adoption.source_digest.as_deref() != Some(before.source_digest.as_str()) {
            return Ok(Ending::Fail(
                "verification_source_changed: the restored workspace is not the source the handoff froze".into(),
            ));
        }
        let policy = self.settings.confinement;
        if policy.mode == crate::confine::Mode::Required && !policy.confines() {
            return Ok(Ending::Fail(
                "confinement is required and this host cannot create network namespaces".into(),
            ));
        }
        let confined = policy.confines();
        // Results an earlier attempt of this adoption already recorded stand as they are.
        let recorded: Vec<i32> = sqlx::query_scalar(
            "SELECT command_index FROM verification_results WHERE adoption_id = $1",
        )
        .bind(adoption.id)
        .fetch_all(&self.pool)
        .await?;
        // A check that started and has no receipt has an unknown outcome: it runs again
        // only if it is of a kind that may (a source check); otherwise a person decides.
        let mut conn = self.pool.acquire().await?;
        let unknown = journal::unknown_outcomes(
            &mut conn,
            job.lease.request_id,
            &format!("verify:{}:", adoption.id.simple()),
        )
        .await?;
        drop(conn);
        if let Some((step, _)) = unknown.iter().find(|(_, idempotent)| !idempotent) {
            return Ok(Ending::Reconcile(step.clone()));
        }
        let plans = self
            .plan(job, adoption, &before, confined, &recorded)
            .await?;
        let mut used_commands: i32 =
            sqlx::query_scalar("SELECT used_commands FROM execution_requests WHERE id = $1")
                .bind(job.lease.request_id)
                .fetch_one(&self.pool)
                .await?;
        let to_run = plans
            .iter()
            .filter(|p| p.prior.is_none() && !recorded.contains(&p.index_i32()))
            .count();
        let remaining = i64::from(job.max_commands) - i64::from(used_commands);
        if to_run as i64 > remaining {
            // Fail before anything runs, rather than charge some checks and stop midway.
            return Ok(Ending::Fail(format!(
                "budget exhausted: {to_run} checks must run and {} of max_commands ({}) remain",
                remaining.max(0),
                job.max_commands
            )));
        }
        self.journal_reuse_intent(job, adoption, &plans).await?;
        let mut used_wall_ms = job.used_wall_ms;
        for plan in &plans {
            if plan.prior.is_some() || recorded.contains(&plan.index_i32()) {
                // Reused at completion, or already run by an earlier attempt of this adoption.
                continue;
            }
            if stop.is_cancelled() {
                return Ok(Ending::Interrupted);
            }
            if used_commands >= job.max_commands {
                return Ok(Ending::Fail(format!(
                    "budget exhausted: max_commands ({}) spent before check {}",
                    job.max_commands, plan.index
                )));
            }
            let wall_left = job.max_wall_ms - used_wall_ms;
            if wall_left <= 0 {
                return Ok(Ending::Fail(format!(
                    "budget exhausted: max_wall_seconds spent before check {}",
                    plan.index
                )));
            }
            let outcome = self
                .run_check(job, adoption, plan, root, confined, wall_left, stop)
                .await?;
            used_commands += 1;
            match outcome {
                Some(outcome) => used_wall_ms += outcome.wall_ms,
                None => return Ok(Ending::Interrupted),
            }
        }
        self.complete_verification(job, adoption, &before, &plans, root)
            .await
    }

    /// Decides, for each check, whether an earlier result can stand for it.
    async fn plan<'a>(
        &self,
        job: &Claimed,
        adoption: &'a Adoption,
        source: &SourceScope,
        confined: bool,
        recorded: &[i32],
    ) -> Result<Vec<Plan<'a>>, JobError> {
        let runner = scope::runner_digest(
            confined,
            &self.custody.settings.backend,
            self.custody.settings.base_image.as_deref(),
        );
        let mut plans = Vec::with_capacity(adoption.commands.len());
        for (i, check) in adoption.commands.iter().enumerate() {
            let index = i + 1;
            let scratch = scratch_root(&self.settings.workspaces_dir, job).join(index.to_string());
            let env = check_env(check, &scratch);
            let scope = Scope {
                source_digest: source.source_digest.clone(),
                dependency_digest: source.dependency_digest.clone(),
                environment_digest: scope::environment_digest(&env, &scratch),
                runner_digest: runner.clone(),
            };
            let command_digest = checks::command_digest(check);
            let declared = adoption.declared.contains(&command_digest);
            let reusable = declared && check.purpose.reuse_eligible();
            let already = recorded.contains(&i32::try_from(index).unwrap_or(i32::MAX));
            let (prior, fresh_reason) = if already {
                (None, None)
            } else if !declared {
                (None, Some("not_declared"))
            } else if !check.purpose.reuse_eligible() {
                (None, Some("never_reusable"))
            } else if !confined {
                (None, Some("unconfined"))
            } else {
                self.find_prior(job, &command_digest, &scope).await?
            };
            plans.push(Plan {
                index,
                check,
                command_digest,
                env,
                scratch,
                scope,
                reusable,
                prior,
                fresh_reason,
            });
        }
        Ok(plans)
    }

    /// The latest original result that matches every digest now; if none, why not.
    async fn find_prior(
        &self,
        job: &Claimed,
        command_digest: &str,
        scope: &Scope,
    ) -> Result<(Option<Prior>, Option<&'static str>), JobError> {
        let exact: Option<Prior> = sqlx::query_as(&format!(
            "{PRIOR_SELECT} AND r.source_digest = $4 AND r.dependency_digest = $5
               AND r.environment_digest = $6 AND r.runner_digest = $7
             ORDER BY r.finished_at DESC LIMIT 1"
        ))
        .bind(command_digest)
        .bind(&job.agent)
        .bind(&job.repository)
        .bind(&scope.source_digest)
        .bind(&scope.dependency_digest)
        .bind(&scope.environment_digest)
        .bind(&scope.runner_digest)
        .fetch_optional(&self.pool)
        .await?;
        if exact.is_some() {
            return Ok((exact, None));
        }
        let latest: Option<Prior> = sqlx::query_as(&format!(
            "{PRIOR_SELECT} ORDER BY r.finished_at DESC LIMIT 1"
        ))
        .bind(command_digest)
        .bind(&job.agent)
        .bind(&job.repository)
        .fetch_optional(&self.pool)
        .await?;
        let reason = latest
            .and_then(|p| scope.changed_from(&p.scope()))
            .unwrap_or("no_prior_result");
        Ok((None, Some(reason)))
    }

    async fn journal_reuse_intent(
        &self,
        job: &Claimed,
        adoption: &Adoption,
        plans: &[Plan<'_>],
    ) -> Result<(), JobError> {
        let referenced: Vec<Value> = plans
            .iter()
            .filter_map(|p| {
                p.prior.as_ref().map(|prior| {
                    json!({
                        "index": p.index,
                        "command_digest": p.command_digest,
                        "source_result_id": prior.id.simple().to_string(),
                        "source_request_id": prior.request_id.map(|id| id.simple().to_string()),
                        "source_attempt": prior.attempt,
                        "source_completion_receipt": prior.accepted_by,
                    })
                })
            })
            .collect();
        if referenced.is_empty() {
            return Ok(());
        }
        let mut tx = job.lease.begin_fenced(&self.pool).await?;
        journal::entry(
            &mut tx,
            &job.lease,
            "verification_reuse_intent",
            &json!({"adoption_id": adoption.id.simple().to_string(), "checks": referenced}),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Runs one check fresh: witness, intent and charge first, then the confined command,
    /// then its receipt and result. `None` when the job was stopped mid-check.
    #[allow(clippy::too_many_arguments)]
    async fn run_check(
        &self,
        job: &Claimed,
        adoption: &Adoption,
        plan: &Plan<'_>,
        root: &Path,
        confined: bool,
        wall_left_ms: i64,
        stop: &CancellationToken,
    ) -> Result<Option<StepOutcome>, JobError> {
        let step_key = checks::step_key(adoption.id, plan.index);
        let mut tx = job.lease.begin_fenced(&self.pool).await?;
        journal::entry(
            &mut tx,
            &job.lease,
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
            &job.lease,
            job.attempt,
            &step_key,
            plan.index,
            plan.check.purpose.reuse_eligible(),
        )
        .await?;
        tx.commit().await?;

        let command = StepCommand {
            argv: plan.check.argv.clone(),
            env: plan.env.clone(),
            cwd: plan
                .check
                .cwd
                .as_ref()
                .map(|c| root.join(c))
                .unwrap_or_else(|| root.to_path_buf()),
            timeout: Duration::from_secs(u64::from(plan.check.timeout_seconds)).min(
                Duration::from_millis(u64::try_from(wall_left_ms).unwrap_or(0)),
            ),
            output_base: step::output_base(
                &self.settings.artifacts_dir,
                job.lease.request_id,
                &step_key,
                job.lease.epoch,
            ),
            max_output: self.settings.output_max_bytes,
            tail_bytes: self.settings.output_tail_bytes,
            kill_grace: self.settings.kill_grace,
            isolate_network: confined,
        };
        self.metrics.checks_run.inc();
        if !confined {
            self.metrics.checks_unconfined.inc();
        }
        let started_at = Utc::now();
        tracing::info!(check = plan.index, confined, "verification check started");
        let outcome = match tokio::fs::create_dir_all(&plan.scratch).await {
            Err(e) => spawn_failure(&format!("check {}: no scratch directory: {e}", plan.index)),
            Ok(()) => match step::run(&command, stop).await {
                Ok(outcome) => outcome,
                Err(e) => spawn_failure(&format!("check {}: {e}", plan.index)),
            },
        };
        let _ = tokio::fs::remove_dir_all(&plan.scratch).await;
        if outcome.interrupted == Some(Interruption::Stopped) {
            return Ok(None);
        }
        let finished_at = Utc::now();
        tracing::info!(check = plan.index, result = %outcome.describe(), "verification check ended");

        let mut tx = job.lease.begin_fenced(&self.pool).await?;
        let journaled = outcome.journal();
        let receipt = Receipt {
            step_key: &step_key,
            attempt: job.attempt,
            outcome: &journaled,
            tier: None,
        };
        // Checks change nothing to capture: their receipts stand on no snapshot.
        journal::record_receipt(&mut tx, &job.lease, &receipt, None).await?;
        let scope_digest = plan.scope.digest();
        handoff::record_result(
            &mut tx,
            &NewResult {
                adoption_id: adoption.id,
                command_index: plan.index_i32(),
                command_digest: &plan.command_digest,
                purpose: plan.check.purpose.as_str(),
                confined,
                // Only a confined run can ever stand for a later one.
                reusable: plan.reusable && confined,
                scope_digest: &scope_digest,
                exit_code: outcome.exit_code,
                passed: outcome.succeeded(),
                output_digest: &outcome.output_digest,
                reused_from: None,
                started_at,
                finished_at,
                request_id: job.lease.request_id,
                agent: &job.agent,
                repository: job.repository.as_deref(),
                attempt: job.attempt,
                lease_epoch: job.lease.epoch,
                step_key: Some(&step_key),
                source_digest: &plan.scope.source_digest,
                dependency_digest: &plan.scope.dependency_digest,
                environment_digest: &plan.scope.environment_digest,
                runner_digest: &plan.scope.runner_digest,
                timed_out: outcome.interrupted == Some(Interruption::TimedOut),
                wall_ms: outcome.wall_ms,
                stdout_tail: &outcome.stdout_tail,
                stderr_tail: &outcome.stderr_tail,
                fresh_reason: plan.fresh_reason,
            },
        )
        .await?;
        tx.commit().await?;
        Ok(Some(outcome))
    }

    /// The completion transaction: measure the source again inside it; if anything
    /// changed, roll back (no completion, no reuse receipt); otherwise record the reused
    /// results, the completion receipt, the reuse receipt and the verdict at once.
    async fn complete_verification(
        &self,
        job: &Claimed,
        adoption: &Adoption,
        before: &SourceScope,
        plans: &[Plan<'_>],
        root: &Path,
    ) -> Result<Ending, JobError> {
        let mut tx = job.lease.begin_fenced(&self.pool).await?;
        let after = scope::measure(root, &self.custody.settings.rules).await;
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
            drop(tx);
            let message = format!(
                "verification_late_change: {what} changed while the checks ran; nothing was completed and every check already run stays charged"
            );
            tracing::warn!(%message);
            return Ok(Ending::Fail(message));
        }

        let mut reused = Vec::new();
        for plan in plans {
            let Some(prior) = &plan.prior else { continue };
            let inserted = handoff::record_result(
                &mut tx,
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
                    request_id: job.lease.request_id,
                    agent: &job.agent,
                    repository: job.repository.as_deref(),
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
        let completion_id = journal::entry(
            &mut tx,
            &job.lease,
            "verification_completion",
            &json!({
            "adoption_id": adoption.id.simple().to_string(),
            "handoff_id": adoption.handoff_id.simple().to_string(),
            "passed": passed,
            "checks": results.len(),
            "fresh_checks": fresh,
            "reused_checks": reused.len(),
            "source_digest": before.source_digest,
            "dependency_digest": before.dependency_digest,
            "worker": self.settings.worker_id,
            }),
        )
        .await?;
        if !reused.is_empty() {
            journal::entry(
                &mut tx,
                &job.lease,
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
        let summary = if passed {
            format!("{} checks passed ({} reused)", results.len(), reused.len())
        } else {
            format!("verification failed: {}", failed.join("; "))
        };
        handoff::set_handoff_state_of(
            &mut tx,
            adoption.id,
            if passed {
                HandoffState::Passed
            } else {
                HandoffState::Failed
            },
        )
        .await?;
        handoff::set_adoption_status(
            &mut tx,
            adoption.id,
            AdoptionStatus::Completed,
            (!passed).then_some(summary.as_str()),
        )
        .await?;
        let (state, reason) = if passed {
            (RequestState::Completed, None)
        } else {
            (RequestState::Failed, Some(summary.as_str()))
        };
        request::set_state(&mut tx, job.lease.request_id, state, reason, None).await?;
        tx.commit().await?;
        self.metrics.checks_reused.inc_by(reused.len() as u64);
        Ok(Ending::Completed { passed, summary })
    }

    /// Drain: the adoption goes back to its queue on the same attempt.
    async fn hand_back_verification(
        &self,
        job: &Claimed,
        adoption_id: Uuid,
    ) -> Result<(), JobError> {
        let mut tx = job.lease.begin_fenced(&self.pool).await?;
        request::requeue::requeue_verification(
            &mut tx,
            job.run_id,
            job.lease.request_id,
            adoption_id,
            job.attempt,
        )
        .await?;
        tx.commit().await?;
        self.leases.clear_liveness(&job.lease).await;
        Ok(())
    }
}

/// Where a request's checks get their private scratch directories (outside the tree).
fn scratch_root(workspaces_dir: &Path, job: &Claimed) -> PathBuf {
    // Per epoch: a fenced-out owner on the same host never shares or removes it.
    workspaces_dir.join(format!(
        "{}.scratch-{}",
        job.lease.request_id.simple(),
        job.lease.epoch
    ))
}

/// A check's whole environment: the runner's variables, then the check's own.
fn check_env(check: &CheckCommand, scratch: &Path) -> BTreeMap<String, String> {
    let scratch = scratch.to_string_lossy().into_owned();
    let mut env = BTreeMap::from([
        ("HOME".to_string(), scratch.clone()),
        ("TMPDIR".to_string(), scratch),
        ("PATH".to_string(), step::DEFAULT_PATH.to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ]);
    env.extend(check.env.clone());
    env
}
