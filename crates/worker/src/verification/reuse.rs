//! Reuse: for each frozen check, whether an earlier passed, confined result of the same
//! command stands for it (every digest of its scope unchanged), and if not, why not.

use super::{scratch, Adoption};
use crate::error::JobError;
use crate::job::handle::Job;
use crate::scope::{self, Scope, SourceScope};
use cairn_common::journal;
use cairn_common::verification::{self as checks, CheckCommand};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use uuid::Uuid;

/// A passed, confined, reusable result an earlier verification recorded.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(super) struct Prior {
    pub(super) id: Uuid,
    pub(super) request_id: Option<Uuid>,
    pub(super) attempt: i32,
    pub(super) lease_epoch: i64,
    pub(super) step_key: Option<String>,
    pub(super) exit_code: Option<i32>,
    pub(super) output_digest: String,
    pub(super) stdout_tail: String,
    pub(super) stderr_tail: String,
    pub(super) wall_ms: i64,
    pub(super) scope_digest: String,
    pub(super) source_digest: String,
    pub(super) dependency_digest: String,
    pub(super) environment_digest: String,
    pub(super) runner_digest: String,
    pub(super) started_at: DateTime<Utc>,
    pub(super) finished_at: DateTime<Utc>,
    /// The completion receipt (journal entry) that accepted the original result.
    pub(super) accepted_by: Option<i64>,
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
pub(super) struct Plan<'a> {
    pub(super) index: usize,
    pub(super) check: &'a CheckCommand,
    pub(super) command_digest: String,
    pub(super) env: BTreeMap<String, String>,
    pub(super) scratch: PathBuf,
    pub(super) scope: Scope,
    /// Declared independent of time and external state, and of a reusable kind.
    pub(super) reusable: bool,
    pub(super) prior: Option<Prior>,
    pub(super) fresh_reason: Option<&'static str>,
}

impl Plan<'_> {
    pub(super) fn index_i32(&self) -> i32 {
        i32::try_from(self.index).unwrap_or(i32::MAX)
    }
}

const PRIOR_SELECT: &str = "SELECT r.id, r.request_id, r.attempt, r.lease_epoch, r.step_key, r.exit_code, r.output_digest,
        r.stdout_tail, r.stderr_tail, r.wall_ms, r.scope_digest, r.source_digest, r.dependency_digest,
        r.environment_digest, r.runner_digest, r.started_at, r.finished_at,
        (SELECT j.id FROM journal_entries j
          WHERE j.request_id = r.request_id AND j.entry_kind = 'verification_completion'
            AND j.body->>'adoption_id' = replace(r.adoption_id::text, '-', '')
          ORDER BY j.id DESC LIMIT 1) AS accepted_by
   FROM verification_results r
  WHERE r.command_digest = $1 AND r.agent = $2 AND r.repository IS NOT DISTINCT FROM $3
    AND r.passed AND r.confined AND r.reusable AND r.reused_from IS NULL
    -- In a verification that completed: its completion receipt stands (whatever its
    -- finishing round did later).
    AND EXISTS (SELECT 1 FROM journal_entries j
                 WHERE j.request_id = r.request_id AND j.entry_kind = 'verification_completion'
                   AND j.body->>'adoption_id' = replace(r.adoption_id::text, '-', ''))";

/// Decides, for each check, whether an earlier result can stand for it.
pub(super) async fn plan<'a>(
    job: &Job,
    adoption: &'a Adoption,
    source: &SourceScope,
    confined: bool,
    recorded: &[i32],
) -> Result<Vec<Plan<'a>>, JobError> {
    let runner = scope::runner_digest(
        confined,
        &job.worker.custody.settings.backend,
        job.worker.custody.settings.base_image.as_deref(),
    );
    let mut plans = Vec::with_capacity(adoption.commands.len());
    for (i, check) in adoption.commands.iter().enumerate() {
        let index = i + 1;
        let scratch =
            scratch::scratch_root(&job.worker.settings.workspaces_dir, job).join(index.to_string());
        let home = job.worker.isolation.home_path(&scratch);
        let env = scratch::check_env(check, &home);
        let scope = Scope {
            source_digest: source.source_digest.clone(),
            dependency_digest: source.dependency_digest.clone(),
            environment_digest: scope::environment_digest(&env, &home),
            runner_digest: runner.clone(),
        };
        let command_digest = checks::command_digest(check);
        let declared = adoption.declared.contains(&command_digest);
        // A link out of the tree binds what no digest covers: such a tree reuses
        // nothing, and its results stand for nothing later.
        let escaping = source.escaping_link.is_some();
        let reusable = declared && check.purpose.reuse_eligible() && !escaping;
        let already = recorded.contains(&i32::try_from(index).unwrap_or(i32::MAX));
        let (prior, fresh_reason) = if already {
            (None, None)
        } else if !declared {
            (None, Some("not_declared"))
        } else if !check.purpose.reuse_eligible() {
            (None, Some("never_reusable"))
        } else if escaping {
            (None, Some("link_leaves_tree"))
        } else if !confined {
            (None, Some("unconfined"))
        } else {
            find_prior(job, &command_digest, &scope).await?
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
    job: &Job,
    command_digest: &str,
    scope: &Scope,
) -> Result<(Option<Prior>, Option<&'static str>), JobError> {
    let exact: Option<Prior> = sqlx::query_as(&format!(
        "{PRIOR_SELECT} AND r.source_digest = $4 AND r.dependency_digest = $5
           AND r.environment_digest = $6 AND r.runner_digest = $7
         ORDER BY r.finished_at DESC LIMIT 1"
    ))
    .bind(command_digest)
    .bind(&job.claimed.agent)
    .bind(&job.claimed.repository)
    .bind(&scope.source_digest)
    .bind(&scope.dependency_digest)
    .bind(&scope.environment_digest)
    .bind(&scope.runner_digest)
    .fetch_optional(&job.worker.pool)
    .await?;
    if exact.is_some() {
        return Ok((exact, None));
    }
    let latest: Option<Prior> = sqlx::query_as(&format!(
        "{PRIOR_SELECT} ORDER BY r.finished_at DESC LIMIT 1"
    ))
    .bind(command_digest)
    .bind(&job.claimed.agent)
    .bind(&job.claimed.repository)
    .fetch_optional(&job.worker.pool)
    .await?;
    let reason = latest
        .and_then(|p| scope.changed_from(&p.scope()))
        .unwrap_or("no_prior_result");
    Ok((None, Some(reason)))
}

/// Journals which earlier results the checks will reuse, before anything runs.
pub(super) async fn journal_intent(
    job: &Job,
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
    let mut tx = job.begin().await?;
    journal::entry(
        &mut tx,
        job.lease(),
        "verification_reuse_intent",
        &json!({"adoption_id": adoption.id.simple().to_string(), "checks": referenced}),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
