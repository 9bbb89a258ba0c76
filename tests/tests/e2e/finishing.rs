//! The fresh worker round that finishes a verified run: after the approved checks pass,
//! a worker claims the same ticket again, runs nothing, proves the source unchanged
//! (`retained_source`, empty `files_written`) and makes the terminal acceptance; a lost
//! tree, a revoked operator or an unqualified runtime holds the run for a person instead.
//! Then the finished run's publication, held while a delivery hold stands.

use cairn_e2e::cluster::{Cluster, Settings, ADMIN};
use cairn_e2e::handoff::{adopt, build_check, entries, id, verified_run, verify, Tree, LONG};
use cairn_e2e::ServiceLock;
use serde_json::{json, Value};
use std::time::Duration;

const TREE: Tree = Tree {
    source: "fn main() {}",
    lock: "lock v1",
    mode: "a",
};

#[tokio::test]
async fn a_verified_run_is_finished_by_a_fresh_round_on_the_unchanged_source() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("finish", 1, Settings::default()).await;
    let effects = cluster.path("effects");
    let spec = verified_run(&TREE, json!([build_check(&effects)]));
    let (run_id, adoption) = verify(&cluster, &spec, &id(1));
    let run = cluster.run(&run_id);
    assert_eq!(run["state"], "completed", "{run}\n{}", cluster.logs());
    assert_eq!(adoption["status"], "completed", "{adoption}");
    assert_eq!(adoption["handoff_state"], "passed");

    let journal = cluster.journal(&run_id);
    let rounds = entries(&journal, "finishing_round");
    assert_eq!(rounds.len(), 1, "{journal}");
    let usage = &rounds[0]["body"]["usage"];
    assert_eq!(usage["files_written"], json!([]), "{usage}");
    assert_eq!(usage["commands"], 0);
    let proof = &usage["retained_source"];
    assert!(proof["source_digest"].is_string(), "{proof}");
    assert_eq!(proof["source_digest"], proof["verified_source_digest"]);
    let completion = entries(&journal, "verification_completion");
    assert_eq!(proof["completion_receipt"], completion[0]["id"]);
    assert_eq!(proof["tree_digest"], completion[0]["body"]["tree_digest"]);

    let acceptance = entries(&journal, "terminal_acceptance");
    assert_eq!(acceptance.len(), 1, "{journal}");
    let body = &acceptance[0]["body"];
    let accepted = entries(&journal, "final_report_accepted");
    assert_eq!(body["final_result_receipt"], accepted[0]["id"]);
    assert_eq!(body["report_digest"], accepted[0]["body"]["report_digest"]);
    assert_eq!(body["completion_receipt"], completion[0]["id"]);
    assert_eq!(body["finishing_round"], rounds[0]["id"]);
    assert_eq!(body["command_receipts"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        run["usage"]["commands"], 3,
        "two steps and one check: the round ran nothing"
    );
    assert_eq!(cluster.lines("effects"), ["built a"], "the check ran once");
}

/// The journey of a run through seed 003, as a reader follows it: the worker answers and
/// loses its lease before accepting its own report; the operator accepts the saved
/// result once; the report asks for verification; an administrator approves two checks,
/// declared reusable; they pass; a fresh round finishes on the unchanged source. A
/// consumed response offered again is held, and nothing is charged twice.
#[tokio::test]
async fn the_journey_from_a_lost_lease_to_a_finished_run() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("journey", 0, Settings::default()).await;
    let effects = cluster.path("effects");
    let test_check = json!({
        "argv": ["sh", "-c", format!("test -f Cargo.lock && echo \"tested $MODE\" >> {effects} && echo ok")],
        "purpose": "test",
        "env": "__ENV__"
    });
    let spec = verified_run(&TREE, json!([build_check(&effects), test_check]));

    // 1. The worker writes its tree and its final report, then dies before accepting it.
    cluster.add_faulty_worker("w1", "before_completion");
    let (run_id, request_id) = cluster.submit(&spec);
    let run = cluster.wait_for_state(&run_id, &["needs_reconciliation"], LONG);
    assert!(cluster.workers[0].process.wait_exit(LONG).is_some());
    let (reason, _) = cluster.stop_reason(&request_id).await;
    assert_eq!(reason.as_deref(), Some("final_report_unaccepted"), "{run}");
    assert_eq!(run["usage"]["commands"], 2, "{run}");

    // A delivery hold, set before the acceptance: accepting the report does not clear it.
    let hold = format!("/api/v1/runs/{run_id}/delivery-hold");
    let (status, held) = cluster.call("PUT", &hold, Some(&json!({"reason": "legal review"})));
    assert_eq!((status, &held["held"]), (200, &json!(true)), "{held}");

    // 2. The operator reviews the saved result and accepts it, once.
    let (status, _) = cluster.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&json!({"enabled": true, "allow_final_outcome_continuation": true})),
    );
    assert_eq!(status, 200);
    let base = format!("/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}");
    let (_, candidate) = cluster.call("GET", &format!("{base}/candidate"), None);
    assert_eq!(candidate["admission"], "READY", "{candidate}");
    assert_eq!(candidate["retained_outcome"]["outcome"], "complete");
    assert_eq!(
        candidate["retained_outcome"]["followup_kind"],
        "verification"
    );
    let body = json!({
        "version": 1, "candidate_digest": candidate["candidate_digest"], "valid_for_seconds": 60,
        "acknowledge_already_consumed_final_output": true, "acknowledge_no_completed_effect_replay": true,
        "acknowledge_same_request_attempt_and_budgets": true, "acknowledge_finite_ownership_lease": true
    });
    let action = id(100);
    let (status, receipt) = cluster.call("POST", &format!("{base}/actions/{action}"), Some(&body));
    assert_eq!(status, 201, "{receipt}");
    cluster.add_worker();
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    let (_, read) = cluster.call("GET", &format!("{base}/status"), None);
    assert_eq!(
        (read["status"].as_str(), read["action_id"].as_str()),
        (Some("completed"), Some(action.as_str()))
    );
    // The consumed response, offered again: held, and a repeat of the action reads the
    // same receipt instead of admitting anything.
    let (_, again) = cluster.call("GET", &format!("{base}/candidate"), None);
    assert_eq!(again["admission"], "HELD", "{again}");
    assert!(held_by(&again, "already_consumed"), "{again}");
    assert!(
        held_by(&again, "not_recoverable"),
        "awaiting verification: {again}"
    );
    let (status, repeat) = cluster.call("POST", &format!("{base}/actions/{action}"), Some(&body));
    assert_eq!(
        (status, &repeat["action_id"]),
        (201, &json!(action)),
        "{repeat}"
    );

    // 3. An administrator approves the frozen checks, both declared reusable.
    adopt(&cluster, &run_id, &id(101), &[0, 1]);
    let run = cluster.wait_for_state(
        &run_id,
        &["completed", "failed", "needs_reconciliation"],
        LONG,
    );
    assert_eq!(run["state"], "completed", "{run}\n{}", cluster.logs());

    // 4. The checks ran once each; the fresh round ran nothing and proved the source.
    assert_eq!(cluster.lines("effects"), ["built a", "tested a"]);
    assert_eq!(
        run["usage"]["commands"], 4,
        "two steps and two checks, each charged once"
    );
    let journal = cluster.journal(&run_id);
    let accepted = entries(&journal, "final_report_accepted");
    assert_eq!(accepted.len(), 1, "accepted once: {journal}");
    let round = entries(&journal, "finishing_round");
    assert_eq!(round.len(), 1, "{journal}");
    assert_eq!(round[0]["body"]["usage"]["files_written"], json!([]));
    let proof = &round[0]["body"]["usage"]["retained_source"];
    assert_eq!(proof["source_digest"], proof["verified_source_digest"]);
    let acceptance = entries(&journal, "terminal_acceptance");
    assert_eq!(
        acceptance[0]["body"]["final_result_receipt"],
        accepted[0]["id"]
    );
    assert_eq!(
        acceptance[0]["body"]["command_receipts"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    let consumed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM report_consumptions WHERE request_id = $1::uuid")
            .bind(&request_id)
            .fetch_one(&cluster.pool)
            .await
            .expect("count");
    assert_eq!(consumed, 1, "the response was consumed once");
    assert_eq!(run["attempt"], 1, "no new attempt");

    // 5. Publication: held while the delivery hold stands, then delivered as a patch.
    let publications = format!("/api/v1/runs/{run_id}/publications");
    let publish =
        json!({"version": 1, "request_id": id(102), "acknowledge_command_receipts_read": true});
    let (status, refused) = cluster.call("POST", &publications, Some(&publish));
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "delivery_held");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("legal review"),
        "{refused}"
    );
    let (status, cleared) = cluster.call("DELETE", &hold, None);
    assert_eq!(
        (status, &cleared["held"]),
        (200, &json!(false)),
        "{cleared}"
    );
    let (status, queued) = cluster.call("POST", &publications, Some(&publish));
    assert_eq!(status, 201, "{queued}");
    let status_path = format!("{publications}/{}", id(102));
    let mut published = Value::Null;
    cluster.wait_until("the publication to be delivered", LONG, || {
        published = cluster.call("GET", &status_path, None).1;
        published["state"] != "queued" && published["state"] != "executing"
    });
    assert_eq!(
        published["state"],
        "completed",
        "{published}\n{}",
        cluster.logs()
    );
    let delivery = &published["delivery"];
    assert_eq!(delivery["base"], "empty", "{delivery}");
    assert_eq!(
        delivery["files_changed"], 2,
        "src.txt and Cargo.lock: {delivery}"
    );
    let key = delivery["artifact_key"].as_str().expect("key");
    let patch = std::fs::read(cluster.dir.join("artifacts").join(key)).expect("the artifact");
    assert_eq!(delivery["bytes"], patch.len(), "{delivery}");
    let sha = cairn_common::digest::sha256_hex(&patch);
    assert_eq!(delivery["sha256"], sha.as_str());
    let text = String::from_utf8(patch).expect("text");
    assert!(
        text.contains("diff --git a/src.txt b/src.txt\nnew file mode 100644\n--- /dev/null\n+++ b/src.txt\n@@ -0,0 +1 @@\n+fn main() {}\n\\ No newline at end of file\n"),
        "{text}"
    );
    // The publication is an execution request of the run, beside its own; the receipt
    // is journaled; nothing of the run ran again.
    let (_, requests) = cluster.call(
        "GET",
        &format!("/api/v1/runs/{run_id}/execution-requests"),
        None,
    );
    let kinds: Vec<&str> = requests["execution_requests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["run", "publication"], "{requests}");
    let journal = cluster.journal(&run_id);
    assert_eq!(entries(&journal, "delivery_receipt").len(), 1, "{journal}");
    assert_eq!(cluster.lines("effects"), ["built a", "tested a"]);
    assert_eq!(cluster.run(&run_id)["usage"]["commands"], 4);
    // The same id and input read the same publication; other input is refused.
    let (status, again) = cluster.call("POST", &publications, Some(&publish));
    assert_eq!(
        (status, &again["state"]),
        (201, &json!("completed")),
        "{again}"
    );
    let other = json!({"version": 1, "request_id": id(102), "acknowledge_command_receipts_read": true, "extra": 1});
    let (status, _) = cluster.call("POST", &publications, Some(&other));
    assert_eq!(status, 400, "unknown fields are refused");
}

/// `cairnctl` with `args` against the cluster, in `state` (its saved actions); its
/// stdout, after checking it succeeded.
fn ctl(cluster: &Cluster, state: &std::path::Path, args: &[&str]) -> String {
    let out = cluster
        .cairnctl()
        .env("CAIRN_STATE_DIR", state)
        .args(args)
        .output()
        .expect("cairnctl");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "cairnctl {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn ctl_json(cluster: &Cluster, state: &std::path::Path, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ctl(cluster, state, &all)).expect("JSON")
}

/// The same journey as `docs/CONCEPTS.md`'s tour walks it, with `cairnctl` only.
#[tokio::test]
async fn the_journey_with_cairnctl() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("journey-ctl", 0, Settings::default()).await;
    let effects = cluster.path("effects");
    let state = cluster.dir.join("actions");
    let spec = verified_run(&TREE, json!([build_check(&effects)]));
    let run_file = cluster.dir.join("run.json");
    std::fs::write(&run_file, spec.to_string()).expect("run file");
    cluster.add_faulty_worker("w1", "before_completion");

    let run = ctl_json(
        &cluster,
        &state,
        &["runs", "submit", run_file.to_str().expect("path")],
    );
    let run_id = run["run_id"].as_str().expect("run").to_string();
    let request = run["request_id"].as_str().expect("request").to_string();
    cluster.wait_for_state(&run_id, &["needs_reconciliation"], LONG);
    let shown = ctl(&cluster, &state, &["runs", "show", &run_id]);
    assert!(shown.contains("final_report_unaccepted"), "{shown}");
    ctl(
        &cluster,
        &state,
        &[
            "policy",
            "set",
            "--enabled",
            "true",
            "--allow-final-outcome-continuation",
            "true",
        ],
    );
    let candidate = ctl_json(
        &cluster,
        &state,
        &[
            "final-outcome-continuations",
            "candidate",
            &run_id,
            &request,
        ],
    );
    assert_eq!(candidate["admission"], "READY", "{candidate}");
    // The body is written from the current candidate, every acknowledgement set.
    let body = cluster.dir.join("accept.json");
    let template = ctl(
        &cluster,
        &state,
        &[
            "final-outcome-continuations",
            "candidate",
            &run_id,
            &request,
            "--template",
        ],
    );
    let document: Value = serde_json::from_str(&template).expect("template");
    assert_eq!(document["candidate_digest"], candidate["candidate_digest"]);
    assert_eq!(document["acknowledge_already_consumed_final_output"], true);
    std::fs::write(&body, template).expect("body");
    let action = ctl(&cluster, &state, &["new-id"]).trim().to_string();
    let path = body.to_str().expect("path");
    ctl(
        &cluster,
        &state,
        &[
            "final-outcome-continuations",
            "request",
            &run_id,
            &request,
            &action,
            path,
        ],
    );
    cluster.add_worker();
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    let status = ctl_json(
        &cluster,
        &state,
        &["final-outcome-continuations", "status", &run_id, &request],
    );
    assert_eq!(status["status"], "completed", "{status}");

    let template = ctl(
        &cluster,
        &state,
        &[
            "verification",
            "candidates",
            &run_id,
            "--agent",
            "e2e",
            "--template",
            "--reuse",
            "1",
        ],
    );
    let adoption_file = cluster.dir.join("adoption.json");
    std::fs::write(&adoption_file, &template).expect("adoption");
    let adoption: Value = serde_json::from_str(&template).expect("template");
    let adoption_id = adoption["request_id"].as_str().expect("id").to_string();
    ctl(
        &cluster,
        &state,
        &[
            "verification",
            "adopt",
            &run_id,
            adoption_file.to_str().expect("path"),
        ],
    );
    let ended = cluster.wait_for_state(
        &run_id,
        &["completed", "failed", "needs_reconciliation"],
        LONG,
    );
    assert_eq!(ended["state"], "completed", "{ended}");
    let verified = ctl_json(
        &cluster,
        &state,
        &["verification", "status", &run_id, &adoption_id],
    );
    assert_eq!(
        (
            verified["status"].as_str(),
            verified["handoff_state"].as_str()
        ),
        (Some("completed"), Some("passed")),
        "{verified}"
    );
    let journal = ctl_json(&cluster, &state, &["runs", "journal", &run_id]);
    assert_eq!(entries(&journal, "finishing_round").len(), 1, "{journal}");
    assert_eq!(
        entries(&journal, "terminal_acceptance").len(),
        1,
        "{journal}"
    );

    // Publication: a hold refuses it (exit 4, a conflict), released it goes through.
    ctl(
        &cluster,
        &state,
        &["publication", "hold", &run_id, "--reason", "release freeze"],
    );
    let publication = id(200);
    let args = [
        "publication",
        "request",
        &run_id,
        "--request-id",
        &publication,
        "--receipts-read",
    ];
    let refused = cluster.cairnctl().args(args).output().expect("cairnctl");
    assert_eq!(refused.status.code(), Some(4), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("release freeze"),
        "{refused:?}"
    );
    ctl(&cluster, &state, &["publication", "release", &run_id]);
    ctl(&cluster, &state, &args);
    let mut delivered = Value::Null;
    cluster.wait_until("the delivery", LONG, || {
        delivered = ctl_json(
            &cluster,
            &state,
            &["publication", "status", &run_id, &publication],
        );
        delivered["state"] == "completed" || delivered["state"] == "failed"
    });
    assert_eq!(delivered["state"], "completed", "{delivered}");
    assert!(delivered["delivery"]["sha256"].is_string(), "{delivered}");
}

fn held_by(candidate: &Value, reason: &str) -> bool {
    candidate["holds"]
        .as_array()
        .is_some_and(|holds| holds.iter().any(|h| h["reason"] == reason))
}

/// Runs `spec` (submitted with `token`) up to its passed checks on a worker that kills
/// itself right after letting the request go, so that no round has run yet. Returns
/// the run's and request's ids.
fn checks_passed_then_stopped(
    cluster: &mut Cluster,
    spec: &Value,
    token: &str,
) -> (String, String) {
    let worker = cluster.workers.len();
    cluster.add_faulty_worker(&format!("w{}", worker + 1), "after_checks_passed");
    let response = cairn_e2e::request(cluster.api, "POST", "/api/v1/runs", Some(token), Some(spec))
        .expect("submit");
    assert_eq!(response.status, 201, "{}", response.body);
    let created = response.json();
    let run_id = created["run_id"].as_str().expect("run id").to_string();
    let request_id = created["request_id"]
        .as_str()
        .expect("request id")
        .to_string();
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    adopt(cluster, &run_id, &id(worker as u32 + 1), &[]);
    let exit = cluster.workers[worker].process.wait_exit(LONG);
    assert!(exit.is_some(), "the worker stopped after the checks passed");
    let journal = cluster.journal(&run_id);
    assert_eq!(entries(&journal, "verification_completion").len(), 1);
    assert!(entries(&journal, "finishing_round").is_empty(), "{journal}");
    assert_eq!(cluster.run(&run_id)["state"], "queued", "the round waits");
    (run_id, request_id)
}

/// Corrupts the manifest of the run's lineage head in the store, so that no restore of
/// it passes its integrity check.
async fn corrupt_head(cluster: &Cluster, run_id: &str) {
    let head: uuid::Uuid = sqlx::query_scalar(
        "SELECT h.head_id FROM lineage_heads h JOIN runs r ON r.work_context_id = h.work_context_id
          WHERE r.id = $1::uuid",
    )
    .bind(run_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("the head");
    let manifest = cluster
        .dir
        .join("artifacts/manifests")
        .join(format!("{}.zst", head.simple()));
    std::fs::write(&manifest, b"garbage").expect("corrupt the manifest");
}

/// The hold a held round recorded, by reason.
fn held_reasons(cluster: &Cluster, run_id: &str) -> Vec<String> {
    let journal = cluster.journal(run_id);
    let held = entries(&journal, "finishing_round_held");
    assert_eq!(held.len(), 1, "{journal}");
    assert!(entries(&journal, "terminal_acceptance").is_empty());
    held[0]["body"]["holds"]
        .as_array()
        .map(|holds| {
            holds
                .iter()
                .filter_map(|h| h["reason"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_finishing_round_on_a_lost_tree_for_a_revoked_operator_or_an_unqualified_runtime_is_held()
{
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("finish-held", 0, Settings::default()).await;
    let effects = cluster.path("effects");
    let spec = verified_run(&TREE, json!([build_check(&effects)]));

    // 1. The verified checkpoint is corrupted in the store before the round: the round
    //    restores another tree, and holds.
    let (run_id, request_id) = checks_passed_then_stopped(&mut cluster, &spec, ADMIN);
    corrupt_head(&cluster, &run_id).await;
    cluster.add_worker();
    let run = cluster.wait_for_state(&run_id, &["needs_reconciliation", "completed"], LONG);
    assert_eq!(run["state"], "needs_reconciliation", "{run}");
    let reasons = held_reasons(&cluster, &run_id);
    assert!(
        reasons.contains(&"changed_source".to_string()),
        "{reasons:?}"
    );
    let (reason, _) = cluster.stop_reason(&request_id).await;
    assert!(
        reason
            .as_deref()
            .unwrap_or("")
            .starts_with("finishing_round_held: "),
        "{reason:?}"
    );
    assert_eq!(run["usage"]["commands"], 3, "nothing ran again");
    let adoption = verification_status(&cluster, &run_id, 1);
    assert_eq!(adoption["status"], "failed", "{adoption}");
    assert_eq!(
        adoption["handoff_state"], "passed",
        "the checks' verdict stands"
    );

    // 2. The operator who submitted the run is revoked before the round. The worker
    //    that held the first round goes first, so the next run meets the faulty one.
    let last = cluster.workers.len() - 1;
    cluster.workers[last]
        .process
        .signal(nix::sys::signal::Signal::SIGTERM);
    assert!(cluster.workers[last].process.wait_exit(LONG).is_some());
    let (status, operator) = cluster.call(
        "POST",
        "/api/v1/tokens",
        Some(&json!({"name": "finisher", "role": "operator"})),
    );
    assert_eq!(status, 201, "{operator}");
    let token = operator["token"].as_str().expect("token").to_string();
    let (run_id, _) = checks_passed_then_stopped(&mut cluster, &spec, &token);
    let token_id = operator["token_id"].as_str().expect("token id");
    let (status, revoked) =
        cluster.call("POST", &format!("/api/v1/tokens/{token_id}/revoke"), None);
    assert_eq!(status, 200, "{revoked}");
    cluster.add_worker();
    let run = cluster.wait_for_state(&run_id, &["needs_reconciliation", "completed"], LONG);
    assert_eq!(run["state"], "needs_reconciliation", "{run}");
    assert_eq!(held_reasons(&cluster, &run_id), ["revoked_access"]);

    // 3. The implementation's source profile is revoked before the round: the runtime
    //    is no longer qualified.
    let last = cluster.workers.len() - 1;
    cluster.workers[last]
        .process
        .signal(nix::sys::signal::Signal::SIGTERM);
    assert!(cluster.workers[last].process.wait_exit(LONG).is_some());
    let (third, _) = checks_passed_then_stopped(&mut cluster, &spec, ADMIN);
    let (_, view) = cluster.call("GET", "/api/v1/qualification", None);
    let profile = view["current"]["profile_digest"].as_str().expect("profile");
    let path = format!("/api/v1/qualification/profiles/{profile}");
    let revoke = json!({"qualified": false, "note": "found wanting"});
    let (status, revoked) = cluster.call("PUT", &path, Some(&revoke));
    assert_eq!(status, 200, "{revoked}");
    cluster.add_worker();
    let held = cluster.wait_for_state(&third, &["needs_reconciliation", "completed"], LONG);
    assert_eq!(held["state"], "needs_reconciliation", "{held}");
    assert_eq!(
        held_reasons(&cluster, &third),
        ["incompatible_qualification"]
    );

    // A held run stays held: no other worker finishes it later.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(cluster.run(&run_id)["state"], "needs_reconciliation");
}

fn verification_status(cluster: &Cluster, run_id: &str, n: u32) -> Value {
    let path = format!(
        "/api/v1/runs/{run_id}/verification-handoffs/adoptions/{}",
        id(n)
    );
    let (status, adoption) = cluster.call("GET", &path, None);
    assert_eq!(status, 200, "{adoption}");
    adoption
}

/// The journey's faults, stage by stage, each ending the way its documented reason says,
/// with nothing charged twice: the verified tree lost after the acceptance (the checks
/// never run on another source), a failing check (no round, no publication), and a
/// cancel while the verification waits (publication held: not completed).
#[tokio::test]
async fn each_stage_of_the_journey_ends_on_its_fault_with_nothing_charged_twice() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("journey-faults", 1, Settings::default()).await;
    let effects = cluster.path("effects");

    // The tree the report froze is lost before the checks: they never run on another.
    let spec = verified_run(&TREE, json!([build_check(&effects)]));
    let (run_id, _) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    corrupt_head(&cluster, &run_id).await;
    adopt(&cluster, &run_id, &id(1), &[]);
    let run = cluster.wait_for_state(&run_id, &["failed", "completed"], LONG);
    assert_eq!(run["state"], "failed", "{run}");
    let reason = run["stop_reason"].as_str().unwrap_or("");
    assert!(reason.contains("verification_source_changed"), "{run}");
    assert!(
        cluster.lines("effects").is_empty(),
        "no check ran on another source"
    );
    assert_eq!(run["usage"]["commands"], 2, "the two steps only: {run}");

    // A failing check: the verification fails, and no round runs.
    let failing = json!([{"argv": ["sh", "-c", "exit 7"], "purpose": "test"}]);
    let (run_id, _) = cluster.submit(&verified_run(&TREE, failing));
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    adopt(&cluster, &run_id, &id(2), &[]);
    let run = cluster.wait_for_state(&run_id, &["failed", "completed"], LONG);
    assert_eq!(run["state"], "failed", "{run}");
    assert!(
        run["stop_reason"]
            .as_str()
            .unwrap_or("")
            .contains("check 1 exited with status 7"),
        "{run}"
    );
    let journal = cluster.journal(&run_id);
    assert!(entries(&journal, "finishing_round").is_empty(), "{journal}");
    assert_eq!(run["usage"]["commands"], 3, "two steps and the check, once");
    let publications = format!("/api/v1/runs/{run_id}/publications");
    let publish =
        json!({"version": 1, "request_id": id(3), "acknowledge_command_receipts_read": true});
    let (status, refused) = cluster.call("POST", &publications, Some(&publish));
    assert_eq!(
        (status, &refused["error"]["code"]),
        (409, &json!("delivery_held")),
        "{refused}"
    );

    // A cancel while the verification waits: cancelled, and nothing to publish.
    let (run_id, _) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    let (status, cancelled) = cluster.call("POST", &format!("/api/v1/runs/{run_id}/cancel"), None);
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cluster.run(&run_id)["state"], "cancelled");
    let publications = format!("/api/v1/runs/{run_id}/publications");
    let publish =
        json!({"version": 1, "request_id": id(4), "acknowledge_command_receipts_read": true});
    let (status, refused) = cluster.call("POST", &publications, Some(&publish));
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("cancelled, not completed"),
        "{refused}"
    );
}
