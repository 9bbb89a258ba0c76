//! One job: claim the request under a fenced lease, then run its plan, journaling an
//! intent before and a receipt after every step. Completed steps are reused, never
//! replayed; a step with an intent and no receipt runs again only if idempotent.

use crate::custody::{Commit, Custody, CustodyError, Held, Release, Subject};
use crate::metrics::WorkerMetrics;
use crate::pause::{self, Pausing};
use crate::renewal::{self, StopReason};
use crate::report::RetainedReport;
use crate::step::{self, Interruption, StepCommand, StepOutcome};
use crate::workspace::Workspace;
use cairn_common::handoff::{self, AdoptionStatus, HandoffState};
use cairn_common::journal::{self, Receipt, Standing};
use cairn_common::lease::{Lease, LeaseError, Leases};
use cairn_common::report::{self, Acceptance};
use cairn_common::request::action::{self, ActionStatus};
use cairn_common::request::{self, RequestState};
use cairn_common::run::{JobKind, JobMessage, StepSpec};
use serde_json::json;
use sqlx::PgPool;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Settings every job of this worker shares.
#[derive(Debug, Clone)]
pub struct JobSettings {
    pub worker_id: String,
    pub workspaces_dir: PathBuf,
    pub artifacts_dir: PathBuf,
    pub output_max_bytes: u64,
    pub output_tail_bytes: usize,
    pub kill_grace: Duration,
    pub confinement: crate::confine::Policy,
    /// How long a pause may last before it behaves like a stop.
    pub pause_limit: Duration,
}

/// How a delivery ended, for logs, metrics and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// Acked without work: a duplicate, a stale message, or a request another holds.
    Dropped(String),
    Completed,
    /// A retained report was accepted (final-outcome continuation); nothing ran.
    Accepted,
    AwaitingVerification,
    Failed(String),
    NeedsReconciliation(String),
    Cancelled,
    /// Drain: the request went back to the queue for another worker.
    HandedBack,
    /// The lease was lost: nothing more was written.
    Fenced,
    /// Paused past the limit: stopped at its checkpoint.
    StoppedAtCheckpoint,
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// A custody failure the job had no outcome for.
    #[error(transparent)]
    Custody(Box<CustodyError>),
}

impl From<CustodyError> for JobError {
    fn from(e: CustodyError) -> Self {
        match e {
            CustodyError::Lease(e) => JobError::Lease(e),
            CustodyError::Db(e) => JobError::Db(e),
            other => JobError::Custody(Box::new(other)),
        }
    }
}

/// How a plan ended, before the ticket records it.
enum Ending {
    Complete,
    Fail(String),
    /// A person decides: `reason` is `unknown_outcome` or `tree_behind_journal`.
    Reconcile {
        message: String,
        step: String,
        reason: &'static str,
    },
    /// The attempt ends with nothing recorded for its step (its effects could not be
    /// captured): another attempt, or a stop at the last checkpoint.
    EndAttempt(CustodyError),
    Interrupted,
}

/// A claimed request, ready to run.
pub struct Claimed {
    pub(crate) lease: Lease,
    pub(crate) kind: JobKind,
    pub(crate) action_id: Option<Uuid>,
    pub(crate) run_id: Uuid,
    pub(crate) attempt: i32,
    pub(crate) steps: Vec<StepSpec>,
    pub(crate) repository: Option<String>,
    pub(crate) git_ref: Option<String>,
    pub(crate) max_commands: i32,
    pub(crate) max_wall_ms: i64,
    pub(crate) used_commands: i32,
    pub(crate) used_wall_ms: i64,
    pub(crate) agent: String,
    pub(crate) work_context: Uuid,
    pub(crate) deadline: Option<chrono::DateTime<chrono::Utc>>,
}

impl Claimed {
    pub(crate) fn subject(&self) -> Subject {
        Subject {
            request_id: self.lease.request_id,
            run_id: self.run_id,
            work_context: self.work_context,
            agent: self.agent.clone(),
            repository: self.repository.clone(),
            git_ref: self.git_ref.clone(),
            deadline: self.deadline,
        }
    }
}

#[derive(sqlx::FromRow)]
struct RequestRow {
    state: RequestState,
    kind: String,
    run_id: Uuid,
    attempt: i32,
    steps: serde_json::Value,
    repository: Option<String>,
    git_ref: Option<String>,
    max_commands: i32,
    max_wall_seconds: i32,
    used_commands: i32,
    used_wall_ms: i64,
    cancel_requested: bool,
    deadline_passed: bool,
    queued_for_seconds: f64,
    agent: String,
    task_id: Uuid,
    deadline: Option<chrono::DateTime<chrono::Utc>>,
}

pub struct Worker {
    pub pool: PgPool,
    pub leases: Leases,
    pub settings: JobSettings,
    pub custody: Custody,
    pub metrics: WorkerMetrics,
    /// Requests this process runs jobs for; the janitor never touches their trees.
    pub active: Arc<crate::janitor::ActiveRequests>,
}

/// The result of a claim attempt.
pub enum Claim {
    Run(Box<Claimed>),
    Done(JobOutcome),
}

impl Worker {
    /// Claims the request a message announces and decides whether there is work. Only
    /// after this returns may the delivery be acked.
    #[tracing::instrument(skip_all, fields(request_id = %message.request_id, kind = ?message.kind))]
    pub async fn claim(&self, message: &JobMessage) -> Result<Claim, JobError> {
        let lease = match self
            .leases
            .claim(message.request_id, &self.settings.worker_id)
            .await
        {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                return Ok(Claim::Done(JobOutcome::Dropped(
                    "another worker holds the request".into(),
                )))
            }
            Err(LeaseError::NotFound(_)) => {
                return Ok(Claim::Done(JobOutcome::Dropped("unknown request".into())))
            }
            Err(e) => return Err(e.into()),
        };
        let mut tx = lease.begin_fenced(&self.pool).await?;
        let row: RequestRow = sqlx::query_as(
            "SELECT e.state, e.kind, e.run_id, e.attempt, r.steps, r.repository, r.git_ref, e.max_commands,
                    e.max_wall_seconds, e.used_commands, e.used_wall_ms,
                    e.cancel_requested_at IS NOT NULL AS cancel_requested,
                    COALESCE(r.deadline <= now(), FALSE) AS deadline_passed,
                    EXTRACT(EPOCH FROM clock_timestamp() - e.queued_at)::float8 AS queued_for_seconds,
                    r.agent, r.task_id, r.deadline
               FROM execution_requests e JOIN runs r ON r.id = e.run_id WHERE e.id = $1",
        )
        .bind(lease.request_id)
        .fetch_one(&mut *tx)
        .await?;
        let queued = row.state == RequestState::Queued && row.kind == "run";
        // A reviewed continuation or an adopted verification that owns the ticket now.
        let pending_action: Option<(Uuid, String)> = sqlx::query_as(
            "(SELECT id, kind, created_at FROM continuation_actions
               WHERE request_id = $1 AND status = 'queued' AND window_ends_at > now())
             UNION ALL
             (SELECT id, 'verification', created_at FROM verification_adoptions
               WHERE execution_request_id = $1 AND status = 'queued')
             ORDER BY created_at DESC LIMIT 1",
        )
        .bind(lease.request_id)
        .fetch_optional(&mut *tx)
        .await?;

        let work = match message.kind {
            // A plain run message is stale once a reviewed continuation owns the ticket.
            JobKind::Run if queued && pending_action.is_none() => true,
            JobKind::CheckpointContinuation
            | JobKind::FinalOutcomeContinuation
            | JobKind::Verification => {
                let expected = match message.kind {
                    JobKind::CheckpointContinuation => "checkpoint_continuation",
                    JobKind::FinalOutcomeContinuation => "final_outcome_continuation",
                    _ => "verification",
                };
                queued
                    && pending_action.as_ref().is_some_and(|(id, kind)| {
                        Some(*id) == message.action_id && kind == expected
                    })
            }
            JobKind::Run => false,
        };
        if !work {
            self.leases.release_in(&mut tx, &lease).await?;
            tx.commit().await?;
            self.leases.clear_liveness(&lease).await;
            return Ok(Claim::Done(JobOutcome::Dropped(format!(
                "nothing to do: request is {}",
                row.state
            ))));
        }
        self.metrics.jobs_claimed.inc();
        self.metrics
            .claim_latency_seconds
            .observe(row.queued_for_seconds.max(0.0));
        if row.cancel_requested {
            request::cancel::cancel_now(&mut tx, lease.request_id, "cancelled before it started")
                .await?;
        } else if row.deadline_passed {
            let reason = "the run's deadline passed before it started";
            request::set_state(
                &mut tx,
                lease.request_id,
                RequestState::Failed,
                Some(reason),
                None,
            )
            .await?;
            match pending_action {
                Some((adoption_id, kind)) if kind == "verification" => {
                    handoff::set_adoption_status(
                        &mut tx,
                        adoption_id,
                        AdoptionStatus::Failed,
                        Some(reason),
                    )
                    .await?;
                    handoff::set_handoff_state_of(&mut tx, adoption_id, HandoffState::Failed)
                        .await?;
                }
                Some((action_id, _)) => {
                    action::set_status(&mut tx, action_id, ActionStatus::Failed).await?;
                }
                None => {}
            }
        }
        if row.cancel_requested || row.deadline_passed {
            self.leases.release_in(&mut tx, &lease).await?;
            tx.commit().await?;
            self.leases.clear_liveness(&lease).await;
            self.metrics.jobs_failed.inc();
            return Ok(Claim::Done(if row.cancel_requested {
                JobOutcome::Cancelled
            } else {
                JobOutcome::Failed("the run's deadline passed before it started".into())
            }));
        }
        if message.kind == JobKind::FinalOutcomeContinuation {
            let acceptance =
                report::accept(&mut tx, &lease, message.action_id, &self.settings.worker_id)
                    .await?;
            self.leases.release_in(&mut tx, &lease).await?;
            tx.commit().await?;
            self.leases.clear_liveness(&lease).await;
            let outcome = match acceptance {
                Acceptance::Accepted { .. } => {
                    self.metrics.jobs_completed.inc();
                    JobOutcome::Accepted
                }
                Acceptance::Missing => {
                    self.metrics.jobs_failed.inc();
                    JobOutcome::NeedsReconciliation("no retained report to accept".into())
                }
            };
            return Ok(Claim::Done(outcome));
        }
        request::set_state(
            &mut tx,
            lease.request_id,
            RequestState::Executing,
            None,
            None,
        )
        .await?;
        match (message.kind, message.action_id) {
            (JobKind::Verification, Some(adoption_id)) => {
                handoff::claim_adoption(&mut tx, adoption_id, lease.epoch).await?;
            }
            (_, Some(action_id)) => {
                action::claim(&mut tx, action_id, lease.epoch).await?;
            }
            (_, None) => {}
        }
        tx.commit().await?;
        self.active.enter(lease.request_id).await;
        let steps: Vec<StepSpec> = serde_json::from_value(row.steps).unwrap_or_default();
        Ok(Claim::Run(Box::new(Claimed {
            lease,
            kind: message.kind,
            action_id: message.action_id,
            run_id: row.run_id,
            attempt: row.attempt,
            steps,
            repository: row.repository,
            git_ref: row.git_ref,
            max_commands: row.max_commands,
            max_wall_ms: i64::from(row.max_wall_seconds) * 1000,
            used_commands: row.used_commands,
            used_wall_ms: row.used_wall_ms,
            agent: row.agent,
            work_context: row.task_id,
            deadline: row.deadline,
        })))
    }

    /// Runs a claimed request's plan until it ends, is handed back on `drain`, or the
    /// lease is lost.
    #[tracing::instrument(skip_all, fields(request_id = %claimed.lease.request_id, run_id = %claimed.run_id, attempt = claimed.attempt))]
    pub async fn execute(
        self: &Arc<Self>,
        claimed: Box<Claimed>,
        drain: CancellationToken,
    ) -> JobOutcome {
        let stop = CancellationToken::new();
        let reason = Arc::new(StopReason::default());
        let (pause_sender, pause) = tokio::sync::watch::channel(false);
        let keeper = renewal::spawn(
            self.clone(),
            claimed.lease.clone(),
            stop.clone(),
            reason.clone(),
            pause_sender,
        );
        let drain_watch = {
            let (stop, reason, drain) = (stop.clone(), reason.clone(), drain.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = drain.cancelled() => { reason.set(renewal::Reason::Drain); stop.cancel(); }
                    _ = stop.cancelled() => {}
                }
            })
        };
        let outcome = match self.run_plan(&claimed, &stop, &reason, pause).await {
            Ok(outcome) => outcome,
            Err(JobError::Lease(e)) => {
                tracing::warn!(error = %e, "a durable write was refused: this worker no longer owns the request");
                self.metrics.stale_writes_rejected.inc();
                self.metrics.self_fenced.inc();
                JobOutcome::Fenced
            }
            Err(e @ (JobError::Db(_) | JobError::Custody(_))) => {
                // The lease will lapse and the sweeper will give the request another attempt.
                tracing::error!(error = %e, "error while running a job; leaving it to the lease sweeper");
                JobOutcome::Fenced
            }
        };
        stop.cancel();
        keeper.stop().await;
        let _ = drain_watch.await;
        self.active.leave(claimed.lease.request_id).await;
        match &outcome {
            JobOutcome::Completed | JobOutcome::AwaitingVerification => {
                self.metrics.jobs_completed.inc();
            }
            JobOutcome::HandedBack => {
                self.metrics.jobs_handed_back.inc();
            }
            JobOutcome::Failed(_) | JobOutcome::NeedsReconciliation(_) | JobOutcome::Cancelled => {
                self.metrics.jobs_failed.inc();
            }
            _ => {}
        }
        tracing::info!(outcome = ?outcome, "job ended");
        outcome
    }

    async fn run_plan(
        &self,
        job: &Claimed,
        stop: &CancellationToken,
        reason: &StopReason,
        mut pause: tokio::sync::watch::Receiver<bool>,
    ) -> Result<JobOutcome, JobError> {
        if job.kind == JobKind::Verification {
            return self.run_verification(job, stop, reason).await;
        }
        if job.steps.is_empty() {
            // Nothing to run, so no workspace to make.
            return self.complete(job).await;
        }
        let subject = job.subject();
        let mut held = match self.acquire_or_end(job, &subject).await? {
            Ok(held) => held,
            Err(ended) => return Ok(ended),
        };
        let ending = self
            .run_steps(job, &subject, &mut held, stop, reason, &mut pause)
            .await;
        let how = match &ending {
            Err(JobError::Lease(_)) => Release::Fenced,
            Ok(Ending::Interrupted) => match reason.get() {
                Some(renewal::Reason::Cancelled) => Release::Ended { retire: false },
                Some(renewal::Reason::Drain | renewal::Reason::PauseExpired) => Release::HandedOn,
                Some(renewal::Reason::Fenced) | None => Release::Fenced,
            },
            // A task is done (its lineage retired) when it completed without asking for
            // more: a blocked or clarification report pauses it, and its checkpoint stays
            // current.
            Ok(Ending::Complete) => Release::Ended {
                retire: !self.paused_by_report(job.lease.request_id).await,
            },
            Ok(Ending::Fail(_)) => Release::Ended { retire: false },
            Ok(Ending::Reconcile { .. } | Ending::EndAttempt(_))
            | Err(JobError::Db(_) | JobError::Custody(_)) => Release::HandedOn,
        };
        // The workspace is released (or kept under a hold) while the lease is still ours.
        self.custody.release(&job.lease, &subject, &held, how).await;
        match ending? {
            Ending::Complete => self.complete(job).await,
            Ending::Fail(message) => {
                self.finish(job, RequestState::Failed, Some(&message), None)
                    .await?;
                Ok(JobOutcome::Failed(message))
            }
            Ending::Reconcile {
                message,
                step,
                reason,
            } => {
                self.finish(
                    job,
                    RequestState::NeedsReconciliation,
                    Some(reason),
                    Some(&step),
                )
                .await?;
                Ok(JobOutcome::NeedsReconciliation(message))
            }
            Ending::EndAttempt(error) => self.end_attempt(job, &error).await,
            Ending::Interrupted => self.interrupted(job, reason).await,
        }
    }

    /// Acquires the job's workspace. When none can be had, the request fails with the
    /// reason; when its checkpoint cannot be read now, the attempt ends. Either way the
    /// outcome comes back instead.
    pub(crate) async fn acquire_or_end(
        &self,
        job: &Claimed,
        subject: &Subject,
    ) -> Result<Result<Held, JobOutcome>, JobError> {
        match self.custody.acquire(&job.lease, subject).await {
            Ok(held) => Ok(Ok(held)),
            Err(CustodyError::Workspace(e)) => {
                let message = format!("workspace: {e}");
                self.finish(job, RequestState::Failed, Some(&message), None)
                    .await?;
                Ok(Err(JobOutcome::Failed(message)))
            }
            Err(e) => match e.ends_attempt() {
                Some(_) => self.end_attempt(job, &e).await.map(Err),
                None => Err(e.into()),
            },
        }
    }

    async fn run_steps(
        &self,
        job: &Claimed,
        subject: &Subject,
        held: &mut Held,
        stop: &CancellationToken,
        reason: &StopReason,
        pause: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<Ending, JobError> {
        let workspace = held.workspace.clone();
        let workspace = &workspace;
        let request_id = job.lease.request_id;
        let mut conn = self.pool.acquire().await?;
        let standings = journal::standings(&mut conn, request_id, held.position).await?;
        drop(conn);
        if !standings.is_empty() {
            self.record_standings(job, held, &standings).await?;
        }
        let mut used_commands = job.used_commands;
        let mut used_wall_ms = job.used_wall_ms;
        let last = job.steps.len().saturating_sub(1);
        // Once a step runs, no later receipt is taken as done: its tree moved on.
        let mut ran = false;

        let pausing = |step, group| Pausing {
            job,
            subject,
            step,
            group,
            stop,
            reason,
        };
        for (index, step) in job.steps.iter().enumerate() {
            match standings.get(&step.key) {
                Some(Standing::Done { snapshot }) if !ran => {
                    // Its receipt stands on a snapshot this tree holds: reuse it.
                    self.metrics.steps_reused.inc();
                    tracing::info!(step = %step.key, %snapshot, "step reused from its receipt");
                    continue;
                }
                None => {}
                Some(standing) if !step.idempotent => {
                    let reason = match standing {
                        Standing::Unknown => "unknown_outcome",
                        _ => {
                            self.metrics.trees_behind_journal.inc();
                            "tree_behind_journal"
                        }
                    };
                    let message = match reason {
                        "unknown_outcome" => format!(
                            "step {} started and has no receipt: its outcome is unknown",
                            step.key
                        ),
                        _ => format!(
                            "step {} has a receipt on a snapshot this tree (from tier {}) does not hold: its effects are not here",
                            step.key,
                            held.tier.as_str()
                        ),
                    };
                    return Ok(Ending::Reconcile {
                        message,
                        step: step.key.clone(),
                        reason,
                    });
                }
                Some(standing) => {
                    tracing::info!(step = %step.key, standing = standing.as_str(), "idempotent step runs again")
                }
            }
            if pause::requested(pause) && !stop.is_cancelled() {
                self.pause_here(pausing(None, 0), held, pause).await?;
            }
            if stop.is_cancelled() {
                return Ok(Ending::Interrupted);
            }
            if used_commands >= job.max_commands {
                let message = format!(
                    "budget exhausted: max_commands ({}) spent before step {}",
                    job.max_commands, step.key
                );
                return Ok(Ending::Fail(message));
            }
            let remaining_wall_ms = job.max_wall_ms - used_wall_ms;
            if remaining_wall_ms <= 0 {
                let message = format!(
                    "budget exhausted: max_wall_seconds spent before step {}",
                    step.key
                );
                return Ok(Ending::Fail(message));
            }

            // The intent, and the command's charge, are durable before the step starts.
            let mut tx = job.lease.begin_fenced(&self.pool).await?;
            journal::write_intent(
                &mut tx,
                &job.lease,
                job.attempt,
                &step.key,
                index,
                step.idempotent,
            )
            .await?;
            tx.commit().await?;
            used_commands += 1;
            ran = true;

            let command = self.command(job, workspace, step, index, remaining_wall_ms);
            if index == last {
                let _ = tokio::fs::remove_file(&workspace.report_file).await;
            }
            self.metrics.steps_run.inc();
            held.uncaptured = true;
            tracing::info!(step = %step.key, "step started");
            let group = AtomicI32::new(0);
            let running = step::run_published(&command, stop, &group);
            tokio::pin!(running);
            let result = loop {
                tokio::select! {
                    biased;
                    result = &mut running => break result,
                    // Once stopped (a pause past its limit included), never pause again.
                    _ = pause::until_requested(pause), if !stop.is_cancelled() => {
                        let at = pausing(Some(&step.key), group.load(Ordering::SeqCst));
                        if let Err(e) = self.pause_here(at, held, pause).await {
                            // Fenced (or the database failed) while pausing: end the step
                            // the usual way, its whole group with it, then give up.
                            reason.set(renewal::Reason::Fenced);
                            stop.cancel();
                            let _ = (&mut running).await;
                            return Err(e);
                        }
                    }
                }
            };
            let tier = held.tier;
            let receipt = |outcome| Receipt {
                step_key: &step.key,
                attempt: job.attempt,
                outcome,
                tier: Some(tier),
            };
            let outcome = match result {
                Ok(outcome) => outcome,
                Err(e) => {
                    // The program could not start: a receipt records it as a failed step.
                    let message = format!("step {}: {e}", step.key);
                    let failure = spawn_failure(&message).journal();
                    self.write_receipt(job, &receipt(&failure)).await?;
                    return Ok(Ending::Fail(message));
                }
            };
            let journaled = outcome.journal();
            if outcome.interrupted == Some(Interruption::Stopped) {
                return Ok(Ending::Interrupted);
            }
            used_wall_ms += outcome.wall_ms;
            tracing::info!(step = %step.key, result = %outcome.describe(), wall_ms = outcome.wall_ms, "step ended");
            if !outcome.succeeded() {
                // The request fails here: nothing continues from this tree.
                self.write_receipt(job, &receipt(&journaled)).await?;
                let message = format!("step {} {}", step.key, outcome.describe());
                return Ok(Ending::Fail(message));
            }
            let final_report = if index == last {
                match self.read_report(workspace).await {
                    Ok(report) => report,
                    Err(message) => {
                        self.write_receipt(job, &receipt(&journaled)).await?;
                        return Ok(Ending::Fail(message));
                    }
                }
            } else {
                None
            };
            // One durable fact: the receipt commits with the checkpoint holding its
            // effects, so a successor reuses it only on a tree that has them.
            let commit = Commit {
                receipt: receipt(&journaled),
                report: final_report.as_ref().map(RetainedReport::retained),
            };
            match self
                .custody
                .commit_step(&job.lease, subject, held, &commit, stop)
                .await
            {
                Ok(_) => {}
                Err(CustodyError::CaptureFailed(_)) if stop.is_cancelled() => {
                    return Ok(Ending::Interrupted)
                }
                Err(e @ CustodyError::CaptureFailed(_)) => {
                    tracing::warn!(step = %step.key, error = %e, "no receipt: the attempt ends and the tree stays held");
                    self.metrics.captures_failed.inc();
                    return Ok(Ending::EndAttempt(e));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Ending::Complete)
    }

    /// Shows in the resume context where each journaled step stands on this tree.
    async fn record_standings(
        &self,
        job: &Claimed,
        held: &Held,
        standings: &HashMap<String, Standing>,
    ) -> Result<(), JobError> {
        let receipts: Vec<serde_json::Value> = job
            .steps
            .iter()
            .filter_map(|step| {
                let standing = standings.get(&step.key)?;
                let snapshot = match standing {
                    Standing::Done { snapshot } => Some(*snapshot),
                    Standing::Behind { snapshot } => *snapshot,
                    Standing::Unknown => None,
                };
                Some(json!({"step_key": step.key, "standing": standing.as_str(), "snapshot_id": snapshot}))
            })
            .collect();
        let mut tx = job.lease.begin_fenced(&self.pool).await?;
        sqlx::query(
            "UPDATE execution_requests SET resume_context = COALESCE(resume_context, '{}'::jsonb) || jsonb_build_object('receipts', $2::jsonb)
              WHERE id = $1",
        )
        .bind(job.lease.request_id)
        .bind(serde_json::Value::from(receipts))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        tracing::info!(tier = held.tier.as_str(), position = ?held.position, "journal read against the acquired tree");
        Ok(())
    }

    /// Reads the final report; one that asks for verification is retained with the
    /// digest of the source its checks will verify.
    async fn read_report(&self, workspace: &Workspace) -> Result<Option<RetainedReport>, String> {
        let Some((report, body)) = crate::report::read(&workspace.report_file).await? else {
            return Ok(None);
        };
        let source_digest = if report.asks_for_verification() {
            let scope = crate::scope::measure(&workspace.root, &self.custody.settings.rules)
                .await
                .map_err(|e| format!("cannot measure the source to verify: {e}"))?;
            Some(scope.source_digest)
        } else {
            None
        };
        Ok(Some(RetainedReport {
            report,
            body,
            source_digest,
        }))
    }

    async fn paused_by_report(&self, request_id: Uuid) -> bool {
        match self.pool.acquire().await {
            Ok(mut conn) => report::asks_for_more(&mut conn, request_id)
                .await
                .unwrap_or(false),
            Err(_) => false,
        }
    }

    fn command(
        &self,
        job: &Claimed,
        workspace: &Workspace,
        step: &StepSpec,
        index: usize,
        remaining_wall_ms: i64,
    ) -> StepCommand {
        let mut env: BTreeMap<String, String> = BTreeMap::from([
            ("HOME".into(), workspace.home.to_string_lossy().into_owned()),
            ("CAIRN_RUN_ID".into(), job.run_id.simple().to_string()),
            (
                "CAIRN_REQUEST_ID".into(),
                job.lease.request_id.simple().to_string(),
            ),
            ("CAIRN_STEP_KEY".into(), step.key.clone()),
            ("CAIRN_STEP_INDEX".into(), index.to_string()),
            ("CAIRN_ATTEMPT".into(), job.attempt.to_string()),
            (
                "CAIRN_REPORT_FILE".into(),
                workspace.report_file.to_string_lossy().into_owned(),
            ),
        ]);
        env.extend(step.env.clone());
        let step_timeout = Duration::from_secs(u64::from(step.timeout_seconds));
        let wall_left = Duration::from_millis(u64::try_from(remaining_wall_ms).unwrap_or(0));
        StepCommand {
            argv: step.argv.clone(),
            env,
            cwd: step
                .cwd
                .as_ref()
                .map(|c| workspace.root.join(c))
                .unwrap_or_else(|| workspace.root.clone()),
            timeout: step_timeout.min(wall_left),
            output_base: step::output_base(
                &self.settings.artifacts_dir,
                job.lease.request_id,
                &step.key,
                job.lease.epoch,
            ),
            max_output: self.settings.output_max_bytes,
            tail_bytes: self.settings.output_tail_bytes,
            kill_grace: self.settings.kill_grace,
            isolate_network: false,
        }
    }

    /// A receipt that stands on no snapshot: the step failed (or never started) and the
    /// request fails with it, so nothing continues from its tree.
    async fn write_receipt(&self, job: &Claimed, receipt: &Receipt<'_>) -> Result<(), JobError> {
        let mut tx = job.lease.begin_fenced(&self.pool).await?;
        journal::record_receipt(&mut tx, &job.lease, receipt, None).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Every step has its receipt: accept the report, if any, and complete.
    async fn complete(&self, job: &Claimed) -> Result<JobOutcome, JobError> {
        let mut tx = job.lease.begin_fenced(&self.pool).await?;
        let outcome = if report::awaits_acceptance(&mut tx, job.lease.request_id).await? {
            let acceptance =
                report::accept(&mut tx, &job.lease, job.action_id, &self.settings.worker_id)
                    .await?;
            match acceptance {
                Acceptance::Accepted { verification: true } => JobOutcome::AwaitingVerification,
                Acceptance::Accepted {
                    verification: false,
                } => JobOutcome::Completed,
                Acceptance::Missing => {
                    JobOutcome::NeedsReconciliation("no retained report to accept".into())
                }
            }
        } else {
            request::set_state(
                &mut tx,
                job.lease.request_id,
                RequestState::Completed,
                None,
                None,
            )
            .await?;
            if let Some(action_id) = job.action_id {
                action::set_status(&mut tx, action_id, ActionStatus::Completed).await?;
            }
            JobOutcome::Completed
        };
        self.leases.release_in(&mut tx, &job.lease).await?;
        tx.commit().await?;
        self.leases.clear_liveness(&job.lease).await;
        Ok(outcome)
    }

    /// Ends the job in `state` and releases the lease, in one fenced transaction.
    pub(crate) async fn finish(
        &self,
        job: &Claimed,
        state: RequestState,
        reason: Option<&str>,
        step: Option<&str>,
    ) -> Result<(), JobError> {
        let mut tx = job.lease.begin_fenced(&self.pool).await?;
        request::set_state(&mut tx, job.lease.request_id, state, reason, step).await?;
        match (job.kind, job.action_id) {
            // A verification that ends without its completion fails its adoption and
            // handoff (or is cancelled with them).
            (JobKind::Verification, Some(adoption_id)) => {
                let status = if state == RequestState::Cancelled {
                    AdoptionStatus::Cancelled
                } else {
                    AdoptionStatus::Failed
                };
                handoff::set_adoption_status(&mut tx, adoption_id, status, reason).await?;
                handoff::set_handoff_state_of(&mut tx, adoption_id, HandoffState::Failed).await?;
            }
            (_, Some(action_id)) => {
                let status = match state {
                    RequestState::NeedsReconciliation => ActionStatus::NeedsReconciliation,
                    RequestState::Completed => ActionStatus::Completed,
                    _ => ActionStatus::Failed,
                };
                action::set_status(&mut tx, action_id, status).await?;
            }
            (_, None) => {}
        }
        self.leases.release_in(&mut tx, &job.lease).await?;
        tx.commit().await?;
        self.leases.clear_liveness(&job.lease).await;
        Ok(())
    }

    /// The job was stopped mid-way: cancelled, drained, or fenced.
    async fn interrupted(
        &self,
        job: &Claimed,
        reason: &StopReason,
    ) -> Result<JobOutcome, JobError> {
        match reason.get() {
            Some(renewal::Reason::Cancelled) => {
                self.finish(
                    job,
                    RequestState::Cancelled,
                    Some("cancelled while running"),
                    None,
                )
                .await?;
                Ok(JobOutcome::Cancelled)
            }
            Some(renewal::Reason::Drain) => {
                self.hand_back(job).await?;
                Ok(JobOutcome::HandedBack)
            }
            Some(renewal::Reason::PauseExpired) => {
                self.stop_after_pause(job).await?;
                Ok(JobOutcome::StoppedAtCheckpoint)
            }
            Some(renewal::Reason::Fenced) | None => {
                self.metrics.self_fenced.inc();
                Ok(JobOutcome::Fenced)
            }
        }
    }

    /// The attempt ended with its lease still ours and nothing recorded for its step (its
    /// effects could not be captured, or its checkpoint could not be read): the request
    /// is followed up as after a lapsed lease, with the reason.
    async fn end_attempt(
        &self,
        job: &Claimed,
        error: &CustodyError,
    ) -> Result<JobOutcome, JobError> {
        let reason = error.ends_attempt().unwrap_or("attempt_ended");
        let continuation = match (job.kind, job.action_id) {
            (JobKind::Verification, Some(id)) => request::Continuation::Verification(id),
            (JobKind::CheckpointContinuation, Some(id)) => request::Continuation::Checkpoint(id),
            _ => request::Continuation::None,
        };
        let mut tx = job.lease.begin_fenced(&self.pool).await?;
        let ended =
            request::end_attempt(&mut tx, job.lease.request_id, continuation, reason).await?;
        tx.commit().await?;
        self.leases.clear_liveness(&job.lease).await;
        tracing::warn!(error = %error, ?ended, "the attempt ended without a result");
        Ok(match ended {
            request::AttemptEnd::Requeued => JobOutcome::HandedBack,
            request::AttemptEnd::Stopped => JobOutcome::StoppedAtCheckpoint,
            request::AttemptEnd::AwaitingAdoption => JobOutcome::Failed(error.to_string()),
        })
    }

    /// A pause past its limit behaves like a stop: the request stops at its checkpoint
    /// (a reviewed continuation can take it further) and the lease is released.
    async fn stop_after_pause(&self, job: &Claimed) -> Result<(), JobError> {
        let mut tx = job.lease.begin_fenced(&self.pool).await?;
        self.leases.release_in(&mut tx, &job.lease).await?;
        if let Some(action_id) = job.action_id {
            action::set_status(&mut tx, action_id, ActionStatus::Failed).await?;
        }
        request::pause::clear(&mut tx, job.lease.request_id).await?;
        request::stop_at_checkpoint(&mut tx, job.lease.request_id, "pause_expired").await?;
        tx.commit().await?;
        self.leases.clear_liveness(&job.lease).await;
        Ok(())
    }

    /// Drain: the request goes back to the queue at once, on the same attempt, for
    /// another worker; a stopped step has no receipt and follows the unknown-outcome rule.
    async fn hand_back(&self, job: &Claimed) -> Result<(), JobError> {
        let mut tx = job.lease.begin_fenced(&self.pool).await?;
        match (job.kind, job.action_id) {
            (JobKind::CheckpointContinuation, Some(action_id)) => {
                if action::window_open(&mut tx, action_id).await? {
                    request::fence_out(&mut tx, job.lease.request_id).await?;
                    action::set_status(&mut tx, action_id, ActionStatus::Queued).await?;
                    let message = JobMessage {
                        kind: JobKind::CheckpointContinuation,
                        run_id: job.run_id,
                        request_id: job.lease.request_id,
                        action_id: Some(action_id),
                        attempt: Some(job.attempt),
                    };
                    request::readmit(&mut tx, &message).await?;
                } else {
                    request::stop_at_checkpoint(
                        &mut tx,
                        job.lease.request_id,
                        "continuation_window_ended",
                    )
                    .await?;
                    action::set_status(&mut tx, action_id, ActionStatus::Failed).await?;
                }
            }
            _ => {
                request::requeue(&mut tx, job.lease.request_id, false).await?;
            }
        }
        tx.commit().await?;
        self.leases.clear_liveness(&job.lease).await;
        Ok(())
    }
}

/// The outcome recorded for a command that could not start.
pub(crate) fn spawn_failure(message: &str) -> StepOutcome {
    StepOutcome {
        exit_code: None,
        signal: None,
        interrupted: None,
        wall_ms: 0,
        cpu_ms: 0,
        output_digest: cairn_common::digest::sha256_hex(message.as_bytes()),
        stdout_tail: String::new(),
        stderr_tail: message.to_string(),
        stdout_path: PathBuf::new(),
        truncated: false,
    }
}
