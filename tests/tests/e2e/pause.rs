//! Pause and resume end to end: the step's processes stop, a checkpoint is captured
//! before the paused reply, resume continues them, and a pause past its limit behaves
//! like a stop.

use cairn_e2e::cluster::{Cluster, Settings};
use cairn_e2e::ServiceLock;
use cairn_snapshot as snapshot;
use cairn_snapshot::store::ArtifactStore;
use serde_json::{json, Value};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(90);

/// A step that counts to `to`, a tenth of a second apart, in a file outside the tree
/// (the last count) and in the tree (`ticks`). The count is renamed into place first,
/// so a freeze at any instruction leaves it whole and never behind `ticks`.
fn counting_step(cluster: &Cluster, to: u32) -> Value {
    let count = cluster.path("count");
    let script = format!(
        "for i in $(seq 1 {to}); do echo $i > {count}.tmp; mv {count}.tmp {count}; echo $i >> ticks; sleep 0.1; done"
    );
    json!({"key": "count", "argv": ["sh", "-c", script], "idempotent": true, "timeout_seconds": 300})
}

fn count(cluster: &Cluster) -> u32 {
    cluster
        .lines("count")
        .first()
        .and_then(|l| l.parse().ok())
        .unwrap_or(0)
}

fn spec(cluster: &Cluster, to: u32) -> Value {
    json!({
        "agent": "e2e",
        "steps": [
            {"key": "prepare", "argv": ["sh", "-c", "echo prepared > prepared.txt"], "idempotent": false, "timeout_seconds": 60},
            counting_step(cluster, to),
        ],
        "budgets": {"max_commands": 10, "max_wall_seconds": 600}, "max_attempts": 1
    })
}

#[tokio::test]
async fn a_pause_captures_before_its_reply_and_resume_continues_the_step() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("pause", 1, Settings::default()).await;
    let (run_id, request_id) = cluster.submit(&spec(&cluster, 60));
    let pause = format!("/api/v1/runs/{run_id}/pause");
    let resume = format!("/api/v1/runs/{run_id}/resume");
    // `ticks` trails the count by at most one, so it has at least 3 lines from here on.
    cluster.wait_until("the counting step to start", LONG, || count(&cluster) >= 4);

    // Bad input changes nothing.
    let (status, body) = cluster.call("POST", &format!("{pause}?wait_seconds=99"), None);
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (400, Some("wait_seconds"))
    );
    let (status, _) = cluster.call("POST", "/api/v1/runs/not-an-id/pause", None);
    assert_eq!(status, 400);
    let unknown = uuid::Uuid::new_v4().simple();
    let (status, _) = cluster.call("POST", &format!("/api/v1/runs/{unknown}/pause"), None);
    assert_eq!(status, 404);
    let (status, body) = cluster.call("POST", &resume, None);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("not_paused"))
    );

    let (status, paused) = cluster.call("POST", &format!("{pause}?wait_seconds=25"), None);
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["state"], "paused");
    assert_eq!(paused["checkpoint"]["step"], "count");
    assert_eq!(paused["checkpoint"]["capture_failed"], false);
    let snapshot_id: uuid::Uuid = paused["checkpoint"]["snapshot_id"]
        .as_str()
        .expect("a checkpoint")
        .parse()
        .expect("uuid");

    // The checkpoint was durable before the reply: ready, the lineage head, and it holds
    // the ticks counted up to the pause.
    let (status_of, head): (String, uuid::Uuid) = sqlx::query_as(
        "SELECT s.status, h.head_id FROM project_snapshots s
           JOIN lineage_heads h ON h.work_context_id = s.work_context_id WHERE s.id = $1",
    )
    .bind(snapshot_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("snapshot");
    assert_eq!((status_of.as_str(), head), ("ready", snapshot_id));
    // The run shows as paused, and the list filters by it.
    assert_eq!(cluster.run(&run_id)["state"], "paused");
    let listed = |state: &str| -> Vec<Value> {
        let (status, page) = cluster.call("GET", &format!("/api/v1/runs?state={state}"), None);
        assert_eq!(status, 200, "{page}");
        page["runs"].as_array().cloned().unwrap_or_default()
    };
    assert_eq!(listed("paused").len(), 1);
    assert!(
        listed("running").is_empty(),
        "a paused run is not listed as running"
    );
    let (_, counts) = cluster.call("GET", "/api/v1/runs/counts", None);
    assert_eq!(
        (
            counts["counts"]["paused"].as_i64(),
            counts["counts"]["running"].as_i64()
        ),
        (Some(1), Some(0)),
        "{counts}"
    );
    let at_pause = count(&cluster);
    let store = ArtifactStore::open(&cluster.dir.join("artifacts").to_string_lossy())
        .expect("the cluster's artifact store");
    let manifest = snapshot::load_manifest(&store, snapshot_id)
        .await
        .expect("manifest");
    let restored = std::path::Path::new(&cluster.path("restored")).to_path_buf();
    snapshot::restore(&store, &manifest, &restored)
        .await
        .expect("restore");
    let ticks = std::fs::read_to_string(restored.join("ticks")).expect("ticks");
    assert!(restored.join("prepared.txt").exists());
    let captured = ticks.lines().count() as u32;
    assert!(
        captured >= 3 && captured <= at_pause,
        "{captured} ticks captured, {at_pause} counted"
    );

    // The processes are stopped: nothing counts while paused.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(count(&cluster), at_pause, "a paused step does not run");
    let state: String = sqlx::query_scalar(
        "SELECT w.state FROM workspaces w JOIN execution_requests e ON e.run_id = w.run_id
          WHERE e.id = $1::uuid ORDER BY w.created_at DESC LIMIT 1",
    )
    .bind(&request_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("workspace");
    assert_eq!(state, "paused");
    let (status, again) = cluster.call("POST", &pause, None);
    assert_eq!(
        (status, again["paused_at"].clone()),
        (200, paused["paused_at"].clone()),
        "pausing a paused run changes nothing"
    );
    let (_, shown) = cluster.call("GET", &pause, None);
    assert_eq!(shown["state"], "paused");

    // cairnctl shows the same pause (pausing again changes nothing).
    let ctl = std::process::Command::new(cairn_e2e::binary("cairnctl"))
        .args(["runs", "pause", &run_id])
        .env("CAIRN_SERVER", format!("http://{}", cluster.api))
        .env("CAIRN_TOKEN", cairn_e2e::cluster::ADMIN)
        .output()
        .expect("cairnctl");
    let said = String::from_utf8_lossy(&ctl.stdout);
    assert!(
        ctl.status.success() && said.contains(&format!("checkpoint {}", snapshot_id.simple())),
        "{said}{}",
        String::from_utf8_lossy(&ctl.stderr)
    );
    let (status, resumed) = cluster.call("POST", &format!("{resume}?wait_seconds=25"), None);
    assert_eq!(
        (status, resumed["state"].as_str()),
        (200, Some("running")),
        "{resumed}"
    );
    cluster.wait_until("counting to go on", LONG, || count(&cluster) > at_pause);
    assert_eq!(cluster.run(&run_id)["state"], "running");
    let run = cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(count(&cluster), 60, "{run}");
    assert_eq!(cluster.metric(0, "cairn_worker_pauses_total"), 1.0);
    let (status, body) = cluster.call("POST", &pause, None);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("not_running"))
    );
}

#[tokio::test]
async fn a_pause_past_its_limit_stops_at_its_checkpoint() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("pause-limit", 0, Settings::default()).await;
    cluster.worker_env = vec![("CAIRN_PAUSE_LIMIT_SECONDS".into(), "2".into())];
    cluster.add_worker();
    let (run_id, request_id) = cluster.submit(&spec(&cluster, 600));
    cluster.wait_until("the counting step to start", LONG, || count(&cluster) >= 3);
    let (status, paused) = cluster.call(
        "POST",
        &format!("/api/v1/runs/{run_id}/pause?wait_seconds=25"),
        None,
    );
    assert_eq!(status, 200, "{paused}");
    let run = cluster.wait_for_state(&run_id, &["stopped_at_checkpoint"], LONG);
    let (reason, pause_requested): (Option<String>, bool) = sqlx::query_as(
        "SELECT stop_reason, pause_requested_at IS NOT NULL FROM execution_requests WHERE id = $1::uuid",
    )
    .bind(&request_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("request");
    assert_eq!(reason.as_deref(), Some("pause_expired"), "{run}");
    assert!(!pause_requested);
    // Like a stop: the step's processes are gone, its files stay captured.
    // (Its own process id is of its PID namespace: found on the host by its script.)
    let script = cluster.path("count");
    cluster.wait_until("the stopped step's processes to end", LONG, || {
        cairn_e2e::processes_with(&script).is_empty()
    });
    // No capture after the pause's own: its checkpoint is what a continuation restores.
    let head: Option<uuid::Uuid> = sqlx::query_scalar(
        "SELECT head_id FROM lineage_heads WHERE work_context_id = $1::uuid AND retired_at IS NULL",
    )
    .bind(&run_id)
    .fetch_optional(&cluster.pool)
    .await
    .expect("head");
    assert_eq!(
        head.map(|h| h.simple().to_string()),
        paused["checkpoint"]["snapshot_id"]
            .as_str()
            .map(String::from),
        "the pause checkpoint is the head"
    );
    assert_eq!(
        cluster.metric(0, "cairn_worker_pauses_total"),
        1.0,
        "paused once"
    );
}
