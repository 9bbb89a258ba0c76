//! Verification reuse never says "passed on exactly this input" falsely: each way a
//! changed input once slipped past the scope, run end to end. Two runs of one agent
//! build a tree, the first verification passes, the second must run fresh (and fail,
//! as its check does on the changed tree) instead of reusing the first's result.

use cairn_e2e::cluster::{Cluster, Settings};
use cairn_e2e::handoff::{id, verified_script, verify, LONG};
use cairn_e2e::ServiceLock;
use nix::sys::signal::Signal;
use serde_json::{json, Value};

/// A source-build check (declared reusable by `verify`) running `script`.
fn check(script: &str) -> Value {
    json!({"argv": ["sh", "-c", script], "purpose": "source_build", "env": "__ENV__"})
}

/// Verifies a run built by `script` with `checks`; returns the run's final state and
/// the first check's result.
fn verified(cluster: &Cluster, script: &str, checks: Value, adoption: u32) -> (Value, Value) {
    let spec = verified_script(script, json!({"MODE": "m"}), checks);
    let (run_id, adoption) = verify(cluster, &spec, &id(adoption));
    (cluster.run(&run_id), adoption["results"][0].clone())
}

/// The first tree passes; the second, built by `changed`, must run fresh and fail.
fn passes_then_runs_fresh(cluster: &Cluster, original: &str, changed: &str, checks: Value) {
    let (run, first) = verified(cluster, original, checks.clone(), 1);
    assert_eq!(run["state"], "completed", "{run} {first}");
    assert_eq!(first["passed"], true, "{first}");
    let (run, second) = verified(cluster, changed, checks, 2);
    assert_ne!(
        second["display"], "Reused prior verified result",
        "a changed input reused a result: {second}"
    );
    assert_eq!(second["passed"], false, "run fresh, it fails: {second}");
    assert_eq!(run["state"], "failed", "{run}");
}

async fn cluster(label: &str) -> Cluster {
    Cluster::start(label, 1, Settings::default()).await
}

#[tokio::test]
async fn a_link_binds_what_it_resolves_to_even_in_an_ignored_directory() {
    let _services = ServiceLock::shared().await;
    let cluster = cluster("reuse-link").await;
    let write = |v: &str| {
        format!("printf 'ignored/\\n' > .gitignore; mkdir -p ignored; printf '{v}' > ignored/cfg; ln -sf ignored/cfg cfg")
    };
    let checks = json!([check("grep -q v1 cfg")]);
    passes_then_runs_fresh(&cluster, &write("v1"), &write("v2"), checks);
}

#[tokio::test]
async fn an_ignored_lock_file_is_bound() {
    let _services = ServiceLock::shared().await;
    let cluster = cluster("reuse-lock").await;
    let write = |v: &str| format!("printf 'Cargo.lock\\n' > .gitignore; printf '{v}' > Cargo.lock");
    let checks = json!([check("grep -q v1 Cargo.lock")]);
    passes_then_runs_fresh(&cluster, &write("v1"), &write("v2"), checks);
}

#[tokio::test]
async fn permission_bits_and_empty_directories_are_bound() {
    let _services = ServiceLock::shared().await;
    let cluster = cluster("reuse-modes").await;
    let write = |mode: &str, dirs: &str| {
        format!("printf data > data.txt; chmod {mode} data.txt; mkdir -p {dirs}")
    };
    let checks = json!([check(
        "test \"$(stat -c %a data.txt)\" = 644 && test -d migrations"
    )]);
    let original = write("644", "migrations");
    passes_then_runs_fresh(
        &cluster,
        &original,
        &write("000", "migrations"),
        checks.clone(),
    );
    // A removed empty directory: the third run runs fresh too.
    let (run, third) = verified(&cluster, &write("644", "other"), checks, 3);
    assert_ne!(third["display"], "Reused prior verified result", "{third}");
    assert_eq!(
        (third["passed"].as_bool(), run["state"].as_str()),
        (Some(false), Some("failed"))
    );
}

#[tokio::test]
async fn a_name_that_is_not_utf8_is_bound_by_its_bytes() {
    let _services = ServiceLock::shared().await;
    let cluster = cluster("reuse-bytes").await;
    // A checkpoint cannot hold such a name (the capture reports it as excluded), so the
    // restored tree differs from the frozen source and nothing passes on it.
    let write = "printf v1 > \"$(printf 'n\\377')\"";
    let checks = json!([check("grep -q v1 \"$(printf 'n\\377')\"")]);
    let (run, first) = verified(&cluster, write, checks, 1);
    assert_ne!(first["passed"], true, "{first}");
    let reason = run["stop_reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("verification_source_changed"), "{run}");
}

#[tokio::test]
async fn a_checks_time_limit_is_part_of_what_it_is() {
    let _services = ServiceLock::shared().await;
    let cluster = cluster("reuse-timeout").await;
    let write = "printf x > src.txt";
    let slow = |timeout: u32| {
        json!([{"argv": ["sh", "-c", "sleep 2; echo ok"], "purpose": "source_build",
                "env": "__ENV__", "timeout_seconds": timeout}])
    };
    let (run, first) = verified(&cluster, write, slow(30), 1);
    assert_eq!(
        (run["state"].as_str(), first["passed"].as_bool()),
        (Some("completed"), Some(true)),
        "{first}"
    );
    let (run, second) = verified(&cluster, write, slow(1), 2);
    assert_ne!(
        second["display"], "Reused prior verified result",
        "{second}"
    );
    assert_eq!(second["passed"], false, "it times out run fresh: {second}");
    assert_eq!(run["state"], "failed");
}

/// The late-change rule: the stop reason a run fails with.
fn late_change(run: &Value) -> bool {
    run["stop_reason"]
        .as_str()
        .is_some_and(|r| r.starts_with("verification_late_change"))
}

#[tokio::test]
async fn edits_a_later_check_undoes_are_still_a_change() {
    let _services = ServiceLock::shared().await;
    let cluster = cluster("reuse-undone").await;
    let write = "printf bad > a.txt";
    let checks = json!([
        {"argv": ["sh", "-c", "printf good > a.txt"], "purpose": "test"},
        check("grep -q good a.txt"),
        {"argv": ["sh", "-c", "printf bad > a.txt"], "purpose": "test"}
    ]);
    let (run, _) = verified(&cluster, write, checks, 1);
    assert_eq!(run["state"], "failed", "{run}");
    assert!(late_change(&run), "{run}");
    // The same (bad) tree again: nothing passed on it, so nothing is reused.
    let checks = json!([check("grep -q good a.txt")]);
    let (run, second) = verified(&cluster, write, checks, 2);
    assert_ne!(
        second["display"], "Reused prior verified result",
        "{second}"
    );
    assert_eq!(run["state"], "failed", "{run}");
}

#[tokio::test]
async fn a_fifo_a_check_makes_never_wedges_the_request() {
    let _services = ServiceLock::shared().await;
    let cluster = cluster("reuse-fifo").await;
    let (run, _) = verified(
        &cluster,
        "printf x > src.txt",
        json!([check("mkfifo pipe")]),
        1,
    );
    assert_eq!(run["state"], "failed", "{run}");
    assert!(late_change(&run), "a FIFO is a change of the source: {run}");
}

#[tokio::test]
async fn a_late_change_survives_a_retry_of_the_verification() {
    let _services = ServiceLock::shared().await;
    let mut cluster = cluster("reuse-retry").await;
    let marker = cluster.path("second-check");
    let checks = json!([
        check("printf more >> a.txt"),
        {"argv": ["sh", "-c", format!("touch {marker}; sleep 5")], "purpose": "test"}
    ]);
    let spec = verified_script("printf base > a.txt", json!({"MODE": "m"}), checks);
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["awaiting_verification"], LONG);
    // A second worker takes the retry if the first dies.
    cluster.add_worker();
    cairn_e2e::handoff::adopt(&cluster, &run_id, &id(1), &[0]);
    // If the second check ever starts, its worker dies, and the retry restores the tree
    // without check 1's append: the late change must not be lost with it.
    let ended = ["completed", "failed"];
    cluster.wait_until("the second check or the end", LONG, || {
        std::path::Path::new(&marker).exists()
            || ended.contains(&cluster.run(&run_id)["state"].as_str().unwrap_or(""))
    });
    if std::path::Path::new(&marker).exists() {
        let holder = cluster
            .holder(&request_id)
            .await
            .expect("a worker holds it");
        let victim = cluster.worker_index(&holder);
        cluster.workers[victim].process.signal(Signal::SIGKILL);
    }
    let run = cluster.wait_for_state(&run_id, &ended, LONG);
    assert_eq!(run["state"], "failed", "{run}");
    assert!(late_change(&run), "{run}");
    // A later run with the original source: check 1 stands for nothing.
    let checks = json!([check("printf more >> a.txt")]);
    let spec = verified_script("printf base > a.txt", json!({"MODE": "m"}), checks);
    let (_, adoption) = verify(&cluster, &spec, &id(2));
    assert_ne!(
        adoption["results"][0]["display"], "Reused prior verified result",
        "{adoption}"
    );
}
