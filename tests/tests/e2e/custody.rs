//! Custody end to end (invariants 4 and 9): a worker continues only from the tree its
//! journal describes, on whatever host and after whatever failure.
//!
//! Workers here have their own workspaces directories, as on separate hosts, and share
//! one snapshot store. Each step appends its name to `log.txt` in the tree; the last
//! copies that file out, so every test checks that the final tree lists each step
//! exactly once, in order: the tree agrees with the journal.

use cairn_e2e::cluster::{Cluster, Settings};
use cairn_e2e::ServiceLock;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(90);

/// A cluster without workers whose workers will share a snapshot store.
async fn cluster(label: &str, extra: &[(&str, &str)]) -> Cluster {
    let mut cluster = Cluster::start(label, 0, Settings::default()).await;
    let store = store_of(&cluster);
    std::fs::create_dir_all(&store).expect("store");
    cluster.worker_env = vec![(
        "CAIRN_SNAPSHOT_STORE_URL".into(),
        format!("file://{}", store.display()),
    )];
    cluster
        .worker_env
        .extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    cluster
}

/// The snapshot store: in the directory steps share with the test, so that a step can
/// sabotage it (the sandbox shows a step nothing else of the host).
fn store_of(cluster: &Cluster) -> std::path::PathBuf {
    cluster.path("store").into()
}

/// A step that appends `key` to the tree's log after `script` (which may wait).
fn step(key: &str, script: &str, idempotent: bool) -> Value {
    json!({"key": key, "argv": ["sh", "-c", format!("{script}\necho {key} >> log.txt")],
           "idempotent": idempotent, "timeout_seconds": 120})
}

/// The last step: appends its key, then copies the tree's log out as `final`.
fn last_step(cluster: &Cluster, key: &str, script: &str) -> Value {
    let out = cluster.path("final");
    json!({"key": key, "argv": ["sh", "-c", format!("{script}\necho {key} >> log.txt; cp log.txt {out}")],
           "idempotent": true, "timeout_seconds": 120})
}

/// Waits for `name` (a file in the cluster's directory) for at most `seconds`.
fn wait_for_file(cluster: &Cluster, name: &str, seconds: u32) -> String {
    format!(
        "i=0; while [ ! -e {0} ] && [ $i -lt {1} ]; do sleep 0.1; i=$((i+1)); done",
        cluster.path(name),
        seconds * 10
    )
}

fn spec(steps: Vec<Value>, max_attempts: u32) -> Value {
    json!({"agent": "e2e", "steps": steps,
           "budgets": {"max_commands": 50, "max_wall_seconds": 3600}, "max_attempts": max_attempts})
}

fn touch(cluster: &Cluster, name: &str) {
    std::fs::write(cluster.path(name), "").expect("touch");
}

async fn restores(cluster: &Cluster, request_id: &str) -> Vec<(String, String)> {
    sqlx::query_as("SELECT tier, outcome FROM snapshot_restores WHERE request_id = $1::uuid ORDER BY created_at")
        .bind(request_id)
        .fetch_all(&cluster.pool)
        .await
        .expect("restores")
}

/// Submits a run and waits until its step `key` has started.
async fn submit_until_started(cluster: &Cluster, spec: &Value, key: &str) -> (String, String) {
    let (run_id, request_id) = cluster.submit(spec);
    until(cluster, &format!("{key} to start"), || {
        intent_exists(cluster, &request_id, key)
    })
    .await;
    (run_id, request_id)
}

/// The tree of the request's last acquisition came from `tier`.
async fn assert_last_tier(cluster: &Cluster, request_id: &str, tier: &str) {
    let tiers = restores(cluster, request_id).await;
    assert_eq!(
        tiers.last().map(|t| (t.0.as_str(), t.1.as_str())),
        Some((tier, "succeeded")),
        "{tiers:?}"
    );
}

async fn intent_exists(cluster: &Cluster, request_id: &str, step: &str) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM journal_intents WHERE request_id = $1::uuid AND step_key = $2)",
    )
    .bind(request_id)
    .bind(step)
    .fetch_one(&cluster.pool)
    .await
    .expect("intent")
}

async fn head(cluster: &Cluster, run_id: &str) -> Option<(uuid::Uuid, i64, bool)> {
    sqlx::query_as(
        "SELECT head_id, sequence, retired_at IS NOT NULL FROM lineage_heads WHERE work_context_id = $1::uuid",
    )
    .bind(run_id)
    .fetch_optional(&cluster.pool)
    .await
    .expect("head")
}

async fn kill_holder(cluster: &mut Cluster, request_id: &str) {
    let holder = cluster.worker_index(&cluster.holder(request_id).await.expect("a holder"));
    cluster.workers[holder].process.signal(Signal::SIGKILL);
    cluster.workers[holder]
        .process
        .wait_exit(Duration::from_secs(5));
}

/// Every receipt of a successful step names the snapshot holding its effects.
async fn assert_receipts_stand_on_snapshots(cluster: &Cluster, run_id: &str) {
    let journal = cluster.journal(run_id);
    for step in journal["steps"].as_array().expect("steps") {
        assert_eq!(step["status"], "completed", "{step}");
        assert!(step["snapshot_id"].is_string(), "{step}");
        assert!(step["tree_tier"].is_string(), "{step}");
    }
}

fn final_log(cluster: &Cluster) -> Vec<String> {
    cluster.lines("final")
}

/// Case 1: the store fails while step 2's effects are captured, and the worker dies
/// before it comes back. No receipt of step 2 may exist without a tree holding its
/// effects: the successor runs it again (it is idempotent) instead of reusing it.
#[tokio::test]
async fn a_step_whose_capture_failed_has_no_receipt_a_successor_could_reuse() {
    let _services = ServiceLock::shared().await;
    let mut cluster = cluster("custody-capture", &[("CAIRN_CAPTURE_RETRY_SECONDS", "60")]).await;
    let store = store_of(&cluster);
    let broken = cluster.path("broken");
    let sabotage = format!(
        "[ -e {broken} ] || {{ mv {0} {0}.away && touch {0} && touch {broken}; }}",
        store.display()
    );
    let spec = spec(
        vec![
            step("s1", "", true),
            step("s2", &sabotage, true),
            step("s3", "", true),
            last_step(&cluster, "s4", ""),
        ],
        3,
    );
    cluster.add_worker();
    let (run_id, request_id) = cluster.submit(&spec);
    // Either s2's capture failed (and is being retried), or s3 started.
    until(&cluster, "s2's capture to fail or s3 to start", || async {
        let failed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM project_snapshots WHERE work_context_id = $1::uuid AND status = 'failed'",
        )
        .bind(&run_id)
        .fetch_one(&cluster.pool)
        .await
        .expect("failed captures");
        failed > 0 || intent_exists(&cluster, &request_id, "s3").await
    })
    .await;
    kill_holder(&mut cluster, &request_id).await;
    std::fs::remove_file(&store).expect("the file put in the store's place");
    std::fs::rename(store.with_extension("away"), &store).expect("store back");
    cluster.add_worker();
    let run = cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(final_log(&cluster), ["s1", "s2", "s3", "s4"], "{run}");
    assert_receipts_stand_on_snapshots(&cluster, &run_id).await;
}

/// A worker killed in the middle of a step's capture has written no receipt for it: the
/// successor runs the step again from the previous checkpoint, and the reaper fails the
/// abandoned capture once its owner's lease is gone.
#[tokio::test]
async fn a_worker_killed_during_a_capture_leaves_no_receipt() {
    let _services = ServiceLock::shared().await;
    let mut cluster = cluster("custody-midcapture", &[]).await;
    let runs = cluster.path("runs-of-s2");
    let spec = spec(
        vec![
            step("s1", "", true),
            step("s2", &format!("echo ran >> {runs}"), true),
            last_step(&cluster, "s3", ""),
        ],
        5,
    );
    // s1's capture is the first to pass the point, s2's the second.
    cluster.add_faulty_worker("w1", "during_capture@2");
    let (run_id, request_id) = cluster.submit(&spec);
    if cluster.workers[0].process.wait_exit(LONG).is_none() {
        panic!(
            "never killed itself during s2's capture\n{}",
            cluster.logs()
        );
    }
    let abandoned: (uuid::Uuid, String) = sqlx::query_as(
        "SELECT id, status FROM project_snapshots WHERE work_context_id = $1::uuid AND sequence IS NULL",
    )
    .bind(&run_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("the capture in flight");
    assert_eq!(abandoned.1, "uploading");
    let receipts: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM journal_receipts WHERE request_id = $1::uuid AND step_key = 's2'",
    )
    .bind(&request_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("receipts");
    assert_eq!(receipts, 0, "no receipt before its checkpoint commits");
    // Its owner can no longer commit it (its lease lapses): the reaper fails it.
    until(&cluster, "the lease to lapse", || async {
        let lapsed: bool = sqlx::query_scalar(
            "SELECT lease_owner IS NULL OR lease_deadline < clock_timestamp() OR lease_epoch > 1
               FROM execution_requests WHERE id = $1::uuid",
        )
        .bind(&request_id)
        .fetch_one(&cluster.pool)
        .await
        .expect("lease");
        lapsed
    })
    .await;
    let mut env = cluster.isolation.env();
    env.extend([
        (
            "CAIRN_ABANDONED_CAPTURE_SECONDS".to_string(),
            "0".to_string(),
        ),
        (
            "CAIRN_METRICS_LISTEN".to_string(),
            cairn_e2e::free_addr().to_string(),
        ),
    ]);
    let mut reaper = cairn_e2e::Process::start_with_args("cairn-reaper", &env, &["--once"]);
    assert!(
        reaper.wait_exit(LONG).expect("one sweep").success(),
        "{}",
        reaper.log()
    );
    let status: String = sqlx::query_scalar("SELECT status FROM project_snapshots WHERE id = $1")
        .bind(abandoned.0)
        .fetch_one(&cluster.pool)
        .await
        .expect("status");
    assert_eq!(status, "failed", "an abandoned capture fails in minutes");
    cluster.add_worker();
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(final_log(&cluster), ["s1", "s2", "s3"]);
    assert_eq!(
        cluster.lines("runs-of-s2").len(),
        2,
        "s2 ran again: its first run had no receipt"
    );
    assert_receipts_stand_on_snapshots(&cluster, &run_id).await;
}

/// A capture that keeps failing past the retry time ends the attempt with no receipt:
/// here the last attempt, so the request stops at its last checkpoint, saying why, and
/// the live tree stays under a hold.
#[tokio::test]
async fn a_capture_that_keeps_failing_ends_the_attempt_without_a_receipt() {
    let _services = ServiceLock::shared().await;
    let mut cluster = cluster("custody-nocapture", &[("CAIRN_CAPTURE_RETRY_SECONDS", "2")]).await;
    let store = store_of(&cluster);
    let sabotage = format!("mv {0} {0}.away && touch {0}", store.display());
    let spec = spec(
        vec![
            step("s1", "", false),
            step("s2", &sabotage, false),
            last_step(&cluster, "s3", ""),
        ],
        1,
    );
    cluster.add_worker();
    let (run_id, request_id) = cluster.submit(&spec);
    let run = cluster.wait_for_state(&run_id, &["stopped_at_checkpoint"], LONG);
    let (reason, _) = cluster.stop_reason(&request_id).await;
    assert_eq!(reason.as_deref(), Some("capture_failed"), "{run}");
    let journal = cluster.journal(&run_id);
    let steps = journal["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 2, "{journal}");
    assert_eq!(steps[0]["status"], "completed");
    assert_eq!(
        steps[1]["status"], "unknown_outcome",
        "s2 ran, but no receipt without a tree: {journal}"
    );
    let holds: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM holds WHERE ended_at IS NULL AND run_id = $1::uuid AND NOT capture_in_progress",
    )
    .bind(&run_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("holds");
    assert_eq!(holds, 1, "the live tree with s2's work stays held");
    assert_eq!(cluster.metric(0, "cairn_worker_captures_failed_total"), 1.0);
}

/// Case 2: the head is retired by a credential rotation, so the successor's tree comes
/// from a fallback tier and holds none of the journal's effects. Idempotent steps run
/// again; a non-idempotent one waits for a person, naming `tree_behind_journal`.
#[tokio::test]
async fn a_fallback_tree_reuses_no_receipt_it_does_not_hold() {
    let _services = ServiceLock::shared().await;
    let mut cluster = cluster("custody-fallback", &[]).await;
    let all_idempotent = spec(
        vec![
            step("s1", "", true),
            step("s2", "", true),
            step("s3", &wait_for_file(&cluster, "go", 60), true),
            last_step(&cluster, "s4", ""),
        ],
        3,
    );
    cluster.add_worker();
    let (run_id, request_id) = submit_until_started(&cluster, &all_idempotent, "s3").await;
    let (status, _) = cluster.call("POST", "/api/v1/agents/e2e/credentials/rotate", None);
    assert_eq!(status, 200);
    kill_holder(&mut cluster, &request_id).await;
    touch(&cluster, "go");
    cluster.add_worker();
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(final_log(&cluster), ["s1", "s2", "s3", "s4"]);
    assert_last_tier(&cluster, &request_id, "cold").await;
    assert_receipts_stand_on_snapshots(&cluster, &run_id).await;

    // The same with a first step that may not run twice: a person decides.
    std::fs::remove_file(cluster.path("go")).expect("go");
    std::fs::remove_file(cluster.path("final")).expect("final");
    let one_not_idempotent = spec(
        vec![
            step("s1", "", false),
            step("s2", "", true),
            step("s3", &wait_for_file(&cluster, "go", 60), true),
            last_step(&cluster, "s4", ""),
        ],
        3,
    );
    let (run_id, request_id) = submit_until_started(&cluster, &one_not_idempotent, "s3").await;
    let (status, _) = cluster.call("POST", "/api/v1/agents/e2e/credentials/rotate", None);
    assert_eq!(status, 200);
    kill_holder(&mut cluster, &request_id).await;
    touch(&cluster, "go");
    cluster.add_worker();
    let run = cluster.wait_for_state(&run_id, &["needs_reconciliation"], LONG);
    let (reason, step) = cluster.stop_reason(&request_id).await;
    assert_eq!(
        (reason.as_deref(), step.as_deref()),
        (Some("tree_behind_journal"), Some("s1")),
        "{run}"
    );
    assert!(
        final_log(&cluster).is_empty(),
        "nothing ran on the wrong tree"
    );
    let context: Value =
        sqlx::query_scalar("SELECT resume_context FROM execution_requests WHERE id = $1::uuid")
            .bind(&request_id)
            .fetch_one(&cluster.pool)
            .await
            .expect("context");
    assert_eq!(context["restore_tier"], "cold", "{context}");
    assert_eq!(
        context["receipts"][0]["standing"], "tree_behind_journal",
        "{context}"
    );
    assert!(
        context["receipts"][0]["snapshot_id"].is_string(),
        "{context}"
    );
}

/// Case 3: a worker killed in the middle of a restore leaves the snapshot as it was:
/// the next worker restores the same checkpoint.
#[tokio::test]
async fn a_restore_killed_midway_leaves_its_snapshot_restorable() {
    let _services = ServiceLock::shared().await;
    let mut cluster = cluster("custody-restore", &[]).await;
    let spec = spec(
        vec![
            step("s1", "", true),
            step("s2", &wait_for_file(&cluster, "go", 60), true),
            last_step(&cluster, "s3", ""),
        ],
        5,
    );
    cluster.add_worker();
    let (run_id, request_id) = submit_until_started(&cluster, &spec, "s2").await;
    let (s1_head, _, _) = head(&cluster, &run_id).await.expect("s1's checkpoint");
    kill_holder(&mut cluster, &request_id).await;
    touch(&cluster, "go");
    let index = cluster.add_faulty_worker("w2", "during_restore");
    cluster.workers[index]
        .process
        .wait_exit(LONG)
        .expect("killed itself mid-restore");
    let status: String = sqlx::query_scalar("SELECT status FROM project_snapshots WHERE id = $1")
        .bind(s1_head)
        .fetch_one(&cluster.pool)
        .await
        .expect("status");
    assert_eq!(status, "ready", "a restore only reads");
    cluster.add_worker();
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(final_log(&cluster), ["s1", "s2", "s3"]);
    assert_last_tier(&cluster, &request_id, "checkpoint").await;
}

/// Case 4: a worker drained mid-step keeps its tree under a hold; another advances the
/// lineage and dies; the first restarts (same id, same directory). Its held tree is
/// behind the head: it is not adopted, and the head is restored instead.
#[tokio::test]
async fn a_held_tree_behind_the_lineage_head_is_not_adopted() {
    let _services = ServiceLock::shared().await;
    let mut cluster = cluster("custody-adopt", &[("CAIRN_DRAIN_SECONDS", "2")]).await;
    let written = cluster.path("s2-wrote-its-line");
    let spec = spec(
        vec![
            step("s1", "", true),
            step(
                "s2",
                &format!(
                    "echo s2-start >> log.txt; touch {written}; {}",
                    wait_for_file(&cluster, "go2", 60)
                ),
                true,
            ),
            step("s3", "", true),
            last_step(&cluster, "s4", &wait_for_file(&cluster, "go4", 60)),
        ],
        5,
    );
    cluster.add_worker_named("f");
    let (run_id, request_id) = submit_until_started(&cluster, &spec, "s2").await;
    cluster.wait_until("s2 to write its line", LONG, || {
        std::path::Path::new(&written).exists()
    });
    // F drains: s2 is stopped and F's tree (s1, s2-start) is kept under a hold.
    cluster.workers[0].process.signal(Signal::SIGTERM);
    cluster.workers[0]
        .process
        .wait_exit(LONG)
        .expect("F drained and exited");
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM holds WHERE ended_at IS NULL AND run_id = $1::uuid",
    )
    .bind(&run_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("holds");
    assert_eq!(held, 1, "F's uncaptured tree is held");
    touch(&cluster, "go2");
    cluster.add_worker_named("g");
    until(&cluster, "s4 to start on G", || {
        intent_exists(&cluster, &request_id, "s4")
    })
    .await;
    let (g_head, sequence, _) = head(&cluster, &run_id).await.expect("head");
    assert_eq!(sequence, 3, "G advanced the lineage to s3");
    kill_holder(&mut cluster, &request_id).await;
    touch(&cluster, "go4");
    cluster.add_worker_named("f");
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(final_log(&cluster), ["s1", "s2-start", "s2", "s3", "s4"]);
    let tiers = restores(&cluster, &request_id).await;
    let tail: Vec<(&str, &str)> = tiers[tiers.len() - 2..]
        .iter()
        .map(|t| (t.0.as_str(), t.1.as_str()))
        .collect();
    assert_eq!(
        tail,
        [("adopt", "failed"), ("checkpoint", "succeeded")],
        "{tiers:?}"
    );
    let predecessor: Option<uuid::Uuid> = sqlx::query_scalar(
        "SELECT predecessor_id FROM project_snapshots WHERE work_context_id = $1::uuid AND sequence = 4",
    )
    .bind(&run_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("the next checkpoint");
    assert_eq!(
        predecessor,
        Some(g_head),
        "F continued from G's head, not from its stale tree"
    );
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM holds WHERE ended_at IS NULL AND run_id = $1::uuid",
    )
    .bind(&run_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("holds");
    assert_eq!(open, 0, "the stale tree's hold ended");
}

/// Case 5: the reaper never retires the head of a task that is still executing (here
/// with an idle limit of zero), so a successor can restore it.
#[tokio::test]
async fn the_reaper_keeps_the_head_of_a_live_task() {
    let _services = ServiceLock::shared().await;
    let mut cluster = cluster("custody-idle", &[]).await;
    let spec = spec(
        vec![
            step("s1", "", true),
            step("s2", &wait_for_file(&cluster, "go2", 60), true),
            step("s3", &wait_for_file(&cluster, "go3", 60), true),
            last_step(&cluster, "s4", ""),
        ],
        5,
    );
    cluster.add_worker();
    let (run_id, request_id) = submit_until_started(&cluster, &spec, "s2").await;
    let mut env = cluster.isolation.env();
    env.extend([
        ("CAIRN_IDLE_HEAD_SECONDS".to_string(), "0".to_string()),
        (
            "CAIRN_METRICS_LISTEN".to_string(),
            cairn_e2e::free_addr().to_string(),
        ),
    ]);
    let mut reaper = cairn_e2e::Process::start_with_args("cairn-reaper", &env, &["--once"]);
    let exit = reaper.wait_exit(LONG).expect("one sweep");
    assert!(exit.success(), "{}", reaper.log());
    let (_, _, retired) = head(&cluster, &run_id).await.expect("head");
    assert!(!retired, "a live task's head stays current");
    touch(&cluster, "go2");
    until(&cluster, "s3 to start", || {
        intent_exists(&cluster, &request_id, "s3")
    })
    .await;
    let (_, sequence, _) = head(&cluster, &run_id).await.expect("head");
    assert_eq!(sequence, 2, "s2's checkpoint was appended");
    kill_holder(&mut cluster, &request_id).await;
    touch(&cluster, "go3");
    cluster.add_worker();
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(final_log(&cluster), ["s1", "s2", "s3", "s4"]);
    assert_last_tier(&cluster, &request_id, "checkpoint").await;
}

/// A run that failed or was cancelled ends its task: no continuation can take it
/// further, so its lineage retires with it (saying why) instead of waiting 14 days as
/// an idle head; its snapshots stay readable until the reaper reclaims them.
#[tokio::test]
async fn a_failed_or_cancelled_run_retires_its_lineage() {
    let _services = ServiceLock::shared().await;
    let mut cluster = cluster("custody-ended", &[]).await;
    cluster.add_worker();
    let failing = spec(vec![step("s1", "", true), step("s2", "exit 3", false)], 1);
    let (failed, _) = cluster.submit(&failing);
    let cancelled_spec = spec(
        vec![
            step("s1", "", true),
            step("s2", &wait_for_file(&cluster, "never", 60), true),
        ],
        1,
    );
    let (cancelled, _) = submit_until_started(&cluster, &cancelled_spec, "s2").await;
    let (status, _) = cluster.call("POST", &format!("/api/v1/runs/{cancelled}/cancel"), None);
    assert_eq!(status, 202);
    cluster.wait_for_state(&failed, &["failed"], LONG);
    cluster.wait_for_state(&cancelled, &["cancelled"], LONG);
    for (run_id, reason) in [(&failed, "task_failed"), (&cancelled, "task_cancelled")] {
        let (_, sequence, retired) = head(&cluster, run_id).await.expect("a head");
        assert_eq!(sequence, 1, "s1's checkpoint");
        assert!(retired, "{reason}: the head is retired");
        let reasons: Vec<(String, Option<String>)> = sqlx::query_as(
            "SELECT retention, retire_reason FROM project_snapshots
              WHERE work_context_id = $1::uuid AND kind = 'checkpoint'",
        )
        .bind(run_id)
        .fetch_all(&cluster.pool)
        .await
        .expect("snapshots");
        assert_eq!(
            reasons,
            [("retired".to_string(), Some(reason.to_string()))],
            "{run_id}"
        );
    }
}

/// Case 6: an adoption moves the tree's hold to its new workspace row in the same
/// transaction: a worker killed right after adopting finds the tree held again and
/// adopts it again, with the work its first owner left in it.
#[tokio::test]
async fn an_adopted_tree_stays_held_until_its_first_capture() {
    let _services = ServiceLock::shared().await;
    let mut cluster = cluster("custody-hold", &[("CAIRN_DRAIN_SECONDS", "2")]).await;
    let spec = spec(
        vec![
            step("s1", "", true),
            step(
                "s2",
                &format!(
                    "echo s2-partial-$CAIRN_ATTEMPT >> log.txt; touch {}; {}",
                    cluster.path("s2-wrote"),
                    wait_for_file(&cluster, "go", 60)
                ),
                true,
            ),
            last_step(&cluster, "s3", ""),
        ],
        5,
    );
    cluster.add_worker_named("w1");
    let (run_id, request_id) = submit_until_started(&cluster, &spec, "s2").await;
    // The work the test means to keep must be in the tree before the drain stops s2.
    let wrote = cluster.path("s2-wrote");
    until(&cluster, "s2 to write its partial work", || async {
        std::path::Path::new(&wrote).exists()
    })
    .await;
    cluster.workers[0].process.signal(Signal::SIGTERM);
    cluster.workers[0].process.wait_exit(LONG).expect("drained");
    // Restarted, it adopts its held tree and dies before capturing anything.
    let index = cluster.add_faulty_worker("w1", "after_adopt");
    cluster.workers[index]
        .process
        .wait_exit(LONG)
        .expect("killed itself after adopting");
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM holds h JOIN workspaces w ON w.id = h.workspace_id
          WHERE h.ended_at IS NULL AND h.run_id = $1::uuid AND w.state <> 'destroyed'",
    )
    .bind(&run_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("holds");
    assert_eq!(held, 1, "the hold moved with the adopted tree");
    touch(&cluster, "go");
    cluster.add_worker_named("w1");
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let log = final_log(&cluster);
    assert_eq!(log.first().map(String::as_str), Some("s1"), "{log:?}");
    assert!(
        log.contains(&"s2-partial-1".to_string()),
        "the first owner's work was kept: {log:?}"
    );
    let steps: Vec<&String> = log.iter().filter(|l| !l.contains("partial")).collect();
    assert_eq!(steps, ["s1", "s2", "s3"], "{log:?}");
    let adopted = restores(&cluster, &request_id)
        .await
        .iter()
        .filter(|t| t.0 == "adopt" && t.1 == "succeeded")
        .count();
    assert_eq!(adopted, 2, "adopted, then adopted again after the kill");
}

/// Case 7: two workers on one workspaces directory: the second is refused at start.
#[tokio::test]
async fn a_second_worker_on_one_workspaces_directory_is_refused() {
    let _services = ServiceLock::shared().await;
    let mut cluster = cluster("custody-dir", &[]).await;
    cluster.add_worker_named("one");
    let mut env = cluster.isolation.env();
    env.extend([
        ("CAIRN_WORKER_ID".to_string(), "two".to_string()),
        (
            "CAIRN_WORKSPACES_DIR".to_string(),
            cluster.workspaces("one").to_string_lossy().into_owned(),
        ),
        (
            "CAIRN_METRICS_LISTEN".to_string(),
            cairn_e2e::free_addr().to_string(),
        ),
    ]);
    let mut second = cairn_e2e::Process::start("cairn-worker", &env);
    let exit = second.wait_exit(LONG).expect("refused");
    assert!(!exit.success());
    assert!(
        second.log().contains("in use by another worker process"),
        "{}",
        second.log()
    );
}

/// Polls `check` until it holds, or panics with the logs.
async fn until<F, Fut>(cluster: &Cluster, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + LONG;
    while !check().await {
        if std::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}\n{}", cluster.logs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A failed step's tree is kept for inspection: a retired `inspection` snapshot, named in
/// the journal, never in the lineage (nothing continues from it), that a sandbox can
/// start from to show what the step left.
#[tokio::test]
async fn a_failed_steps_tree_is_kept_for_inspection_and_opens_in_a_sandbox() {
    use cairn_e2e::sandboxes::{create, exec, wait_state};
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("inspection", 1, Settings::default()).await;
    let steps = vec![
        step("prepare", "echo prepared > ready.txt", false),
        step("break", "echo 'half done' > notes.txt; exit 3", false),
    ];
    let (run_id, _) = cluster.submit(&spec(steps, 1));
    let run = cluster.wait_for_state(&run_id, &["failed", "completed"], LONG);
    assert_eq!(run["state"], "failed", "{run}");

    let journal = cluster.journal(&run_id);
    let kept: Vec<&Value> = journal["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["entry_kind"] == "inspection_snapshot")
        .collect();
    assert_eq!(kept.len(), 1, "{journal}");
    assert_eq!(kept[0]["body"]["step_key"], "break");
    let snapshot = kept[0]["body"]["snapshot_id"]
        .as_str()
        .expect("id")
        .to_string();
    let row: (String, String, String, Option<String>, bool) = sqlx::query_as(
        "SELECT kind, status, retention, retire_reason, retired_at IS NOT NULL
           FROM project_snapshots WHERE id = $1::uuid",
    )
    .bind(&snapshot)
    .fetch_one(&cluster.pool)
    .await
    .expect("the inspection snapshot");
    assert_eq!(
        row,
        (
            "inspection".into(),
            "ready".into(),
            "retired".into(),
            Some("inspection".into()),
            true
        ),
        "retired as it was made: its bytes go by the reclaim rule"
    );
    let in_lineage: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM lineage_heads WHERE head_id = $1::uuid)
             OR EXISTS (SELECT 1 FROM project_snapshots WHERE id = $1::uuid AND sequence IS NOT NULL)",
    )
    .bind(&snapshot)
    .fetch_one(&cluster.pool)
    .await
    .expect("lineage");
    assert!(!in_lineage, "no continuation can adopt it");

    let sandbox = create(
        &cluster,
        json!({"agent": "coder", "source": format!("snapshot:{snapshot}"), "persistent": false}),
    );
    wait_state(&cluster, &sandbox, "running");
    let (status, seen) = exec(&cluster, &sandbox, "cat ready.txt notes.txt");
    assert_eq!(status, 200, "{seen}");
    assert_eq!(seen["result"]["stdout"], "prepared\nhalf done\n", "{seen}");
}
