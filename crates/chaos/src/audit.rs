//! The audit of a chaos run, from the database and from the steps' own side effects.

use crate::faults::Record;
use crate::load::{Admissions, STEPS};
use sqlx::PgPool;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use uuid::Uuid;

#[derive(Default)]
pub struct Findings {
    pub rows: Vec<(String, String)>,
    pub violations: Vec<String>,
}

impl Findings {
    fn row(&mut self, what: &str, value: impl ToString) {
        self.rows.push((what.to_string(), value.to_string()));
    }

    /// A count that must be zero.
    fn zero(&mut self, what: &str, count: usize, examples: &[String]) {
        self.row(what, count);
        if count > 0 {
            let shown: Vec<&str> = examples.iter().take(5).map(String::as_str).collect();
            self.violations
                .push(format!("{what}: {count} (e.g. {})", shown.join("; ")));
        }
    }

    pub fn print(&self) {
        let width = self.rows.iter().map(|(w, _)| w.len()).max().unwrap_or(0);
        for (what, value) in &self.rows {
            println!("| {what:<width$} | {value} |");
        }
    }
}

#[derive(sqlx::FromRow)]
struct Request {
    id: Uuid,
    idempotency_key: Option<String>,
    state: String,
    stop_reason: Option<String>,
}

pub async fn audit(
    pool: &PgPool,
    admissions: &Admissions,
    effects: &Path,
    record: &Record,
    takeover_bound: f64,
) -> anyhow::Result<Findings> {
    let mut f = Findings::default();
    let requests: Vec<Request> = sqlx::query_as(
        "SELECT e.id, r.idempotency_key, e.state, e.stop_reason
           FROM execution_requests e JOIN runs r ON r.id = e.run_id WHERE e.kind = 'run'",
    )
    .fetch_all(pool)
    .await?;
    // Keys are stored under their token's namespace: `<token id>:<key>`.
    let requests: Vec<Request> = requests
        .into_iter()
        .map(|mut r| {
            r.idempotency_key = r
                .idempotency_key
                .as_deref()
                .map(|k| k.split_once(':').map_or(k, |(_, key)| key).to_string());
            r
        })
        .collect();
    let by_key: BTreeMap<&str, &Request> = requests
        .iter()
        .filter_map(|r| r.idempotency_key.as_deref().map(|k| (k, r)))
        .collect();

    // Admissions: one run per key, whatever the retries.
    f.row("runs submitted (keys)", admissions.answers.len());
    f.row("runs admitted", requests.len());
    let duplicates: Vec<String> = admissions
        .answers
        .iter()
        .filter(|(_, ids)| ids.iter().collect::<BTreeSet<_>>().len() > 1)
        .map(|(k, ids)| format!("{k} answered {ids:?}"))
        .collect();
    f.zero(
        "duplicate admissions (a key answered with two runs)",
        duplicates.len(),
        &duplicates,
    );
    f.zero(
        "submissions never answered",
        admissions.unanswered.len(),
        &admissions.unanswered,
    );
    let missing: Vec<String> = admissions
        .answers
        .keys()
        .filter(|k| !by_key.contains_key(k.as_str()))
        .cloned()
        .collect();
    f.zero(
        "answered runs missing from the database",
        missing.len(),
        &missing,
    );

    end_states(&mut f, &requests, record);
    effects_and_receipts(&mut f, pool, &requests, effects).await?;
    stale_writes(&mut f, pool).await?;
    faults_and_takeovers(&mut f, record, takeover_bound);
    Ok(f)
}

/// How each request ended, and which went to a person without a fault of its worker.
fn end_states(f: &mut Findings, requests: &[Request], record: &Record) {
    // End states.
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests {
        *states.entry(r.state.clone()).or_default() += 1;
    }
    for (state, count) in &states {
        f.row(&format!("state {state}"), count);
    }
    let lost: Vec<String> = requests
        .iter()
        .filter(|r| {
            !matches!(
                r.state.as_str(),
                "completed" | "needs_reconciliation" | "stopped_at_checkpoint" | "failed"
            )
        })
        .map(|r| format!("{} {}", r.id, r.state))
        .collect();
    f.zero("lost runs (never ended)", lost.len(), &lost);
    let failed: Vec<String> = requests
        .iter()
        .filter(|r| r.state == "failed")
        .map(|r| format!("{} {:?}", r.id, r.stop_reason))
        .collect();
    f.zero("failed runs (every step succeeds)", failed.len(), &failed);
    // A person is needed only where a fault destroyed knowledge: a worker killed, stalled
    // past its lapse or drained while it held the request. A healed fault causes none.
    let mut causes: BTreeMap<String, usize> = BTreeMap::new();
    let mut unexplained = Vec::new();
    for r in requests.iter().filter(|r| {
        matches!(
            r.state.as_str(),
            "needs_reconciliation" | "stopped_at_checkpoint"
        )
    }) {
        let reason = r.stop_reason.clone().unwrap_or_default();
        let explained = record.touched.contains(&r.id);
        let cause = format!(
            "{} / {reason} / {}",
            r.state,
            if explained {
                "its worker was killed or stalled"
            } else {
                "no fault of its worker"
            }
        );
        *causes.entry(cause).or_default() += 1;
        if !explained {
            unexplained.push(format!("{} {} {reason}", r.id, r.state));
        }
    }
    for (cause, count) in &causes {
        f.row(cause, count);
    }
    f.zero(
        "sent to a person by a healed fault",
        unexplained.len(),
        &unexplained,
    );
}

/// The steps' effects against their receipts: no replay of a non-idempotent step, no
/// receipt without its effect nor such an effect without its receipt, and every tree
/// agreeing with the journal.
async fn effects_and_receipts(
    f: &mut Findings,
    pool: &PgPool,
    requests: &[Request],
    effects: &Path,
) -> anyhow::Result<()> {
    // The steps' own side: lines "<key> <step>" in the effects log.
    let text = std::fs::read_to_string(effects).unwrap_or_default();
    let mut ran: BTreeMap<(String, String), usize> = BTreeMap::new();
    for line in text.lines() {
        if let Some((key, step)) = line.split_once(' ') {
            *ran.entry((key.to_string(), step.to_string())).or_default() += 1;
        }
    }
    let replays: Vec<String> = ran
        .iter()
        .filter(|((_, step), n)| step == "s2" && **n > 1)
        .map(|((key, _), n)| format!("{key} s2 ran {n} times"))
        .collect();
    f.zero("non-idempotent replays", replays.len(), &replays);

    let receipts: Vec<(Uuid, String, Option<i32>, i64, String)> = sqlx::query_as(
        "SELECT request_id, step_key, exit_code, lease_epoch, stdout_tail FROM journal_receipts",
    )
    .fetch_all(pool)
    .await?;
    let key_of: BTreeMap<Uuid, &str> = requests
        .iter()
        .filter_map(|r| r.idempotency_key.as_deref().map(|k| (r.id, k)))
        .collect();
    let mut with_receipt = BTreeSet::new();
    let mut without_effect = Vec::new();
    for (request, step, exit, _, _) in &receipts {
        let Some(key) = key_of.get(request) else {
            continue;
        };
        with_receipt.insert((key.to_string(), step.clone()));
        if *exit == Some(0) && !ran.contains_key(&(key.to_string(), step.clone())) {
            without_effect.push(format!("{key} {step}"));
        }
    }
    f.zero(
        "receipts without an effect",
        without_effect.len(),
        &without_effect,
    );
    // A non-idempotent step that ran must have a receipt, unless its request went to a
    // person with its outcome unknown (that is the rule, not a loss).
    let reconciling: BTreeSet<&str> = requests
        .iter()
        .filter(|r| r.state == "needs_reconciliation")
        .filter_map(|r| r.idempotency_key.as_deref())
        .collect();
    let unreceipted: Vec<String> = ran
        .keys()
        .filter(|(key, step)| {
            step == "s2"
                && !with_receipt.contains(&(key.clone(), step.clone()))
                && !reconciling.contains(key.as_str())
        })
        .map(|(key, step)| format!("{key} {step}"))
        .collect();
    f.zero(
        "non-idempotent effects without a receipt",
        unreceipted.len(),
        &unreceipted,
    );

    trees_agree(f, &receipts);
    Ok(())
}

/// Stale writes: a receipt committed after a newer epoch had already started a step of
/// the same request.
async fn stale_writes(f: &mut Findings, pool: &PgPool) -> anyhow::Result<()> {
    // Stale writes: a receipt committed after a newer epoch had already started a step
    // of the same request. A receipt a person recorded (a reconciliation decision) is
    // no worker's write.
    let stale: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT r.request_id, r.step_key FROM journal_receipts r
          WHERE r.decision_id IS NULL AND EXISTS (SELECT 1 FROM journal_intents i
                         WHERE i.request_id = r.request_id AND i.lease_epoch > r.lease_epoch
                           AND i.started_at < r.finished_at)
             OR r.decision_id IS NULL AND NOT EXISTS (SELECT 1 FROM journal_intents i
                             WHERE i.request_id = r.request_id AND i.step_key = r.step_key
                               AND i.lease_epoch = r.lease_epoch)",
    )
    .fetch_all(pool)
    .await?;
    let stale: Vec<String> = stale.iter().map(|(r, s)| format!("{r} {s}")).collect();
    f.zero("stale writes accepted", stale.len(), &stale);
    Ok(())
}

/// The faults injected, and how fast their requests were taken over.
fn faults_and_takeovers(f: &mut Findings, record: &Record, takeover_bound: f64) {
    // Faults and takeovers.
    let mut injected: BTreeMap<&str, usize> = BTreeMap::new();
    for fault in &record.injected {
        *injected.entry(fault.name()).or_default() += 1;
    }
    let list: Vec<String> = injected.iter().map(|(n, c)| format!("{n} ×{c}")).collect();
    f.row("faults injected", list.join(", "));
    f.zero(
        "faults that could not be injected",
        record.errors.len(),
        &record.errors,
    );
    let mut takeovers: Vec<f64> = record
        .victims
        .iter()
        .flat_map(|v| v.takeovers.iter().copied())
        .collect();
    takeovers.sort_by(f64::total_cmp);
    if takeovers.is_empty() {
        f.row("takeovers", "none measured (no victim held a request)");
    } else {
        let p50 = takeovers[(takeovers.len() - 1) / 2];
        let max = takeovers[takeovers.len() - 1];
        f.row("takeovers measured", takeovers.len());
        f.row("takeover p50 / max", format!("{p50:.1} s / {max:.1} s"));
        let slow: Vec<String> = takeovers
            .iter()
            .filter(|t| **t > takeover_bound)
            .map(|t| format!("{t:.1} s"))
            .collect();
        f.zero(
            &format!("takeovers above {takeover_bound} s"),
            slow.len(),
            &slow,
        );
    }
    // Watched for 30 s after a kill, and for the stall after a SIGSTOP.
    let untaken: usize = record.victims.iter().map(|v| v.untaken).sum();
    f.zero(
        "requests of a killed or stalled worker not taken over within the watch",
        untaken,
        &[],
    );
}

/// Invariant 9: the last step prints the tree's trace; it must hold each step once, in
/// order, so every reused receipt stood on a tree with its effects.
fn trees_agree(f: &mut Findings, receipts: &[(Uuid, String, Option<i32>, i64, String)]) {
    let expected = STEPS.join("\n");
    let behind: Vec<String> = receipts
        .iter()
        .filter(|(_, step, exit, _, _)| step == "s3" && *exit == Some(0))
        .filter(|(_, _, _, _, tail)| tail.trim_end() != expected)
        .map(|(request, _, _, _, tail)| format!("{request}: {:?}", tail.trim_end()))
        .collect();
    f.zero(
        "trees disagreeing with the journal (invariant 9)",
        behind.len(),
        &behind,
    );
}
