//! Durability end to end: a sandbox's snapshots are `local_only` until a process on
//! another node than their writer's has read them back whole from their store. A
//! reaper on the writer's own node proves nothing, and a snapshot with a pack missing
//! from its store stays `local_only`.

use cairn_e2e::cluster::{Cluster, Settings};
use cairn_e2e::sandboxes::*;
use cairn_e2e::ServiceLock;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// A sandbox with a file of its own, stopped: its stop snapshot is its latest.
fn stopped_sandbox(cluster: &Cluster, content: &str) -> (String, Value) {
    let id = create(cluster, json!({"agent": "coder"}));
    wait_state(cluster, &id, "running");
    let (status, _) = exec(cluster, &id, &format!("echo {content} > own.txt"));
    assert_eq!(status, 200);
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    assert_eq!(status, 200);
    let view = wait_state(cluster, &id, "stopped");
    (id, view)
}

fn snapshot_durability(cluster: &Cluster, snapshot: &str) -> Value {
    let (status, view) = cluster.call("GET", &format!("/api/v1/snapshots/{snapshot}"), None);
    assert_eq!(status, 200, "{view}");
    view["durability"].clone()
}

fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
        if path.is_dir() {
            if let Some(found) = find(&path, name) {
                return Some(found);
            }
        }
    }
    None
}

#[tokio::test]
async fn a_snapshot_is_replicated_only_once_another_node_read_it_back() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-durability", 0, Settings::default()).await;
    cluster
        .worker_env
        .push(("CAIRN_NODE_NAME".into(), "node-a".into()));
    cluster.add_worker();

    let (id, view) = stopped_sandbox(&cluster, "first");
    assert_eq!(view["durability"], "local_only", "{view}");
    let stop = view["stop_snapshot_id"].as_str().expect("stop").to_string();
    // Read back on the node that wrote it: nothing shows it left that node.
    cluster.reap_once(&[("CAIRN_NODE_NAME", "node-a")]);
    assert_eq!(show(&cluster, &id)["durability"], "local_only");
    assert_eq!(snapshot_durability(&cluster, &stop), "local_only");
    // Read back whole on another node: replicated.
    cluster.reap_once(&[("CAIRN_NODE_NAME", "node-b")]);
    assert_eq!(show(&cluster, &id)["durability"], "replicated");
    assert_eq!(snapshot_durability(&cluster, &stop), "replicated");

    // A pack of its own gone from the store: it is not read back whole, and stays
    // `local_only`.
    let (second, view) = stopped_sandbox(&cluster, "second, with bytes of its own");
    let second_stop = view["stop_snapshot_id"].as_str().expect("stop").to_string();
    let own: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT pack_id FROM snapshot_packs WHERE snapshot_id = $1::uuid
         EXCEPT SELECT pack_id FROM snapshot_packs WHERE snapshot_id = $2::uuid",
    )
    .bind(&second_stop)
    .bind(&stop)
    .fetch_all(&cluster.pool)
    .await
    .expect("packs");
    let pack = own.first().expect("a pack of its own").simple().to_string();
    let file = find(&cluster.dir.join("artifacts"), &pack).expect("the pack's file");
    std::fs::remove_file(&file).expect("remove the pack");
    cluster.reap_once(&[("CAIRN_NODE_NAME", "node-b")]);
    assert_eq!(show(&cluster, &second)["durability"], "local_only");
    assert_eq!(snapshot_durability(&cluster, &second_stop), "local_only");
    assert_eq!(show(&cluster, &id)["durability"], "replicated");
}
