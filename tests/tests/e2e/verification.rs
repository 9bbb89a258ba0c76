//! Verification handoffs end to end: a run's report freezes checks, an operator adopts
//! them, a worker runs them confined on the same ticket, and a later verification reuses
//! a passed check only while source, lock file, environment and runner are unchanged.

use cairn_e2e::cluster::{Cluster, Settings};
use cairn_e2e::handoff::{
    adopt, adoption, build_check, entries, id, verified_run, verify, Tree, LONG,
};
use cairn_e2e::ServiceLock;
use serde_json::{json, Value};
use std::time::Duration;

#[tokio::test]
async fn a_passed_check_is_reused_only_while_its_whole_scope_is_unchanged() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("verify", 1, Settings::default()).await;
    let effects = cluster.path("effects");
    let original = Tree {
        source: "fn main() {}",
        lock: "lock v1",
        mode: "a",
    };

    // 1. First verification: the check runs, confined, and passes.
    let spec = verified_run(&original, json!([build_check(&effects)]));
    let (first_run, first) = verify(&cluster, &spec, &id(1));
    assert_eq!(cluster.run(&first_run)["state"], "completed", "{first}");
    assert_eq!(first["status"], "completed");
    assert_eq!(first["handoff_state"], "passed");
    let check = &first["results"][0];
    assert_eq!(check["display"], "Executed", "{first}");
    assert_eq!(check["passed"], true);
    assert_eq!(check["confined"], true);
    assert_eq!(check["reusable"], true);
    assert_eq!(check["fresh_reason"], "no_prior_result");
    assert_eq!(check["stdout_tail"], "ok\n");
    assert_eq!(cluster.lines("effects"), ["built a"]);
    let journal = cluster.journal(&first_run);
    assert_eq!(entries(&journal, "verification_build_scope").len(), 1);
    assert_eq!(entries(&journal, "verification_completion").len(), 1);
    assert!(entries(&journal, "verification_reuse_receipt").is_empty());
    assert_eq!(
        cluster.run(&first_run)["usage"]["commands"],
        3,
        "two steps and one check"
    );

    // 2. The same source, lock file and environment: reused, not executed again.
    let (second_run, second) = verify(&cluster, &spec, &id(2));
    assert_eq!(cluster.run(&second_run)["state"], "completed", "{second}");
    let reused = &second["results"][0];
    assert_eq!(
        reused["display"], "Reused prior verified result",
        "{second}"
    );
    assert_eq!(reused["reused"], true);
    assert_eq!(
        reused["started_at"], check["started_at"],
        "original timestamps"
    );
    assert_eq!(reused["finished_at"], check["finished_at"]);
    assert_eq!(reused["output_digest"], check["output_digest"]);
    assert_eq!(reused["stdout_tail"], "ok\n");
    assert_eq!(reused["attempt"], check["attempt"]);
    let first_request = cluster.run(&first_run)["request_id"].clone();
    assert_eq!(reused["source_execution"]["request_id"], first_request);
    assert_eq!(
        cluster.lines("effects"),
        ["built a"],
        "the check did not run again"
    );
    assert_eq!(
        cluster.run(&second_run)["usage"]["commands"],
        2,
        "a reused check is not another execution"
    );
    cluster.wait_until("the reused check to be counted", LONG, || {
        cluster.metric(0, "cairn_worker_verification_checks_reused_total") == 1.0
    });
    let journal = cluster.journal(&second_run);
    let intents = entries(&journal, "verification_reuse_intent");
    assert_eq!(intents.len(), 1, "{journal}");
    let completion = entries(&journal, "verification_completion");
    let receipts = entries(&journal, "verification_reuse_receipt");
    assert_eq!((completion.len(), receipts.len()), (1, 1), "{journal}");
    assert_eq!(receipts[0]["body"]["new_execution_count"], 0);
    assert_eq!(
        receipts[0]["body"]["completion_receipt"],
        completion[0]["id"]
    );
    assert_eq!(receipts[0]["body"]["checks"][0]["index"], 1);

    // 3. A changed environment variable: fresh.
    let env_changed = Tree {
        mode: "b",
        ..original
    };
    let spec = verified_run(&env_changed, json!([build_check(&effects)]));
    let (_, third) = verify(&cluster, &spec, &id(3));
    assert_eq!(third["results"][0]["reused"], false, "{third}");
    assert_eq!(third["results"][0]["fresh_reason"], "environment_changed");
    assert_eq!(cluster.lines("effects"), ["built a", "built b"]);

    // 4. One changed source file: fresh.
    let source_changed = Tree {
        source: "fn main() { run() }",
        ..original
    };
    let spec = verified_run(&source_changed, json!([build_check(&effects)]));
    let (_, fourth) = verify(&cluster, &spec, &id(4));
    assert_eq!(fourth["results"][0]["reused"], false, "{fourth}");
    assert_eq!(fourth["results"][0]["fresh_reason"], "source_changed");
    assert_eq!(cluster.lines("effects").len(), 3);

    // 5. A changed lock file: fresh.
    let lock_changed = Tree {
        lock: "lock v2",
        ..original
    };
    let spec = verified_run(&lock_changed, json!([build_check(&effects)]));
    let (_, fifth) = verify(&cluster, &spec, &id(5));
    assert_eq!(fifth["results"][0]["reused"], false, "{fifth}");
    assert_eq!(fifth["results"][0]["fresh_reason"], "dependencies_changed");
    assert_eq!(cluster.lines("effects").len(), 4);

    // 6. A late change: a second check rewrites the source while the first is planned
    //    for reuse. The completion and the reuse receipt roll back; the charge stays.
    let mutate = json!({
        "argv": ["sh", "-c", "echo changed >> src.txt"],
        "purpose": "test"
    });
    let spec = verified_run(&original, json!([build_check(&effects), mutate]));
    let (late_run, late) = verify(&cluster, &spec, &id(6));
    let run = cluster.run(&late_run);
    assert_eq!(run["state"], "failed", "{late}");
    assert!(
        run["stop_reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("verification_late_change")),
        "{run}"
    );
    assert_eq!(late["status"], "failed");
    let results = late["results"].as_array().expect("results");
    assert_eq!(
        results.len(),
        1,
        "only the fresh check's result stays: {late}"
    );
    assert_eq!(results[0]["index"], 2);
    assert_eq!(run["usage"]["commands"], 3, "the fresh check stays charged");
    let journal = cluster.journal(&late_run);
    assert_eq!(entries(&journal, "verification_reuse_intent").len(), 1);
    assert!(
        entries(&journal, "verification_completion").is_empty(),
        "{journal}"
    );
    assert!(entries(&journal, "verification_reuse_receipt").is_empty());
    assert_eq!(
        cluster.lines("effects").len(),
        4,
        "the planned reuse never ran"
    );
}

#[tokio::test]
async fn a_database_check_always_runs_fresh_and_an_invalid_report_opens_no_handoff() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("verify-db", 1, Settings::default()).await;
    let effects = cluster.path("effects");
    let tree = Tree {
        source: "x",
        lock: "l",
        mode: "a",
    };
    let database = json!({
        "argv": ["sh", "-c", format!("echo db >> {effects}")],
        "purpose": "database_integration"
    });
    let spec = verified_run(&tree, json!([build_check(&effects), database]));
    let (run_id, _) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    let base = format!("/api/v1/runs/{run_id}/verification-handoffs");
    let (_, candidate) = cluster.call("GET", &format!("{base}/candidates?agent=e2e"), None);
    let offered: Vec<&Value> = candidate["reusable_build_candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .collect();
    assert_eq!(offered.len(), 1, "{candidate}");
    let body = |selected: Vec<Value>| adoption(&candidate, &id(7), selected);
    let declared = body(vec![json!({
        "command_digest": candidate["commands"][1]["command_digest"],
        "purpose": "source_build",
        "independent_of_time_and_external_state": true
    })]);
    let (status, error) = cluster.call("POST", &format!("{base}/adoptions"), Some(&declared));
    assert_eq!(status, 422, "{error}");
    assert_eq!(error["error"]["code"], "not_reusable");
    assert_eq!(cluster.run(&run_id)["state"], "awaiting_verification");

    // Through cairnctl: a template from the candidate, adopted once, then its status.
    let template = cairnctl(
        &cluster,
        &[
            "verification",
            "candidates",
            &run_id,
            "--agent",
            "e2e",
            "--template",
        ],
    );
    assert_eq!(template.0, 0, "{}", template.1);
    let document: Value = serde_json::from_str(&template.1).expect("template");
    assert_eq!(document["reusable_build_checks"], json!([]));
    let request_id = document["request_id"]
        .as_str()
        .expect("request id")
        .to_string();
    let path = cluster.path("adoption.json");
    std::fs::write(&path, document.to_string()).expect("document");
    let adopted = cairnctl(&cluster, &["verification", "adopt", &run_id, &path]);
    assert_eq!(adopted.0, 0, "{}", adopted.1);
    let again = cairnctl(&cluster, &["verification", "adopt", &run_id, &path]);
    assert_eq!(
        again.0, 0,
        "the same document reads the same receipt: {}",
        again.1
    );
    let mut changed = document.clone();
    changed["reusable_build_checks"] = json!([{
        "command_digest": candidate["commands"][0]["command_digest"],
        "purpose": "source_build",
        "independent_of_time_and_external_state": true
    }]);
    std::fs::write(&path, changed.to_string()).expect("document");
    let conflict = cairnctl(&cluster, &["verification", "adopt", &run_id, &path]);
    assert_eq!(
        conflict.0, 4,
        "the saved request id keeps its input: {}",
        conflict.1
    );
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let status = cairnctl(
        &cluster,
        &["--json", "verification", "status", &run_id, &request_id],
    );
    assert_eq!(status.0, 0, "{}", status.1);
    let adoption: Value = serde_json::from_str(&status.1).expect("status");
    let results = adoption["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "{adoption}");
    assert!(results
        .iter()
        .all(|r| r["reusable"] == false && r["passed"] == true));
    assert_eq!(results[1]["fresh_reason"], "not_declared");
    assert_eq!(cluster.lines("effects"), ["built a", "db"]);

    // A report that asks for verification without valid checks fails its step.
    let broken = json!({
        "agent": "e2e",
        "steps": [{"key": "report", "argv": ["sh", "-c",
            "echo '{\"outcome\": \"complete\", \"followup_kind\": \"verification\"}' > \"$CAIRN_REPORT_FILE\""]}],
        "budgets": {"max_commands": 5, "max_wall_seconds": 600}
    });
    let (broken_id, _) = cluster.submit(&broken);
    let run = cluster.wait_for_state(&broken_id, &["failed"], LONG);
    assert!(
        run["stop_reason"]
            .as_str()
            .is_some_and(|r| r.contains("verification.commands")),
        "{run}"
    );
    let (status, error) = cluster.call(
        "GET",
        &format!("/api/v1/runs/{broken_id}/verification-handoffs/candidates?agent=e2e"),
        None,
    );
    assert_eq!(
        (status, &error["error"]["code"]),
        (409, &json!("no_pending_handoff"))
    );
}

/// Runs `cairnctl` against the cluster's scheduler: (exit code, stdout + stderr).
fn cairnctl(cluster: &Cluster, args: &[&str]) -> (i32, String) {
    let output = std::process::Command::new(cairn_e2e::binary("cairnctl"))
        .args(args)
        .env("CAIRN_SERVER", format!("http://{}", cluster.api))
        .env("CAIRN_TOKEN", cairn_e2e::cluster::ADMIN)
        .env("CAIRN_STATE_DIR", cluster.path("cairnctl-state"))
        .output()
        .expect("run cairnctl");
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        text.push_str(&String::from_utf8_lossy(&output.stderr));
    }
    (output.status.code().unwrap_or(-1), text)
}

#[tokio::test]
async fn a_worker_killed_mid_check_leaves_the_verification_to_another_without_rerunning_finished_checks(
) {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("verify-kill", 2, Settings::default()).await;
    let effects = cluster.path("effects");
    let tree = Tree {
        source: "y",
        lock: "l",
        mode: "a",
    };
    let first = json!({"argv": ["sh", "-c", format!("echo one >> {effects}")], "purpose": "test"});
    let slow = json!({
        "argv": ["sh", "-c", format!("echo start >> {effects}; sleep 4; echo two >> {effects}")],
        "purpose": "test",
        "timeout_seconds": 60
    });
    let spec = verified_run(&tree, json!([first, slow]));
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    let base = format!("/api/v1/runs/{run_id}/verification-handoffs");
    adopt(&cluster, &run_id, &id(9), &[]);
    cluster.wait_until("the slow check to start", LONG, || {
        cluster.lines("effects").contains(&"start".to_string())
    });
    let holder = cluster
        .holder(&request_id)
        .await
        .expect("a worker holds the verification");
    let victim = cluster.worker_index(&holder);
    cluster.workers[victim]
        .process
        .signal(nix::sys::signal::Signal::SIGKILL);

    let run = cluster.wait_for_state(&run_id, &["completed", "failed"], LONG);
    assert_eq!(run["state"], "completed", "{run}\n{}", cluster.logs());
    let lines = cluster.lines("effects");
    let count = |line: &str| lines.iter().filter(|l| *l == line).count();
    assert_eq!(
        count("one"),
        1,
        "a check with a result is not run again: {lines:?}"
    );
    assert_eq!(
        count("start"),
        2,
        "the interrupted check ran again: {lines:?}"
    );
    assert_eq!(count("two"), 1, "{lines:?}");
    let (_, adoption) = cluster.call("GET", &format!("{base}/adoptions/{}", id(9)), None);
    assert_eq!(adoption["status"], "completed", "{adoption}");
    assert_eq!(adoption["results"][0]["attempt"], 1);
    assert_eq!(adoption["results"][1]["attempt"], 2);
    assert_eq!(
        run["usage"]["commands"], 5,
        "two steps, and three check executions are all charged"
    );
}

#[tokio::test]
async fn a_draining_worker_hands_a_verification_back_on_the_same_attempt() {
    let _services = ServiceLock::shared().await;
    let settings = Settings {
        drain_seconds: 3,
        ..Settings::default()
    };
    let cluster = Cluster::start("verify-drain", 2, settings).await;
    let effects = cluster.path("effects");
    let tree = Tree {
        source: "z",
        lock: "l",
        mode: "a",
    };
    let slow = json!({
        "argv": ["sh", "-c", format!("echo start >> {effects}; sleep 6; echo done >> {effects}")],
        "purpose": "test",
        "timeout_seconds": 60
    });
    let spec = verified_run(&tree, json!([slow]));
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    let base = format!("/api/v1/runs/{run_id}/verification-handoffs");
    adopt(&cluster, &run_id, &id(10), &[]);
    cluster.wait_until("the check to start", LONG, || {
        cluster.lines("effects").contains(&"start".to_string())
    });
    let holder = cluster.holder(&request_id).await.expect("a holder");
    let draining = cluster.worker_index(&holder);
    cluster.workers[draining]
        .process
        .signal(nix::sys::signal::Signal::SIGTERM);

    let run = cluster.wait_for_state(&run_id, &["completed", "failed"], LONG);
    assert_eq!(run["state"], "completed", "{run}\n{}", cluster.logs());
    // The metric moves just after the completion commits: wait for it, do not race it.
    cluster.wait_until(
        "the other worker to count the job it finished",
        LONG,
        || cluster.metric(1 - draining, "cairn_worker_jobs_completed_total") >= 1.0,
    );
    let (_, adoption) = cluster.call("GET", &format!("{base}/adoptions/{}", id(10)), None);
    assert_eq!(
        adoption["results"][0]["attempt"], 1,
        "a hand-back keeps the attempt: {adoption}"
    );
    assert_eq!(cluster.lines("effects"), ["start", "start", "done"]);
}

#[tokio::test]
async fn a_database_check_with_an_unknown_outcome_is_not_run_again() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("verify-unknown", 1, Settings::default()).await;
    let effects = cluster.path("effects");
    let tree = Tree {
        source: "w",
        lock: "l",
        mode: "a",
    };
    let database = json!({
        "argv": ["sh", "-c", format!("echo migrate >> {effects}; sleep 30")],
        "purpose": "database_integration",
        "timeout_seconds": 120
    });
    let spec = verified_run(&tree, json!([database]));
    let (run_id, _) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    let base = format!("/api/v1/runs/{run_id}/verification-handoffs");
    adopt(&cluster, &run_id, &id(11), &[]);
    cluster.wait_until("the database check to start", LONG, || {
        cluster.lines("effects") == ["migrate"]
    });
    cluster.workers[0]
        .process
        .signal(nix::sys::signal::Signal::SIGKILL);
    cluster.add_worker();

    let run = cluster.wait_for_state(
        &run_id,
        &["needs_reconciliation", "completed", "failed"],
        LONG,
    );
    assert_eq!(
        run["state"],
        "needs_reconciliation",
        "{run}\n{}",
        cluster.logs()
    );
    assert_eq!(
        run["reconciliation_step"],
        format!("verify:{}:1", id(11)),
        "{run}"
    );
    assert_eq!(
        cluster.lines("effects"),
        ["migrate"],
        "not run a second time"
    );
    let (_, adoption) = cluster.call("GET", &format!("{base}/adoptions/{}", id(11)), None);
    assert_eq!(adoption["status"], "failed", "{adoption}");
    assert_eq!(adoption["handoff_state"], "failed");
}

#[tokio::test]
async fn a_paused_worker_past_its_lease_cannot_record_a_check() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("verify-sigstop", 2, Settings::default()).await;
    let effects = cluster.path("effects");
    let tree = Tree {
        source: "v",
        lock: "l",
        mode: "a",
    };
    let slow = json!({
        "argv": ["sh", "-c", format!("echo start >> {effects}; sleep 2; echo end >> {effects}")],
        "purpose": "test",
        "timeout_seconds": 60
    });
    let spec = verified_run(&tree, json!([slow]));
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    adopt(&cluster, &run_id, &id(12), &[]);
    cluster.wait_until("the check to start", LONG, || {
        cluster.lines("effects").contains(&"start".to_string())
    });
    let first = cluster.worker_index(&cluster.holder(&request_id).await.expect("holder"));
    cluster.workers[first]
        .process
        .signal(nix::sys::signal::Signal::SIGSTOP);
    // The lease lapses; the sweeper queues the adoption again and the other worker runs it.
    let run = cluster.wait_for_state(&run_id, &["completed", "failed"], LONG);
    assert_eq!(run["state"], "completed", "{run}\n{}", cluster.logs());
    cluster.workers[first]
        .process
        .signal(nix::sys::signal::Signal::SIGCONT);
    cluster.wait_until("the paused worker to find itself fenced", LONG, || {
        cluster.metric(first, "cairn_worker_stale_writes_rejected_total") >= 1.0
            && cluster.metric(first, "cairn_worker_self_fenced_total") >= 1.0
    });
    std::thread::sleep(Duration::from_millis(500));
    let base = format!("/api/v1/runs/{run_id}/verification-handoffs");
    let (_, adoption) = cluster.call("GET", &format!("{base}/adoptions/{}", id(12)), None);
    let results = adoption["results"].as_array().expect("results");
    assert_eq!(results.len(), 1, "{adoption}");
    assert_eq!(
        results[0]["attempt"], 2,
        "only the new owner's result is durable"
    );
    assert_eq!(adoption["status"], "completed");
    assert_eq!(cluster.run(&run_id)["state"], "completed");
}
