//! The fresh worker round that finishes a run once its verification passed.
//!
//! It claims the same ticket (same attempt, same budgets), restores the work context's
//! tree and starts no process: it finishes on the verified source without editing it.
//! Its usage records an explicit `retained_source` proof and an empty `files_written`.
//! Then the native terminal acceptance checks again, in one fenced transaction, the
//! original final-result receipt, the passed command receipts, the run's current
//! authority, a qualified runtime (this worker's source profile) and the exact source;
//! anything missing or changed holds the run for a person (`needs_reconciliation`,
//! `finishing_round_held`) and never opens another coding attempt.

use super::Adoption;
use crate::custody::{Release, Subject, Tree};
use crate::error::JobError;
use crate::job::durable;
use crate::job::ending;
use crate::job::handle::{Job, JobOutcome};
use crate::keeper::Reason;
use crate::scope;
use cairn_common::handoff;
use cairn_common::journal;
use cairn_common::lineage;
use cairn_common::qualification;
use cairn_common::report;
use cairn_common::request::limits::{self, Moment};
use cairn_common::request::{self, AdoptionEvent, RequestEvent};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::PgConnection;
use std::time::Instant;
use uuid::Uuid;

/// Why a finishing round cannot accept the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldReason {
    /// The tree is not the one the checks passed on.
    ChangedSource,
    /// A receipt the acceptance stands on is missing or no longer matches.
    MissingCustody,
    /// A check has no passed result.
    FailedChecks,
    /// The token that submitted the run was revoked.
    RevokedAccess,
    /// This worker's implementation is not a qualified source profile.
    IncompatibleQualification,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hold {
    pub reason: HoldReason,
    pub message: String,
}

/// What the terminal acceptance reads, in its own transaction.
#[derive(Debug, Clone, Default, sqlx::FromRow)]
pub struct Evidence {
    /// The original final-result receipt: its journal entry and the digest it accepted.
    pub acceptance_receipt: Option<i64>,
    pub accepted_digest: Option<String>,
    pub consumed: bool,
    /// The retained report as it stands now.
    pub outcome: Option<String>,
    pub followup_kind: Option<String>,
    pub body: Option<Value>,
    /// The verification's passed completion receipt and the tree it recorded.
    pub completion_receipt: Option<i64>,
    pub verified_tree: Option<String>,
    /// The adoption's results: all of them, and those that passed.
    pub result_ids: Vec<Uuid>,
    pub passed_results: i64,
    /// The run's operator token exists and is not revoked.
    pub authority_current: bool,
    pub operator: Option<Uuid>,
    /// The work context's tree now.
    pub current_tree: Option<String>,
    /// This worker's source profile is registered as qualified.
    pub runtime_qualified: bool,
}

impl Evidence {
    /// The digest of the retained report now, when there is one.
    fn report_digest(&self) -> Option<String> {
        let (outcome, body) = (self.outcome.as_deref()?, self.body.as_ref()?);
        Some(report::digest(outcome, self.followup_kind.as_deref(), body))
    }
}

/// The holds of a terminal acceptance: `checks` the adoption's frozen command count,
/// `verified_source` the source the handoff froze, `measured` the restored tree's.
pub fn holds(
    e: &Evidence,
    checks: usize,
    verified_source: Option<&str>,
    measured: Option<&str>,
) -> Vec<Hold> {
    let mut holds = Vec::new();
    let mut add = |reason, message: String| holds.push(Hold { reason, message });
    match (e.acceptance_receipt, e.accepted_digest.as_deref()) {
        (Some(_), Some(accepted))
            if e.consumed && e.report_digest().as_deref() == Some(accepted) => {}
        (Some(_), Some(_)) if e.consumed => add(
            HoldReason::MissingCustody,
            "the retained report no longer matches its final-result receipt".into(),
        ),
        _ => add(
            HoldReason::MissingCustody,
            "no final-result receipt accepted the retained report".into(),
        ),
    }
    if e.completion_receipt.is_none() {
        add(
            HoldReason::MissingCustody,
            "no passed verification completion stands for this adoption".into(),
        );
    }
    let results = e.result_ids.len();
    if results != checks || e.passed_results != checks as i64 {
        add(
            HoldReason::FailedChecks,
            format!(
                "{} of {checks} checks have a passed result ({results} recorded)",
                e.passed_results
            ),
        );
    }
    if !e.authority_current {
        add(
            HoldReason::RevokedAccess,
            "the token that submitted the run was revoked".into(),
        );
    }
    if !e.runtime_qualified {
        add(
            HoldReason::IncompatibleQualification,
            "this worker's implementation is not a qualified source profile".into(),
        );
    }
    match (verified_source, measured) {
        (Some(verified), Some(measured)) if verified == measured => {}
        (Some(_), Some(_)) => add(
            HoldReason::ChangedSource,
            "the restored tree's source is not the source the checks verified".into(),
        ),
        _ => add(
            HoldReason::MissingCustody,
            "the verified source or the restored tree's could not be measured".into(),
        ),
    }
    match (e.verified_tree.as_deref(), e.current_tree.as_deref()) {
        (Some(verified), Some(current)) if verified == current => {}
        (Some(_), Some(_)) => add(
            HoldReason::ChangedSource,
            "the work context's tree moved since the checks passed".into(),
        ),
        _ => add(
            HoldReason::MissingCustody,
            "nothing records the tree the checks passed on, or the tree now".into(),
        ),
    }
    holds
}

/// Runs the finishing round of a verification whose checks passed.
pub(super) async fn finish(job: &Job, adoption: &Adoption) -> Result<JobOutcome, JobError> {
    let started = Instant::now();
    let subject = job.claimed.subject();
    let tree = match ending::acquire_or_end(job, &subject, &crate::custody::NoOpening).await? {
        Ok(tree) => tree,
        Err(ended) => return Ok(ended),
    };
    let rules = &job.worker.custody.settings.rules;
    let measured = scope::measure(&tree.live.workspace.root, rules)
        .await
        .ok()
        .map(|scope| scope.source_digest);
    if job.stopped() {
        return interrupted(job, adoption, &subject, &tree).await;
    }
    let round = Round {
        job,
        adoption,
        subject: &subject,
        tree: &tree,
        measured: measured.as_deref(),
        started,
    };
    let write = || round.accept_once();
    let outcome = durable::until_landed(job, "the terminal acceptance", write, || {
        durable::ended(job)
    })
    .await?;
    let finished = matches!(outcome, JobOutcome::Completed);
    let how = Release::Ended { retire: finished };
    job.worker.custody.released(&tree, how).await;
    job.worker.leases.clear_liveness(job.lease());
    Ok(outcome)
}

/// A round that stopped before its acceptance: a drain hands the adoption back (the
/// next worker finishes it), a cancel cancels, a lost lease writes nothing.
async fn interrupted(
    job: &Job,
    adoption: &Adoption,
    subject: &Subject,
    tree: &Tree,
) -> Result<JobOutcome, JobError> {
    let how = match job.cause() {
        Some(Reason::Drain) => Release::HandedOn,
        Some(Reason::Cancelled) => Release::Ended { retire: false },
        _ => Release::Fenced,
    };
    job.worker
        .custody
        .release(job.lease(), subject, tree, how)
        .await;
    match job.cause() {
        Some(Reason::Drain) => {
            super::complete::hand_back(job, adoption.id).await?;
            Ok(JobOutcome::HandedBack)
        }
        Some(Reason::Cancelled) => {
            let reason = Some("cancelled before its finishing round");
            ending::finish(job, RequestEvent::Cancel, reason, None).await?;
            Ok(JobOutcome::Cancelled)
        }
        _ => {
            job.worker.metrics.self_fenced.inc();
            Ok(JobOutcome::Fenced)
        }
    }
}

struct Round<'a> {
    job: &'a Job,
    adoption: &'a Adoption,
    subject: &'a Subject,
    tree: &'a Tree,
    measured: Option<&'a str>,
    started: Instant,
}

impl Round<'_> {
    /// The terminal acceptance, in one fenced transaction: the limits, the evidence,
    /// the round's usage and the acceptance (or the holds), the request's and the
    /// adoption's moves, the tree's release and the lease's.
    async fn accept_once(&self) -> Result<JobOutcome, JobError> {
        let job = self.job;
        let mut tx = job.begin().await?;
        let continuation = job.claimed.continuation;
        let current = limits::read(&mut tx, job.request_id(), continuation).await?;
        let tree_release = |retire| Release::Ended { retire };
        if let Some(breach) = current.breach(Moment::Completion) {
            let how = tree_release(false);
            job.worker
                .custody
                .release_rows(&mut tx, self.subject, self.tree, how)
                .await?;
            job.worker.leases.release_in(&mut tx, job.lease()).await?;
            let (request_id, at) = (job.request_id(), Moment::Completion);
            let ended =
                limits::end_for(&mut tx, request_id, continuation, &breach, at, None).await?;
            tx.commit().await?;
            return Ok(crate::job::claim::ended_outcome(ended));
        }
        let evidence = read_evidence(&mut tx, job, self.adoption.id).await?;
        let checks = self.adoption.commands.len();
        let verified = self.adoption.source_digest.as_deref();
        let holds = holds(&evidence, checks, verified, self.measured);
        let outcome = if holds.is_empty() {
            self.accept(&mut tx, &evidence).await?;
            JobOutcome::Completed
        } else {
            self.hold(&mut tx, &holds).await?
        };
        let how = tree_release(outcome == JobOutcome::Completed);
        job.worker
            .custody
            .release_rows(&mut tx, self.subject, self.tree, how)
            .await?;
        job.worker.leases.release_in(&mut tx, job.lease()).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    /// The round's usage, its `retained_source` proof and the terminal acceptance; the
    /// adoption and the request complete.
    async fn accept(&self, conn: &mut PgConnection, e: &Evidence) -> Result<(), JobError> {
        let job = self.job;
        let adoption = self.adoption.id.simple().to_string();
        let round = journal::entry(
            &mut *conn,
            job.lease(),
            "finishing_round",
            &json!({
                "adoption_id": adoption,
                "worker": job.worker.settings.worker_id,
                "usage": {
                    "commands": 0,
                    "wall_ms": self.started.elapsed().as_millis() as u64,
                    "files_written": [],
                    "retained_source": {
                        "source_digest": self.measured,
                        "verified_source_digest": self.adoption.source_digest,
                        "tree_digest": e.current_tree,
                        "completion_receipt": e.completion_receipt,
                    },
                },
            }),
        )
        .await?;
        journal::entry(
            &mut *conn,
            job.lease(),
            "terminal_acceptance",
            &json!({
                "adoption_id": adoption,
                "finishing_round": round,
                "final_result_receipt": e.acceptance_receipt,
                "report_digest": e.accepted_digest,
                "completion_receipt": e.completion_receipt,
                "command_receipts": e.result_ids.iter().map(|id| id.simple().to_string()).collect::<Vec<_>>(),
                "operator": e.operator.map(|id| id.simple().to_string()),
                "source_digest": self.measured,
                "tree_digest": e.current_tree,
            }),
        )
        .await?;
        let event = AdoptionEvent::Complete;
        handoff::adoption_transition(&mut *conn, self.adoption.id, event, None).await?;
        let event = RequestEvent::Complete;
        request::transition(&mut *conn, job.request_id(), event, None, None).await?;
        Ok(())
    }

    /// The holds, journaled; the adoption fails and a person decides on the request.
    async fn hold(&self, conn: &mut PgConnection, holds: &[Hold]) -> Result<JobOutcome, JobError> {
        let job = self.job;
        journal::entry(
            &mut *conn,
            job.lease(),
            "finishing_round_held",
            &json!({
                "adoption_id": self.adoption.id.simple().to_string(),
                "worker": job.worker.settings.worker_id,
                "holds": holds,
                "source_digest": self.measured,
            }),
        )
        .await?;
        let reasons: Vec<String> = holds
            .iter()
            .map(|h| format!("{}: {}", name(h.reason), h.message))
            .collect();
        let reason = format!("finishing_round_held: {}", reasons.join("; "));
        let event = AdoptionEvent::Fail;
        handoff::adoption_transition(&mut *conn, self.adoption.id, event, Some(&reason)).await?;
        let event = RequestEvent::Reconcile;
        request::transition(&mut *conn, job.request_id(), event, Some(&reason), None).await?;
        tracing::warn!(%reason, "the finishing round is held");
        Ok(JobOutcome::NeedsReconciliation(reason))
    }
}

/// The wire name of a hold reason.
fn name(reason: HoldReason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Everything the terminal acceptance checks, read in its transaction.
async fn read_evidence(
    conn: &mut PgConnection,
    job: &Job,
    adoption_id: Uuid,
) -> Result<Evidence, sqlx::Error> {
    sqlx::query_as(&format!(
        "WITH accepted AS (
              SELECT id, body->>'report_digest' AS digest FROM journal_entries
               WHERE request_id = $1 AND entry_kind = 'final_report_accepted'
               ORDER BY id DESC LIMIT 1),
              completion AS (
              SELECT id, body->>'tree_digest' AS tree FROM journal_entries
               WHERE request_id = $1 AND entry_kind = 'verification_completion'
                 AND body->>'adoption_id' = $4 AND body->>'passed' = 'true'
               ORDER BY id DESC LIMIT 1)
         SELECT (SELECT id FROM accepted) AS acceptance_receipt,
                (SELECT digest FROM accepted) AS accepted_digest,
                EXISTS (SELECT 1 FROM report_consumptions c WHERE c.request_id = $1) AS consumed,
                f.outcome, f.followup_kind, f.body,
                (SELECT id FROM completion) AS completion_receipt,
                (SELECT tree FROM completion) AS verified_tree,
                COALESCE((SELECT array_agg(v.id ORDER BY v.command_index) FROM verification_results v
                           WHERE v.adoption_id = $2), '{{}}') AS result_ids,
                (SELECT count(*) FROM verification_results v WHERE v.adoption_id = $2 AND v.passed)
                  AS passed_results,
                COALESCE(t.id IS NOT NULL AND t.revoked_at IS NULL, FALSE) AS authority_current,
                t.id AS operator,
                {current} AS current_tree,
                EXISTS (SELECT 1 FROM source_profiles p WHERE p.profile_digest = $5 AND p.status = 'qualified')
                  AS runtime_qualified
           FROM execution_requests e JOIN runs r ON r.id = e.run_id
           LEFT JOIN final_reports f ON f.request_id = e.id
           LEFT JOIN api_tokens t ON t.id = r.operator_id
          WHERE e.id = $1",
        current = lineage::current_tree_sql("r.work_context_id", "$3"),
    ))
    .bind(job.request_id())
    .bind(adoption_id)
    .bind(lineage::empty_tree_digest())
    .bind(adoption_id.simple().to_string())
    .bind(qualification::current())
    .fetch_one(conn)
    .await
}

#[cfg(test)]
mod tests;
