//! Workspace custody end to end: checkpoints restored by successors, the fallback order,
//! holds that outlive failed or interrupted captures.

use cairn_e2e::cluster::{run_spec, Cluster, Settings};
use cairn_e2e::ServiceLock;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(90);

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args(args)
        .current_dir(dir)
        .status()
        .expect("git");
    assert!(status.success(), "git {args:?}");
}

/// A small upstream repository the runs clone.
fn upstream(cluster: &Cluster) -> String {
    let dir = cluster.dir.join("upstream");
    std::fs::create_dir_all(&dir).expect("dir");
    git(&dir, &["init", "--quiet", "-b", "main"]);
    git(&dir, &["config", "user.email", "t@example.com"]);
    git(&dir, &["config", "user.name", "t"]);
    std::fs::write(dir.join("README"), "upstream\n").expect("write");
    git(&dir, &["add", "."]);
    git(&dir, &["commit", "--quiet", "-m", "init"]);
    dir.to_string_lossy().into_owned()
}

fn sh(key: &str, script: String, idempotent: bool) -> Value {
    json!({"key": key, "argv": ["sh", "-c", script], "idempotent": idempotent, "timeout_seconds": 120})
}

/// A run of an upstream clone: s1 leaves a file, s2 (3 s) checks it is there and leaves
/// one of its own; marks in the cluster's `marks` file (`s1`, `s2-start`, `s2-saw-s1`,
/// and whatever `then` adds).
fn s1_then_s2(cluster: &Cluster, then: Option<Value>) -> Value {
    let repo = upstream(cluster);
    let marks = cluster.path("marks");
    let mut steps = vec![
        sh("s1", format!("echo from-s1 > made-by-s1; echo s1 >> {marks}"), false),
        sh("s2", format!("echo s2-start >> {marks}; sleep 3; test -f made-by-s1 && echo s2-saw-s1 >> {marks}; echo from-s2 > made-by-s2"), true),
    ];
    steps.extend(then);
    json!({
        "agent": "e2e", "repository": repo, "ref": "main", "steps": steps,
        "budgets": {"max_commands": 20, "max_wall_seconds": 600}, "max_attempts": 5
    })
}

async fn restores(cluster: &Cluster, request_id: &str) -> Vec<(String, String, Option<String>)> {
    sqlx::query_as("SELECT tier, outcome, reason FROM snapshot_restores WHERE request_id = $1::uuid ORDER BY created_at")
        .bind(request_id)
        .fetch_all(&cluster.pool)
        .await
        .expect("restores")
}

async fn head(cluster: &Cluster, run_id: &str) -> Option<uuid::Uuid> {
    sqlx::query_scalar("SELECT head_id FROM lineage_heads WHERE work_context_id = $1::uuid")
        .bind(run_id)
        .fetch_optional(&cluster.pool)
        .await
        .expect("head")
}

async fn kill_holder(cluster: &Cluster, request_id: &str) -> usize {
    let holder = cluster.worker_index(&cluster.holder(request_id).await.expect("holder"));
    cluster.workers[holder].process.signal(Signal::SIGKILL);
    holder
}

#[tokio::test]
async fn a_successor_restores_its_own_checkpoint_and_falls_back_in_order() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("ws-order", 1, Settings::default()).await;
    let marks = cluster.path("marks");
    let spec = s1_then_s2(
        &cluster,
        Some(sh("s3", format!("echo s3 >> {marks}; sleep 3"), true)),
    );
    // Another work context with checkpoints of its own runs first: never restored here.
    let (other_run, _) = cluster.submit(&run_spec(
        vec![sh("x", "echo other > other-file".into(), false)],
        1,
    ));
    cluster.wait_for_state(&other_run, &["completed"], LONG);

    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_until("s2 to start", LONG, || {
        cluster.lines("marks").contains(&"s2-start".to_string())
    });
    let first = restores(&cluster, &request_id).await;
    assert_eq!(
        first
            .iter()
            .map(|r| (r.0.as_str(), r.1.as_str()))
            .collect::<Vec<_>>(),
        [("cold", "succeeded")],
        "no held tree, no checkpoint of its own and no baseline yet: a cold clone"
    );
    let baselines: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM project_snapshots WHERE kind = 'baseline' AND status = 'ready'",
    )
    .fetch_one(&cluster.pool)
    .await
    .expect("baselines");
    assert_eq!(baselines, 1, "the clean clone published a baseline");
    let checkpoint_after_s1 = head(&cluster, &run_id).await.expect("s1 was checkpointed");

    // Kill the worker during s2: the successor restores s1's checkpoint.
    kill_holder(&cluster, &request_id).await;
    cluster.add_worker();
    cluster.wait_until("s3 to start", LONG, || {
        cluster.lines("marks").contains(&"s3".to_string())
    });
    let second = restores(&cluster, &request_id).await;
    assert!(
        second.contains(&("checkpoint".into(), "succeeded".into(), None)),
        "{second:?}"
    );
    assert!(
        cluster.lines("marks").contains(&"s2-saw-s1".to_string()),
        "the restored tree holds s1's work"
    );
    let context: Value =
        sqlx::query_scalar("SELECT resume_context FROM execution_requests WHERE id = $1::uuid")
            .bind(&request_id)
            .fetch_one(&cluster.pool)
            .await
            .expect("resume context");
    assert_eq!(context["restore_tier"], "checkpoint", "{context}");

    // Corrupt the current checkpoint, kill again: it is quarantined and the baseline used.
    // The baseline holds none of the journal's effects: s1 (which may not run twice) has
    // a receipt this tree lacks, so a person decides.
    let corrupted = head(&cluster, &run_id).await.expect("head");
    assert_ne!(corrupted, checkpoint_after_s1, "s2 appended a newer head");
    let manifest = cluster
        .dir
        .join("artifacts")
        .join("manifests")
        .join(format!("{}.zst", corrupted.simple()));
    std::fs::write(&manifest, b"garbage").expect("corrupt the manifest");
    kill_holder(&cluster, &request_id).await;
    cluster.add_worker();
    let run = cluster.wait_for_state(&run_id, &["needs_reconciliation"], LONG);
    assert_eq!(run["attempt"], 3);
    let third = restores(&cluster, &request_id).await;
    let tail: Vec<(&str, &str)> = third[third.len() - 2..]
        .iter()
        .map(|r| (r.0.as_str(), r.1.as_str()))
        .collect();
    assert_eq!(
        tail,
        [("checkpoint", "failed"), ("baseline", "succeeded")],
        "{third:?}"
    );
    let status: String = sqlx::query_scalar("SELECT status FROM project_snapshots WHERE id = $1")
        .bind(corrupted)
        .fetch_one(&cluster.pool)
        .await
        .expect("status");
    assert_eq!(status, "quarantined");
    let (reason, step) = cluster.stop_reason(&request_id).await;
    assert_eq!(
        (reason.as_deref(), step.as_deref()),
        (Some("tree_behind_journal"), Some("s1"))
    );
    // Not completed: the lineage stays current for whoever reconciles it.
    let retired: bool = sqlx::query_scalar(
        "SELECT retired_at IS NOT NULL FROM lineage_heads WHERE work_context_id = $1::uuid",
    )
    .bind(&run_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("lineage");
    assert!(!retired);
}

/// A capture that fails writes no receipt: the worker retries it, the hold keeps the
/// live tree, and a successor of the same task in the same directory adopts that tree.
#[tokio::test]
async fn a_failed_capture_keeps_the_hold_and_the_tree_for_the_same_task() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("ws-hold", 0, Settings::default()).await;
    let marks = cluster.path("marks");
    let done = cluster.path("s2-done");
    let artifacts = cluster.dir.join("artifacts");
    // s2 sabotages the store: its sandbox must see it, beside the shared directory.
    std::fs::create_dir_all(&artifacts).expect("artifacts");
    cluster.worker_env.push((
        "CAIRN_SANDBOX_READ_WRITE".into(),
        format!(
            "{},{}",
            artifacts.display(),
            cluster.path("").trim_end_matches('/')
        ),
    ));
    cluster.add_worker();
    let spec = run_spec(
        vec![
            sh("s1", format!("echo one > work.txt; echo s1 >> {marks}"), false),
            // s2 changes the tree, then sabotages the store so its checkpoint fails; run
            // again, it does nothing.
            sh("s2", format!("[ -e {done} ] || {{ echo two >> work.txt; rm -rf {0}/manifests && touch {0}/manifests; touch {done}; echo s2 >> {marks}; }}", artifacts.display()), true),
            sh("s3", format!("echo s3-start >> {marks}; grep -q two work.txt && echo saw-two >> {marks}"), true),
        ],
        3,
    );
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_until("s2's capture to fail", LONG, || {
        cluster.lines("marks").contains(&"s2".to_string())
    });
    let mut failed: i64 = 0;
    for _ in 0..200 {
        failed = sqlx::query_scalar("SELECT count(*) FROM project_snapshots WHERE status = 'failed' AND work_context_id = $1::uuid")
            .bind(&run_id)
            .fetch_one(&cluster.pool)
            .await
            .expect("failed");
        if failed >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(failed >= 1, "s2's capture failed");
    let holds: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM holds WHERE ended_at IS NULL AND run_id = $1::uuid",
    )
    .bind(&run_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("holds");
    assert_eq!(holds, 1, "the hold outlives the failed capture");
    let sequence: i64 =
        sqlx::query_scalar("SELECT sequence FROM lineage_heads WHERE work_context_id = $1::uuid")
            .bind(&run_id)
            .fetch_one(&cluster.pool)
            .await
            .expect("head");
    assert_eq!(sequence, 1, "the head is still s1's checkpoint");
    let receipts: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM journal_receipts WHERE request_id = $1::uuid AND step_key = 's2'",
    )
    .bind(&request_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("receipts");
    assert_eq!(receipts, 0, "no receipt without a tree holding its effects");
    // The worker's trees are on its own volume, mounted in its own mount namespace.
    let tree = PathBuf::from(format!("/proc/{}/root", cluster.workers[0].process.pid())).join(
        cluster
            .workspaces("w1")
            .join(request_id.replace('-', ""))
            .strip_prefix("/")
            .expect("absolute"),
    );
    assert_eq!(
        std::fs::read_to_string(tree.join("work.txt")).expect("live tree"),
        "one\ntwo\n"
    );
    assert!(
        !cluster.lines("marks").contains(&"s3-start".to_string()),
        "s3 waits for s2's checkpoint"
    );

    // The worker dies; restarted under the same name on the same directory, it adopts
    // the held tree of the same task rather than restoring the older checkpoint. The
    // store is repaired only after the kill, so no capture retry can succeed first.
    kill_holder(&cluster, &request_id).await;
    cluster.workers[0].process.wait_exit(Duration::from_secs(5));
    std::fs::rename(
        artifacts.join("manifests"),
        artifacts.join("manifests.broken"),
    )
    .expect("repair store");
    std::fs::create_dir_all(artifacts.join("manifests")).expect("repair store");
    cluster.add_worker_named("w1");
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let tiers = restores(&cluster, &request_id).await;
    assert!(
        tiers.contains(&("adopt".into(), "succeeded".into(), None)),
        "{tiers:?}"
    );
    assert!(
        cluster.lines("marks").contains(&"saw-two".to_string()),
        "the adopted tree had s2's uncaptured work"
    );
}

/// A worker killed in the middle of s2's capture (at the `during_capture` fault point,
/// not by a kill racing the capture) leaves s1's checkpoint as the head, s2's capture
/// uncommitted and the hold written before it.
#[tokio::test]
async fn a_worker_killed_during_capture_leaves_the_hold_and_the_previous_head() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("ws-kill", 0, Settings::default()).await;
    let marks = cluster.path("marks");
    let spec = run_spec(
        vec![
            sh("s1", format!("echo s1 >> {marks}"), false),
            // s2 changes the tree, so its step is captured.
            sh(
                "s2",
                format!("echo two > s2.txt; echo s2 >> {marks}"),
                false,
            ),
            sh("s3", format!("echo s3 >> {marks}"), false),
        ],
        1,
    );
    // s1's capture is the first to pass the point, s2's the second.
    cluster.add_faulty_worker("w1", "during_capture@2");
    let (run_id, _) = cluster.submit(&spec);
    if cluster.workers[0].process.wait_exit(LONG).is_none() {
        panic!(
            "never killed itself during s2's capture\n{}",
            cluster.logs()
        );
    }
    let s1_head = head(&cluster, &run_id).await.expect("s1's checkpoint");
    let (head_status, head_step): (String, Option<String>) = sqlx::query_as(
        "SELECT s.status, e.step_key FROM project_snapshots s
           LEFT JOIN journal_receipts e ON e.snapshot_id = s.id WHERE s.id = $1",
    )
    .bind(s1_head)
    .fetch_one(&cluster.pool)
    .await
    .expect("the head");
    assert_eq!(
        (head_status.as_str(), head_step.as_deref()),
        ("ready", Some("s1")),
        "the previous head is intact"
    );
    let in_flight: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT id FROM project_snapshots WHERE work_context_id = $1::uuid AND status = 'uploading'",
    )
    .bind(&run_id)
    .fetch_all(&cluster.pool)
    .await
    .expect("captures in flight");
    assert_eq!(in_flight.len(), 1, "s2's capture was under way");
    let (holds, capturing): (i64, bool) = sqlx::query_as(
        "SELECT count(*), bool_or(capture_in_progress) FROM holds WHERE ended_at IS NULL AND run_id = $1::uuid",
    )
    .bind(&run_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("holds");
    assert_eq!(
        (holds, capturing),
        (1, true),
        "the hold written before the capture stays"
    );
    assert_eq!(cluster.lines("marks"), ["s1", "s2"]);
}

/// Workers with their own artifacts directories (as on separate hosts) share checkpoints
/// through the configured snapshot store: the successor restores from it, and nothing of
/// the snapshots lands in a worker's own directory.
#[tokio::test]
async fn workers_share_checkpoints_through_the_configured_snapshot_store() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("ws-store", 0, Settings::default()).await;
    let shared = cluster.dir.join("shared-snapshots");
    let shared_url = format!("file://{}", shared.display());
    let own = |n: usize| {
        [
            ("CAIRN_SNAPSHOT_STORE_URL".to_string(), shared_url.clone()),
            (
                "CAIRN_ARTIFACTS_URL".to_string(),
                cluster.path(&format!("artifacts-w{n}")),
            ),
            (
                "CAIRN_WORKSPACES_DIR".to_string(),
                cluster.path(&format!("workspaces-w{n}")),
            ),
        ]
    };
    let (first_env, second_env) = (own(1).to_vec(), own(2).to_vec());
    cluster.worker_env = first_env;
    cluster.add_worker();
    let spec = s1_then_s2(&cluster, None);
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_until("s2 to start", LONG, || {
        cluster.lines("marks").contains(&"s2-start".to_string())
    });
    assert!(
        head(&cluster, &run_id).await.is_some(),
        "s1 was checkpointed"
    );
    kill_holder(&cluster, &request_id).await;
    cluster.worker_env = second_env;
    cluster.add_worker();
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let tiers = restores(&cluster, &request_id).await;
    assert!(
        tiers.contains(&("checkpoint".into(), "succeeded".into(), None)),
        "{tiers:?}"
    );
    assert!(cluster.lines("marks").contains(&"s2-saw-s1".to_string()));
    let stores: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT store_url FROM project_snapshots")
            .fetch_all(&cluster.pool)
            .await
            .expect("stores");
    assert_eq!(
        stores,
        [format!(
            "file://{}",
            std::fs::canonicalize(&shared).expect("shared").display()
        )]
    );
    assert!(shared.join("packs").is_dir() && shared.join("manifests").is_dir());
    for n in 1..=2 {
        let own = cluster.dir.join(format!("artifacts-w{n}"));
        assert!(
            !own.join("packs").exists() && !own.join("manifests").exists(),
            "no snapshot bytes in {}",
            own.display()
        );
    }
}

#[tokio::test]
async fn an_empty_trees_checkpoint_stores_no_manifest_and_a_successor_restores_it() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("ws-empty", 1, Settings::default()).await;
    let marks = cluster.path("marks");
    // s1 leaves the tree empty (its mark is outside it); s2 runs until it is killed.
    let steps = vec![
        sh("s1", format!("echo s1 >> {marks}"), false),
        sh(
            "s2",
            format!("echo s2-start >> {marks}; ls -A >> {marks}; sleep 3"),
            true,
        ),
    ];
    let (run_id, request_id) = cluster.submit(&run_spec(steps, 5));
    cluster.wait_until("s2 to start", LONG, || {
        cluster.lines("marks").contains(&"s2-start".to_string())
    });
    let checkpoint = head(&cluster, &run_id).await.expect("s1 was checkpointed");
    let recorded: String =
        sqlx::query_scalar("SELECT manifest_key FROM project_snapshots WHERE id = $1")
            .bind(checkpoint)
            .fetch_one(&cluster.pool)
            .await
            .expect("checkpoint");
    assert_eq!(recorded, cairn_snapshot::EMPTY_MANIFEST_KEY);
    let stored = cluster
        .dir
        .join("artifacts")
        .join(cairn_snapshot::manifest_key(checkpoint));
    assert!(!stored.exists(), "an empty tree's manifest is not stored");

    kill_holder(&cluster, &request_id).await;
    cluster.add_worker();
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let restored = restores(&cluster, &request_id).await;
    assert!(
        restored.contains(&("checkpoint".into(), "succeeded".into(), None)),
        "{restored:?}"
    );
    let lines = cluster.lines("marks");
    let starts = lines.iter().filter(|l| *l == "s2-start").count();
    assert_eq!(starts, 2, "s2 ran again on the restored tree: {lines:?}");
    assert_eq!(lines.iter().filter(|l| *l == "s1").count(), 1, "{lines:?}");
    assert_eq!(lines.len(), 3, "the restored tree is empty: {lines:?}");
}
