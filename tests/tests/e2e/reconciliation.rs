//! A run that needs a person, and the operator's decisions: a step killed mid-way is
//! marked done (the run completes without running it again), marked not done (it runs
//! again, once), or the run is failed; decisions are idempotent under their ids, fenced,
//! and one wins when two race.

use cairn_e2e::cluster::{Cluster, ADMIN};
use cairn_e2e::interrupted::{die_after_second_intent, kill_during_second_step};
use cairn_e2e::{request, ServiceLock};
use serde_json::{json, Value};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

fn count(lines: &[String], line: &str) -> usize {
    lines.iter().filter(|l| l.as_str() == line).count()
}

/// The run of [`kill_during_second_step`] (s2 not idempotent), stopped at s2 by its
/// successor: `needs_reconciliation`. Returns the cluster and the run's id.
async fn killed_mid_step(label: &str) -> (Cluster, String) {
    let (cluster, run_id, _) = kill_during_second_step(label, false, 3).await;
    let run = cluster.wait_for_state(&run_id, &["needs_reconciliation"], LONG);
    assert_eq!(run["reconciliation_step"], "s2", "{run}");
    (cluster, run_id)
}

fn decide(cluster: &Cluster, run: &str, id: &str, body: &Value) -> (u16, Value) {
    let path = format!("/api/v1/runs/{run}/reconciliation/decisions/{id}");
    cluster.call("POST", &path, Some(body))
}

fn new_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

#[tokio::test]
async fn a_step_killed_mid_way_marked_done_through_the_cli_completes_the_run() {
    let _services = ServiceLock::shared().await;
    let (cluster, run_id) = killed_mid_step("decide-done").await;
    let before = cluster.run(&run_id);

    let (status, view) = cluster.call(
        "GET",
        &format!("/api/v1/runs/{run_id}/reconciliation"),
        None,
    );
    assert_eq!(status, 200, "{view}");
    let steps = view["uncertain_steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 1, "{view}");
    assert_eq!(steps[0]["step_key"], "s2");
    assert_eq!(steps[0]["standing"], "unknown_outcome");
    let shown = cluster
        .cairnctl()
        .args(["reconciliation", "show", &run_id])
        .output()
        .expect("cairnctl");
    let shown_text = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{shown_text}");
    assert!(
        shown_text.contains("unknown_outcome") && shown_text.contains("half of s2"),
        "{shown_text}"
    );

    let decided = cluster
        .cairnctl()
        .env("CAIRN_STATE_DIR", cluster.path("actions"))
        .args([
            "--json",
            "reconciliation",
            "decide",
            &run_id,
            "s2",
            "mark-done",
        ])
        .args(["--reason", "the deploy in s2 is live: checked by hand"])
        .output()
        .expect("cairnctl");
    assert!(
        decided.status.success(),
        "{}",
        String::from_utf8_lossy(&decided.stderr)
    );
    let decision: Value = serde_json::from_slice(&decided.stdout).expect("JSON");
    assert_eq!(decision["outcome"], "queued", "{decision}");
    assert_eq!(decision["decided_by_name"], "bootstrap-admin", "{decision}");

    let run = cluster.wait_for_state(&run_id, &["completed"], LONG);
    let lines = cluster.lines("effects");
    assert_eq!(count(&lines, "s1"), 1, "{lines:?}");
    assert_eq!(
        count(&lines, "s2-start"),
        1,
        "a step marked done never runs again: {lines:?}"
    );
    assert_eq!(count(&lines, "s3"), 1, "{lines:?}");
    assert_eq!(run["attempt"], before["attempt"], "the same attempt: {run}");
    assert!(
        run["usage"]["commands"].as_i64() > before["usage"]["commands"].as_i64(),
        "budgets are not reset: {before} then {run}"
    );
    let journal = cluster.journal(&run_id);
    let s2 = journal["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["step_key"] == "s2");
    let s2 = s2.expect("s2 in the journal");
    assert_eq!(s2["status"], "marked_done", "{journal}");
    assert_eq!(s2["decision_id"], decision["decision_id"], "{journal}");
    let entry = journal["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["entry_kind"] == "reconciliation_decision")
        .unwrap_or_else(|| panic!("no decision entry: {journal}"));
    assert_eq!(
        entry["body"]["decided_by_name"], "bootstrap-admin",
        "{entry}"
    );
    assert_eq!(
        entry["body"]["reason"],
        "the deploy in s2 is live: checked by hand"
    );
    assert_eq!(entry["body"]["decision"], "mark_done");
}

#[tokio::test]
async fn two_racing_decisions_one_wins_and_mark_not_done_runs_the_step_once_more() {
    let _services = ServiceLock::shared().await;
    let (cluster, run_id) = killed_mid_step("decide-race").await;
    let body = json!({"step_key": "s2", "decision": "mark_not_done", "reason": "s2 wrote nothing outside"});

    // Refused input changes nothing.
    for (bad, field) in [
        (
            json!({"step_key": "s2", "decision": "mark_not_done", "reason": "  "}),
            "reason",
        ),
        (
            json!({"step_key": "s2", "decision": "maybe", "reason": "x"}),
            "",
        ),
        (
            json!({"step_key": "s1", "decision": "mark_done", "reason": "x"}),
            "step_key",
        ),
    ] {
        let (status, error) = decide(&cluster, &run_id, &new_id(), &bad);
        assert!(
            matches!(status, 400 | 409 | 422),
            "{bad} -> {status} {error}"
        );
        if !field.is_empty() {
            assert_eq!(error["error"]["field"], field, "{error}");
        }
    }

    let ids = [new_id(), new_id()];
    let api = cluster.api;
    let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let racing: Vec<_> = ids
            .iter()
            .map(|id| {
                let (body, run_id) = (&body, &run_id);
                scope.spawn(move || {
                    let path = format!("/api/v1/runs/{run_id}/reconciliation/decisions/{id}");
                    let answer = request(api, "POST", &path, Some(ADMIN), Some(body)).expect("API");
                    (
                        answer.status,
                        serde_json::from_str(&answer.body).unwrap_or(Value::Null),
                    )
                })
            })
            .collect();
        racing
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .collect()
    });
    let mut statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    statuses.sort();
    assert_eq!(statuses, [201, 409], "{answers:?}");
    let winner = &ids[answers.iter().position(|a| a.0 == 201).expect("a winner")];
    let loser = answers.iter().find(|a| a.0 == 409).expect("a loser");
    assert!(
        matches!(
            loser.1["error"]["code"].as_str(),
            Some("not_awaiting_reconciliation" | "step_not_undecided")
        ),
        "{loser:?}"
    );

    // The same id and body answers the same receipt; another body under it is refused.
    let (status, again) = decide(&cluster, &run_id, winner, &body);
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["decision_id"], winner.as_str());
    let other = json!({"step_key": "s2", "decision": "fail_run", "reason": "changed my mind"});
    let (status, error) = decide(&cluster, &run_id, winner, &other);
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (409, Some("decision_id_conflict")),
        "{error}"
    );

    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let lines = cluster.lines("effects");
    assert_eq!(count(&lines, "s1"), 1, "{lines:?}");
    assert_eq!(
        count(&lines, "s2-start"),
        2,
        "s2 ran exactly once more: {lines:?}"
    );
    assert_eq!(count(&lines, "s2-end"), 1, "{lines:?}");
    assert_eq!(count(&lines, "s3"), 1, "{lines:?}");
    let (_, read) = cluster.call(
        "GET",
        &format!("/api/v1/runs/{run_id}/reconciliation/decisions/{winner}"),
        None,
    );
    assert_eq!(read["decision"], "mark_not_done", "{read}");
    let (status, late) = decide(&cluster, &run_id, &new_id(), &body);
    assert_eq!(
        (status, late["error"]["code"].as_str()),
        (409, Some("not_awaiting_reconciliation")),
        "{late}"
    );
}

#[tokio::test]
async fn fail_run_fails_a_run_that_needs_a_person() {
    let _services = ServiceLock::shared().await;
    let (cluster, run_id) = die_after_second_intent("decide-fail").await;
    cluster.wait_for_state(&run_id, &["needs_reconciliation"], LONG);
    let watch = || {
        let out = cluster
            .cairnctl()
            .args(["runs", "watch", &run_id])
            .output()
            .expect("cairnctl");
        out.status.code()
    };
    assert_eq!(
        watch(),
        Some(10),
        "watch exits 10 when a run needs a person"
    );
    let body =
        json!({"step_key": "s2", "decision": "fail_run", "reason": "s2 half-migrated the schema"});
    let (status, decision) = decide(&cluster, &run_id, &new_id(), &body);
    assert_eq!(status, 201, "{decision}");
    assert_eq!(decision["outcome"], "failed");
    let run = cluster.run(&run_id);
    assert_eq!(run["state"], "failed", "{run}");
    assert!(
        run["stop_reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("failed_by_operator")),
        "{run}"
    );
    assert_eq!(cluster.lines("effects"), ["s1"], "s2 never ran");
    assert_eq!(watch(), Some(8), "watch exits 8 when a run failed");
}
