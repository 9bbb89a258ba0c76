//! Verification handoffs as a test drives them: a run whose report asks for checks, an
//! adoption of its candidate, and the adoption read back once the run has ended.

use crate::cluster::Cluster;
use serde_json::{json, Value};
use std::time::Duration;

pub const LONG: Duration = Duration::from_secs(90);

/// The tree a run leaves: its source file and its lock file.
pub struct Tree<'a> {
    pub source: &'a str,
    pub lock: &'a str,
    pub mode: &'a str,
}

/// A run that writes `tree`, then reports that it needs verification by `checks`.
pub fn verified_run(tree: &Tree, checks: Value) -> Value {
    let write = "printf '%s' \"$SOURCE\" > src.txt; printf '%s' \"$LOCK\" > Cargo.lock";
    let env = json!({"SOURCE": tree.source, "LOCK": tree.lock, "MODE": tree.mode});
    verified_script(write, env, checks)
}

/// A run whose first step runs `script` (with `env`) to build its tree, then reports
/// that it needs verification by `checks`; a check's `"env": "__ENV__"` becomes
/// `{"MODE": env.MODE}`.
pub fn verified_script(script: &str, env: Value, checks: Value) -> Value {
    let report = json!({
        "outcome": "complete",
        "followup_kind": "verification",
        "verification": {"commands": checks}
    });
    let checks_env = json!({"MODE": env["MODE"]});
    let report = report
        .to_string()
        .replace("\"__ENV__\"", &checks_env.to_string());
    json!({
        "agent": "e2e",
        "steps": [
            {"key": "write", "argv": ["sh", "-c", script], "env": env},
            {"key": "report", "argv": ["sh", "-c", "printf '%s' \"$REPORT\" > \"$CAIRN_REPORT_FILE\""],
             "env": {"REPORT": report}}
        ],
        "budgets": {"max_commands": 20, "max_wall_seconds": 3600},
        "max_attempts": 3
    })
}

/// A source-build check that appends to a file outside its scratch directory, so every
/// real execution leaves a line.
pub fn build_check(effects: &str) -> Value {
    json!({
        "argv": ["sh", "-c", format!("test -f src.txt && echo \"built $MODE\" >> {effects} && echo ok")],
        "purpose": "source_build",
        "env": "__ENV__"
    })
}

/// Reads the run's current candidate and adopts it under `adoption_id`, declaring the
/// offered reusable checks at `reuse` (positions in `reusable_build_candidates`).
pub fn adopt(cluster: &Cluster, run_id: &str, adoption_id: &str, reuse: &[usize]) {
    let base = format!("/api/v1/runs/{run_id}/verification-handoffs");
    let (status, candidate) = cluster.call("GET", &format!("{base}/candidates?agent=e2e"), None);
    assert_eq!(status, 200, "{candidate}");
    assert_eq!(candidate["admission"], "READY", "{candidate}");
    let selected: Vec<Value> = reuse
        .iter()
        .map(|i| {
            json!({
                "command_digest": candidate["reusable_build_candidates"][*i]["command_digest"],
                "purpose": "source_build",
                "independent_of_time_and_external_state": true
            })
        })
        .collect();
    let body = adoption(&candidate, adoption_id, selected);
    let (status, receipt) = cluster.call("POST", &format!("{base}/adoptions"), Some(&body));
    assert_eq!(status, 201, "{receipt}");
}

/// The adoption of `candidate` by the e2e agent, declaring `selected` reusable.
pub fn adoption(candidate: &Value, adoption_id: &str, selected: Vec<Value>) -> Value {
    json!({
        "request_id": adoption_id,
        "agent": "e2e",
        "pending_request_digest": candidate["pending_request_digest"],
        "source_digest": candidate["source_digest"],
        "commands_digest": candidate["commands_digest"],
        "policy_digest": candidate["policy_digest"],
        "provider_digest": candidate["provider_digest"],
        "reusable_build_checks": selected
    })
}

/// Runs `spec` to its handoff, adopts it declaring check 1 reusable, and returns the
/// run id and the adoption once it has ended.
pub fn verify(cluster: &Cluster, spec: &Value, adoption_id: &str) -> (String, Value) {
    let (run_id, _) = cluster.submit(spec);
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    adopt(cluster, &run_id, adoption_id, &[0]);
    cluster.wait_for_state(&run_id, &["completed", "failed"], LONG);
    let base = format!("/api/v1/runs/{run_id}/verification-handoffs");
    let (status, adoption) = cluster.call("GET", &format!("{base}/adoptions/{adoption_id}"), None);
    assert_eq!(status, 200, "{adoption}");
    (run_id, adoption)
}

pub fn entries<'a>(journal: &'a Value, kind: &str) -> Vec<&'a Value> {
    journal["entries"]
        .as_array()
        .map(|e| e.iter().filter(|e| e["entry_kind"] == kind).collect())
        .unwrap_or_default()
}

pub fn id(n: u32) -> String {
    format!("{n:032x}")
}
