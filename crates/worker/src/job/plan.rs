//! A run's plan: acquire its workspace, run each step not yet done on that tree (an
//! intent before it, a commit of its receipt with its checkpoint after it), pause when
//! asked, release the tree, and record how the plan ended.

use super::folded::{FirstIntent, WithReceipt};
use super::handle::{Job, JobOutcome};
use super::{durable, ending};
use crate::custody::{Checkpoint, Commit, CustodyError, NoCompletion, Release, Subject, Tree};
use crate::error::JobError;
use crate::isolation::{self, Live};
use crate::keeper::Reason;
use crate::live_output::LiveOutput;
use crate::pause;
use crate::report::RetainedReport;
use crate::step::{self, Interruption, StepCommand};
use crate::workspace::Workspace;
use cairn_common::egress::{Effective, Layer};
use cairn_common::journal::{self, Receipt, Record, Standing};
use cairn_common::lineage::Tier;
use cairn_common::request::limits::{self, Breach, Moment};
use cairn_common::request::{self, RequestEvent};
use cairn_common::run::StepSpec;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// How a plan ended, before the request records it.
enum Ending {
    Complete,
    /// The completion, and the tree's release, committed with the last receipt.
    Completed,
    Fail(String),
    /// A step failed under its retry policy: it runs again after its backoff.
    Retry(Box<super::retry::Retry>),
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
    /// A limit of the contract was reached before step `next` (a cancel, the window,
    /// the deadline, a budget).
    Breach {
        breach: Breach,
        next: String,
    },
}

/// Runs a run's plan (or continues it): acquires the workspace, runs the steps not yet
/// done on it, releases the tree, and records how it ended.
pub async fn run(job: &Job) -> Result<JobOutcome, JobError> {
    if job.claimed.steps.is_empty() {
        // Nothing to run, so no workspace to make.
        return ending::complete(job).await;
    }
    let subject = job.claimed.subject();
    let opening = FirstIntent::of(job);
    let mut tree = match ending::acquire_or_end(job, &subject, &opening).await? {
        Ok(tree) => tree,
        Err(ended) => return Ok(ended),
    };
    let ended = run_steps(job, &subject, &mut tree, opening.written()).await;
    let how = match &ended {
        Err(JobError::Lease(_)) => Release::Fenced,
        Ok(Ending::Interrupted) => match job.cause() {
            Some(Reason::Cancelled) => Release::Ended { retire: false },
            Some(Reason::Drain | Reason::PauseExpired | Reason::WindowEnded) => Release::HandedOn,
            Some(Reason::Fenced) | None => Release::Fenced,
        },
        Ok(Ending::Breach { breach, .. }) => ending::release_at(breach),
        // The tree's release commits with the completion.
        Ok(Ending::Complete) => return ending::complete_and_release(job, &subject, &tree).await,
        Ok(Ending::Completed) => {
            let custody = &job.worker.custody;
            custody
                .released(&tree, Release::Ended { retire: false })
                .await;
            job.worker.leases.clear_liveness(job.lease());
            return Ok(JobOutcome::Completed);
        }
        // A retry runs on the tree of the last checkpoint, not on what the failure left.
        Ok(Ending::Fail(_) | Ending::Retry(_)) => Release::Ended { retire: false },
        Ok(Ending::Reconcile { .. } | Ending::EndAttempt(_))
        | Err(JobError::Db(_) | JobError::Custody(_) | JobError::Refused(_)) => Release::HandedOn,
    };
    // The workspace is released (or kept under a hold) while the lease is still ours.
    job.worker
        .custody
        .release(job.lease(), &subject, &tree, how)
        .await;
    match ended? {
        Ending::Complete | Ending::Completed => {
            unreachable!("a completed plan ends with its release, above")
        }
        Ending::Fail(message) => {
            ending::finish(job, RequestEvent::Fail, Some(&message), None).await?;
            Ok(JobOutcome::Failed(message))
        }
        Ending::Retry(retry) => super::retry::schedule(job, &retry).await,
        Ending::Reconcile {
            message,
            step,
            reason,
        } => {
            ending::finish(job, RequestEvent::Reconcile, Some(reason), Some(&step)).await?;
            Ok(JobOutcome::NeedsReconciliation(message))
        }
        Ending::EndAttempt(error) => ending::end_attempt(job, &error).await,
        Ending::Interrupted => ending::interrupted(job).await,
        Ending::Breach { breach, next } => {
            ending::breached(job, &breach, Moment::Intent, Some(&next)).await
        }
    }
}

/// Writes a step's intent and charges its command in one fenced transaction, unless the
/// contract allows no more steps; returns the wall time left. A database fault is
/// retried within the lease (a lost lease fails the fenced begin instead), and the
/// intent is read back first, since its commit may have landed before the connection
/// broke.
async fn intend(job: &Job, step: &StepSpec, index: usize) -> Result<Result<i64, Breach>, JobError> {
    let landed = || async {
        crate::fault::unanswered::<JobError>(crate::fault::INTENT_READ_BACK)?;
        let pool = &job.worker.pool;
        if !journal::written(pool, job.lease(), Record::Intent, &step.key).await? {
            return Ok(None);
        }
        let mut conn = pool.acquire().await?;
        let current = limits::read(&mut conn, job.request_id(), job.claimed.continuation).await?;
        Ok(Some(Ok(current.wall_left_ms())))
    };
    durable::until_landed(
        job,
        "the step's intent",
        || intend_once(job, step, index),
        landed,
    )
    .await
}

async fn intend_once(
    job: &Job,
    step: &StepSpec,
    index: usize,
) -> Result<Result<i64, Breach>, JobError> {
    let mut tx = job.begin().await?;
    let written = super::intent::write(&mut tx, job, step, (index, None)).await?;
    if written.is_ok() {
        tx.commit().await?;
        crate::fault::lost_reply::<JobError>(crate::fault::INTENT_REPLY)?;
        crate::fault::point(crate::fault::AFTER_INTENT);
    }
    Ok(written)
}

/// Runs the steps not yet done on `tree`. `opened`: the wall time left when the first
/// step's intent committed with the tree's record ([`FirstIntent`]).
async fn run_steps(
    job: &Job,
    subject: &Subject,
    tree: &mut Tree,
    mut opened: Option<i64>,
) -> Result<Ending, JobError> {
    let worker = &job.worker;
    let claimed = &job.claimed;
    let request_id = job.request_id();
    // A request claimed with an empty journal has no standings to read.
    let standings = if claimed.journaled {
        let mut conn = worker.pool.acquire().await?;
        journal::standings(&mut conn, request_id, tree.live.position).await?
    } else {
        HashMap::new()
    };
    if !standings.is_empty() {
        record_standings(job, tree, &standings).await?;
    }
    // Once a step runs, no later receipt is taken as done: its tree moved on.
    let mut ran = false;
    let mut pause_requests = job.pause_requests();
    for (index, step) in claimed.steps.iter().enumerate() {
        match decide(step, standings.get(&step.key), ran, tree) {
            Decision::Reuse(snapshot) => {
                worker.metrics.steps_reused.inc();
                tracing::info!(step = %step.key, snapshot = %snapshot.simple(), "step reused from its receipt");
                continue;
            }
            Decision::MarkedDone => {
                tracing::info!(step = %step.key, "step recorded done by a person's decision");
                continue;
            }
            Decision::Reconcile(ending) => {
                if matches!(
                    &ending,
                    Ending::Reconcile {
                        reason: "tree_behind_journal",
                        ..
                    }
                ) {
                    worker.metrics.trees_behind_journal.inc();
                }
                return Ok(ending);
            }
            Decision::Run => {}
        }
        let written = match index {
            0 => opened.take(),
            _ => None,
        };
        let remaining_wall_ms = match written {
            // Its intent is durable: the step starts now, as after any intent.
            Some(remaining_wall_ms) => {
                crate::fault::point(crate::fault::AFTER_INTENT);
                remaining_wall_ms
            }
            None => match before_step(job, subject, tree, step, index).await? {
                Ok(remaining_wall_ms) => remaining_wall_ms,
                Err(ending) => return Ok(ending),
            },
        };
        ran = true;
        let at = At {
            step,
            index,
            remaining_wall_ms,
            // An adopted tree may hold work no checkpoint has (a step a person marked
            // done, say): a retry, which starts again from the last checkpoint, would
            // lose it.
            retry_safe: !(tree.live.uncaptured && tree.tier == Tier::Adopt),
        };
        if let Some(ending) = run_step(job, subject, tree, &at, &mut pause_requests).await? {
            return Ok(ending);
        }
    }
    Ok(Ending::Complete)
}

/// Before a step whose intent is not yet written: a pause asked for, a stop or a drain,
/// then its intent; the wall time left, or how the plan ends here.
async fn before_step(
    job: &Job,
    subject: &Subject,
    tree: &mut Tree,
    step: &StepSpec,
    index: usize,
) -> Result<Result<i64, Ending>, JobError> {
    if pause::requested(job) && !job.stopped() {
        pause::pause_here(job, subject, tree, None, &Live::default()).await?;
    }
    // Handed back on its checkpoint: another worker starts this step.
    job.stop_if_draining();
    if job.stopped() {
        return Ok(Err(Ending::Interrupted));
    }
    // The intent, and the command's charge, are durable before the step starts, and
    // only if the contract still allows another step: the limits are read in the same
    // fenced transaction, as they stand now.
    Ok(match intend(job, step, index).await? {
        Ok(remaining_wall_ms) => Ok(remaining_wall_ms),
        Err(breach) => {
            let next = step.key.clone();
            Err(Ending::Breach { breach, next })
        }
    })
}

/// What to do with a step, given where its journal stands on this tree.
enum Decision {
    /// Its receipt stands on a snapshot this tree holds.
    Reuse(uuid::Uuid),
    /// A person recorded it done, and no earlier step of this attempt ran.
    MarkedDone,
    Run,
    /// A non-idempotent step started and has no receipt this tree can use.
    Reconcile(Ending),
}

/// Decides a step from its standing (`None`: never started), whether an earlier step
/// of this attempt ran (then no later receipt is taken as done) and the tree's tier.
fn decide(step: &StepSpec, standing: Option<&Standing>, ran: bool, tree: &Tree) -> Decision {
    match standing {
        Some(Standing::Done { snapshot }) if !ran => Decision::Reuse(*snapshot),
        Some(Standing::MarkedDone) if !ran => Decision::MarkedDone,
        None => Decision::Run,
        Some(Standing::Unknown) if !step.idempotent => Decision::Reconcile(Ending::Reconcile {
            message: format!(
                "step {} started and has no receipt: its outcome is unknown",
                step.key
            ),
            step: step.key.clone(),
            reason: "unknown_outcome",
        }),
        Some(Standing::MarkedDone) if !step.idempotent => Decision::Reconcile(Ending::Reconcile {
            message: format!(
                "step {} was marked done by a person, but an earlier step ran again first: decide it again",
                step.key
            ),
            step: step.key.clone(),
            reason: "tree_behind_journal",
        }),
        Some(_) if !step.idempotent => Decision::Reconcile(Ending::Reconcile {
            message: format!(
                "step {} has a receipt on a snapshot this tree (from tier {}) does not hold: its effects are not here",
                step.key,
                tree.tier.as_str()
            ),
            step: step.key.clone(),
            reason: "tree_behind_journal",
        }),
        Some(standing) => {
            tracing::info!(step = %step.key, standing = standing.as_str(), "idempotent step runs again");
            Decision::Run
        }
    }
}

/// The step about to run: its place in the plan and the wall time the contract leaves.
struct At<'a> {
    step: &'a StepSpec,
    index: usize,
    remaining_wall_ms: i64,
    /// Whether the step starts on a tree its last checkpoint holds whole.
    retry_safe: bool,
}

/// Runs one step whose intent is durable, pausing when asked, then writes its receipt
/// (committed with the checkpoint of its effects when it succeeded); `Some` when the
/// plan ends here.
async fn run_step(
    job: &Job,
    subject: &Subject,
    tree: &mut Tree,
    at: &At<'_>,
    pause_requests: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<Option<Ending>, JobError> {
    let (worker, step) = (&job.worker, at.step);
    let workspace = tree.live.workspace.clone();
    let last = at.index + 1 == job.claimed.steps.len();
    let command = command(job, &workspace, step, at.index, at.remaining_wall_ms);
    if last {
        let _ = tokio::fs::remove_file(&workspace.report_file).await;
    }
    worker.metrics.steps_run.inc();
    tree.live.uncaptured = true;
    tracing::info!(step = %step.key, "step started");
    let live = Live::default();
    let running = step::run_published(&command, &worker.isolation, &job.stop, &live);
    tokio::pin!(running);
    let result = loop {
        tokio::select! {
            biased;
            result = &mut running => break result,
            // Once stopped (a pause past its limit included), never pause again.
            _ = pause::until_requested(pause_requests), if !job.stopped() => {
                if let Err(e) = pause::pause_here(job, subject, tree, Some(&step.key), &live).await {
                    // Fenced (or the database failed) while pausing: end the step
                    // the usual way, its whole group with it, then give up.
                    job.stop_for(Reason::Fenced);
                    let _ = (&mut running).await;
                    return Err(e);
                }
            }
        }
    };
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(e) => {
            // The program could not start: a receipt records it as a failed step.
            let message = format!("step {}: {e}", step.key);
            let failure = ending::spawn_failure(&message).journal();
            ending::write_receipt(job, &receipt(job, tree, step, &failure)).await?;
            return Ok(Some(Ending::Fail(message)));
        }
    };
    record_outcome(job, subject, tree, at, &outcome, &workspace).await
}

/// A step's receipt on this attempt and tree.
fn receipt<'a>(
    job: &Job,
    tree: &Tree,
    step: &'a StepSpec,
    outcome: &'a journal::Outcome,
) -> Receipt<'a> {
    Receipt {
        step_key: &step.key,
        attempt: job.claimed.attempt,
        outcome,
        tier: Some(tree.tier),
    }
}

/// Keeps a failed step's tree for inspection, if it can: the run fails either way.
async fn keep_for_inspection(job: &Job, subject: &Subject, tree: &mut Tree, step: &str) {
    let custody = &job.worker.custody;
    match custody
        .keep_for_inspection(job.lease(), subject, tree, step)
        .await
    {
        Ok(Checkpoint::Stands(id)) => {
            tracing::info!(step, snapshot_id = %id.simple(), "the failed step's tree is kept for inspection")
        }
        Ok(Checkpoint::Failed(reason)) => {
            tracing::warn!(step, %reason, "the failed step's tree could not be kept for inspection")
        }
        Err(e) => {
            tracing::warn!(step, error = %e, "the failed step's tree could not be kept for inspection")
        }
    }
}

/// Journals how a step that ran ended: stopped (cancelled: its receipt keeps the output
/// so far), failed, or succeeded (its receipt, and the final report after the last
/// step, committed with the checkpoint of its effects).
async fn record_outcome(
    job: &Job,
    subject: &Subject,
    tree: &mut Tree,
    at: &At<'_>,
    outcome: &step::StepOutcome,
    workspace: &Workspace,
) -> Result<Option<Ending>, JobError> {
    let step = at.step;
    let journaled = outcome.journal();
    if outcome.interrupted == Some(Interruption::Stopped) {
        if job.cause() == Some(Reason::Cancelled) {
            // The run ends cancelled here: the receipt keeps the output so far and the
            // time used; it stands on no snapshot, so it is never reused.
            let cancelled = journal::Outcome {
                cancelled: true,
                ..journaled
            };
            // The cancel must land even when its record cannot: without this receipt
            // the step reads as an unknown outcome, charged from its intent.
            match ending::write_receipt(job, &receipt(job, tree, step, &cancelled)).await {
                Ok(()) => {
                    tracing::info!(step = %step.key, wall_ms = outcome.wall_ms, "step stopped: the run was cancelled")
                }
                Err(e) => {
                    tracing::warn!(step = %step.key, error = %e, "the cancelled step's receipt was not written")
                }
            }
        }
        return Ok(Some(Ending::Interrupted));
    }
    tracing::info!(step = %step.key, result = %outcome.describe(), wall_ms = outcome.wall_ms, "step ended");
    if !outcome.succeeded() {
        // The request fails here: nothing continues from this tree, but an operator may
        // look at what the step left.
        ending::write_receipt(job, &receipt(job, tree, step, &journaled)).await?;
        let retry = match at.retry_safe {
            true => super::retry::plan(job, step, &journaled).await?,
            false => None,
        };
        if let Some(retry) = retry {
            return Ok(Some(Ending::Retry(Box::new(retry))));
        }
        keep_for_inspection(job, subject, tree, &step.key).await;
        let message = format!("step {} {}", step.key, outcome.describe());
        return Ok(Some(Ending::Fail(message)));
    }
    let final_report = if at.index + 1 == job.claimed.steps.len() {
        match read_report(job, workspace).await {
            Ok(report) => report,
            Err(message) => {
                ending::write_receipt(job, &receipt(job, tree, step, &journaled)).await?;
                return Ok(Some(Ending::Fail(message)));
            }
        }
    } else {
        None
    };
    // One durable fact: the receipt commits with the checkpoint holding its effects,
    // so a successor reuses it only on a tree that has them.
    let commit = Commit {
        receipt: receipt(job, tree, step, &journaled),
        report: final_report.as_ref().map(RetainedReport::retained),
    };
    commit_step(
        job,
        subject,
        tree,
        &commit,
        at.index + 1 == job.claimed.steps.len(),
    )
    .await
}

/// Commits a step that succeeded; the last one's completion commits with it when it can
/// ([`WithReceipt`]).
async fn commit_step(
    job: &Job,
    subject: &Subject,
    tree: &mut Tree,
    commit: &Commit<'_>,
    last: bool,
) -> Result<Option<Ending>, JobError> {
    let (custody, step) = (&job.worker.custody, commit.receipt.step_key);
    let workspace_id = tree.live.workspace_id;
    let retains_report = commit.report.is_some();
    let completes = last
        .then(|| WithReceipt::of(job, subject, workspace_id, retains_report))
        .flatten();
    let committed = match &completes {
        Some(completes) => {
            let with = (commit, completes);
            (custody.commit_step(job.lease(), subject, tree, with, &job.stop)).await
        }
        None => {
            let with = (commit, &NoCompletion);
            (custody.commit_step(job.lease(), subject, tree, with, &job.stop)).await
        }
    };
    if let Some(completes) = &completes {
        if completes.landed(&committed).await? {
            return Ok(Some(Ending::Completed));
        }
    }
    match committed {
        Ok(_) => Ok(None),
        Err(CustodyError::CaptureFailed(_)) if job.stopped() => Ok(Some(Ending::Interrupted)),
        Err(e @ CustodyError::CaptureFailed(_)) => {
            tracing::warn!(step, error = %e, "no receipt: the attempt ends and the tree stays held");
            job.worker.metrics.captures_failed.inc();
            Ok(Some(Ending::EndAttempt(e)))
        }
        Err(e) => Err(e.into()),
    }
}

/// Shows in the resume context where each journaled step stands on this tree.
async fn record_standings(
    job: &Job,
    tree: &Tree,
    standings: &HashMap<String, Standing>,
) -> Result<(), JobError> {
    let receipts: Vec<serde_json::Value> = job
        .claimed
        .steps
        .iter()
        .filter_map(|step| {
            let standing = standings.get(&step.key)?;
            let snapshot = match standing {
                Standing::Done { snapshot } => Some(*snapshot),
                Standing::Behind { snapshot } => *snapshot,
                Standing::Unknown | Standing::MarkedDone => None,
            };
            Some(json!({"step_key": step.key, "standing": standing.as_str(), "snapshot_id": snapshot}))
        })
        .collect();
    let mut tx = job.begin().await?;
    request::resume::note_receipts(&mut tx, job.request_id(), &receipts.into()).await?;
    tx.commit().await?;
    tracing::info!(
        tier = tree.tier.as_str(),
        position = %tree.live.position.map_or_else(|| "none".into(), |p| p.simple().to_string()),
        "journal read against the acquired tree"
    );
    Ok(())
}

/// Reads the final report; one that asks for verification is retained with the
/// digest of the source its checks will verify.
async fn read_report(job: &Job, workspace: &Workspace) -> Result<Option<RetainedReport>, String> {
    let Some((report, body)) = crate::report::read(&workspace.report_file).await? else {
        return Ok(None);
    };
    let source_digest = if report.asks_for_verification() {
        let scope = crate::scope::measure(&workspace.root, &job.worker.custody.settings.rules)
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

fn command(
    job: &Job,
    workspace: &Workspace,
    step: &StepSpec,
    index: usize,
    remaining_wall_ms: i64,
) -> StepCommand {
    let runner = &job.worker.isolation;
    let home = runner.home_path(&workspace.home);
    let mut env: BTreeMap<String, String> = BTreeMap::from([
        ("HOME".into(), home.to_string_lossy().into_owned()),
        (
            "CAIRN_RUN_ID".into(),
            job.claimed.run_id.simple().to_string(),
        ),
        (
            "CAIRN_REQUEST_ID".into(),
            job.request_id().simple().to_string(),
        ),
        ("CAIRN_STEP_KEY".into(), step.key.clone()),
        ("CAIRN_STEP_INDEX".into(), index.to_string()),
        ("CAIRN_ATTEMPT".into(), job.claimed.attempt.to_string()),
        (
            "CAIRN_REPORT_FILE".into(),
            home.join(crate::workspace::REPORT_FILE)
                .to_string_lossy()
                .into_owned(),
        ),
    ]);
    env.extend(step.env.clone());
    let step_timeout = Duration::from_secs(u64::from(step.timeout_seconds));
    let wall_left = Duration::from_millis(u64::try_from(remaining_wall_ms).unwrap_or(0));
    StepCommand {
        argv: step.argv.clone(),
        env,
        place: isolation::Spec {
            workspace: workspace.root.clone(),
            cwd: step.cwd.clone(),
            home: workspace.home.clone(),
            network: Effective::of(
                job.claimed.tenant_network.as_ref(),
                step.network.as_ref(),
                Layer::Run,
                runner.network_default(),
            ),
            limits: runner.limits(step.limits),
            identity: None,
            volumes: Vec::new(),
        },
        timeout: step_timeout.min(wall_left),
        output_base: crate::step_output::output_base(
            &job.worker.settings.artifacts_dir,
            job.request_id(),
            &step.key,
            job.lease().epoch,
        ),
        live: Some(LiveOutput {
            store: job.worker.custody.settings.store.store().clone(),
            request_id: job.request_id(),
            epoch: job.lease().epoch,
            step_index: index,
        }),
        max_output: job.worker.settings.output_max_bytes,
        tail_bytes: job.worker.settings.output_tail_bytes,
        redact: job.worker.settings.redact_output,
        kill_grace: job.worker.settings.kill_grace,
        input: None,
    }
}
