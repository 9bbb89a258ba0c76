//! Sandboxes (the lifecycle seed) end to end, on the real binaries: placement through
//! the queue, exec and files journaled on durable trees, stop and resume on another
//! worker, a worker lost mid-exec, restore from a snapshot, idempotent resume.

use cairn_e2e::cluster::{Cluster, Settings, ADMIN};
use cairn_e2e::{exchange, processes_with, ServiceLock};
use serde_json::{json, Value};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

fn create(cluster: &Cluster, body: Value) -> String {
    let (status, view) = cluster.call("POST", "/api/v1/sandboxes", Some(&body));
    assert_eq!(status, 201, "{view}");
    assert_eq!(view["state"], "creating", "{view}");
    view["sandbox_id"].as_str().expect("id").to_string()
}

fn show(cluster: &Cluster, id: &str) -> Value {
    let (status, view) = cluster.call("GET", &format!("/api/v1/sandboxes/{id}"), None);
    assert_eq!(status, 200, "{view}");
    view
}

fn wait_state(cluster: &Cluster, id: &str, state: &str) -> Value {
    let mut last = Value::Null;
    cluster.wait_until(&format!("sandbox {id} {state}"), LONG, || {
        last = show(cluster, id);
        last["state"] == state && last.get("pending").is_none()
    });
    last
}

fn exec(cluster: &Cluster, id: &str, script: &str) -> (u16, Value) {
    cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(&json!({"argv": ["sh", "-c", script], "timeout_sec": 60})),
    )
}

/// A raw request: its status and body bytes.
fn raw(cluster: &Cluster, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let response = exchange(
        cluster.api,
        method,
        path,
        &[format!("Authorization: Bearer {ADMIN}")],
        Some("application/octet-stream"),
        body,
    )
    .expect("request");
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("head");
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(
        !head.to_ascii_lowercase().contains("chunked"),
        "a chunked reply: {head}"
    );
    (status, response[split + 4..].to_vec())
}

fn file(cluster: &Cluster, id: &str, path: &str) -> (u16, Vec<u8>) {
    raw(
        cluster,
        "GET",
        &format!("/api/v1/sandboxes/{id}/files/content?path={path}"),
        b"",
    )
}

async fn worker_of(cluster: &Cluster, id: &str) -> Option<String> {
    let uuid = uuid::Uuid::parse_str(id).expect("uuid");
    sqlx::query_scalar("SELECT worker_id FROM sandboxes WHERE id = $1")
        .bind(uuid)
        .fetch_one(&cluster.pool)
        .await
        .expect("worker")
}

fn operations(cluster: &Cluster, id: &str) -> Vec<Value> {
    let (status, list) = cluster.call("GET", &format!("/api/v1/sandboxes/{id}/operations"), None);
    assert_eq!(status, 200, "{list}");
    list["operations"].as_array().expect("operations").clone()
}

/// The main story: created through the queue, exec and files, every receipt on a
/// snapshot; stopped (files kept, processes gone) and resumed on another worker.
#[tokio::test]
async fn a_sandbox_runs_stops_and_resumes_on_another_worker() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-life", 1, Settings::default()).await;
    let id = create(&cluster, json!({"agent": "coder"}));
    let running = wait_state(&cluster, &id, "running");
    assert_eq!(running["persistent"], true);
    assert_eq!(running["timeout_sec"], 3600);
    assert_eq!(running["durability"], "local_only");
    assert_eq!(worker_of(&cluster, &id).await.as_deref(), Some("w1"));

    let marker = format!(
        "sleep 1000.{}",
        uuid::Uuid::new_v4().as_u128() % 1_000_000_000
    );
    let (status, receipt) = exec(
        &cluster,
        &id,
        &format!("echo one > a.txt; mkdir -p dir; echo out; ({marker} &) ; true"),
    );
    assert_eq!(status, 200, "{receipt}");
    assert_eq!(receipt["state"], "done", "{receipt}");
    assert_eq!(receipt["result"]["exit_code"], 0, "{receipt}");
    assert_eq!(receipt["result"]["stdout"], "out\n", "{receipt}");
    assert!(
        receipt["snapshot_id"].is_string(),
        "a receipt on a durable tree: {receipt}"
    );

    let (status, body) = raw(
        &cluster,
        "PUT",
        &format!("/api/v1/sandboxes/{id}/files/content?path=dir/b.bin"),
        b"bytes\x00\xff",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, content) = file(&cluster, &id, "dir/b.bin");
    assert_eq!(
        (status, content.as_slice()),
        (200, b"bytes\x00\xff".as_slice())
    );
    let (status, listing) =
        cluster.call("GET", &format!("/api/v1/sandboxes/{id}/files?path=."), None);
    assert_eq!(status, 200, "{listing}");
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["a.txt", "dir"], "{listing}");
    let (status, missing) = file(&cluster, &id, "nothing-here");
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&missing));

    assert_eq!(cluster.metric(0, "cairn_worker_sandboxes_hosted"), 1.0);
    assert_eq!(
        cluster.metric(0, "cairn_worker_sandbox_operations_total{kind=\"exec\"}"),
        1.0
    );
    let (status, stopped) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(stopped["state"], "stopped");
    assert_eq!(stopped["stop_reason"], "requested");
    // The slot is released as the hosting ends, just after the stop is recorded.
    cluster.wait_until("its slot is released", LONG, || {
        cluster.metric(0, "cairn_worker_sandboxes_hosted") == 0.0
    });
    assert_eq!(
        cluster.metric(0, "cairn_worker_sandbox_stops_total{reason=\"stopped\"}"),
        1.0
    );
    assert!(stopped["stop_snapshot_id"].is_string(), "{stopped}");
    assert!(
        processes_with(&marker).is_empty(),
        "stop ends every process"
    );

    // The first worker goes; the sandbox resumes on another, from its stop snapshot.
    cluster.workers[0]
        .process
        .signal(nix::sys::signal::Signal::SIGTERM);
    assert!(cluster.workers[0].process.wait_exit(LONG).is_some());
    cluster.add_worker();
    let (status, resumed) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/resume"), None);
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["state"], "running");
    assert_eq!(worker_of(&cluster, &id).await.as_deref(), Some("w2"));
    let (status, content) = file(&cluster, &id, "a.txt");
    assert_eq!((status, content.as_slice()), (200, b"one\n".as_slice()));
    let (_, content) = file(&cluster, &id, "dir/b.bin");
    assert_eq!(content, b"bytes\x00\xff");
    assert!(
        processes_with(&marker).is_empty(),
        "processes do not survive a stop"
    );

    // Every operation is journaled: an intent (its epoch) and a receipt; those that
    // may change the tree stand on a snapshot.
    let journal = operations(&cluster, &id);
    let kinds: Vec<&str> = journal.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        ["exec", "write", "read", "list", "read", "read", "read"]
    );
    for operation in &journal {
        assert_eq!(operation["state"], "done", "{operation}");
        assert!(operation["lease_epoch"].is_i64(), "{operation}");
        if operation["kind"] == "exec" || operation["kind"] == "write" {
            assert!(operation["snapshot_id"].is_string(), "{operation}");
        }
    }

    let (status, destroyed) = cluster.call("DELETE", &format!("/api/v1/sandboxes/{id}"), None);
    assert_eq!(status, 200, "{destroyed}");
    assert_eq!(destroyed["state"], "destroyed");
    let (status, refused) = exec(&cluster, &id, "true");
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["field"], "state");
}

/// A worker SIGKILLed mid-exec: the sandbox is stopped (`worker_lost`) at its last
/// durable tree, the exec has no receipt, and resume elsewhere has every file an exec
/// with a receipt wrote.
#[tokio::test]
async fn a_worker_killed_mid_exec_leaves_the_sandbox_stopped_at_its_last_durable_tree() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-lost", 1, Settings::default()).await;
    let id = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &id, "running");
    let (status, first) = exec(&cluster, &id, "echo kept > kept.txt");
    assert_eq!((status, &first["state"]), (200, &json!("done")), "{first}");
    let (api, path) = (cluster.api, format!("/api/v1/sandboxes/{id}/exec"));
    let slow = std::thread::spawn(move || {
        cairn_e2e::request(
            api,
            "POST",
            &path,
            Some(ADMIN),
            Some(&json!({"argv": ["sh", "-c", "echo lost > lost.txt; sleep 30"]})),
        )
    });
    cluster.wait_until("the second exec runs", LONG, || {
        operations(&cluster, &id)
            .iter()
            .any(|o| o["state"] == "running")
    });
    cluster.workers[0]
        .process
        .signal(nix::sys::signal::Signal::SIGKILL);
    let stopped = wait_state(&cluster, &id, "stopped");
    assert_eq!(stopped["stop_reason"], "worker_lost", "{stopped}");
    let answer = slow.join().expect("thread").expect("reply");
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["state"], "interrupted", "{}", answer.body);

    // Its one workspace row is on no worker's directory any more: no janitor takes it
    // for a leftover of its own to destroy (which the reaper would follow).
    let tree_row: (String, Option<uuid::Uuid>) = sqlx::query_as(
        "SELECT w.state, w.directory_id FROM workspaces w JOIN sandboxes s ON s.workspace_id = w.id
          WHERE s.id = $1",
    )
    .bind(uuid::Uuid::parse_str(&id).expect("uuid"))
    .fetch_one(&cluster.pool)
    .await
    .expect("workspace");
    assert_eq!(tree_row, ("stopped".to_string(), None));
    cluster.add_worker();
    let (status, resumed) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/resume"), None);
    assert_eq!(status, 200, "{resumed}");
    let (status, kept) = file(&cluster, &id, "kept.txt");
    assert_eq!((status, kept.as_slice()), (200, b"kept\n".as_slice()));
    let (status, _) = file(&cluster, &id, "lost.txt");
    assert_eq!(
        status, 404,
        "an exec without a receipt left nothing durable"
    );
}

/// Resume honours `Idempotency-Key` (one effect; other input is a 409), a
/// non-persistent sandbox is never resumed by an operation, and a snapshot restores
/// into a new sandbox while its source stays as it was.
#[tokio::test]
async fn resume_is_idempotent_and_a_snapshot_restores_into_a_new_sandbox() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-keys", 1, Settings::default()).await;
    let id = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &id, "running");
    let (status, _) = exec(&cluster, &id, "echo source > s.txt");
    assert_eq!(status, 200);
    let (_, stopped) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    let snapshot = stopped["stop_snapshot_id"]
        .as_str()
        .expect("snapshot")
        .to_string();

    let resume = |key: &str, body: &[u8]| {
        let response = exchange(
            cluster.api,
            "POST",
            &format!("/api/v1/sandboxes/{id}/resume"),
            &[
                format!("Authorization: Bearer {ADMIN}"),
                format!("Idempotency-Key: {key}"),
            ],
            Some("application/json"),
            body,
        )
        .expect("resume");
        let text = String::from_utf8_lossy(&response).to_string();
        let status: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, text)
    };
    let (status, first) = resume("resume-1", b"");
    assert_eq!(status, 200, "{first}");
    let (status, again) = resume("resume-1", b"");
    assert_eq!(status, 200, "{again}");
    assert!(
        again
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{again}"
    );
    let (status, other) = resume("resume-1", br#"{"disk_mb": 20480}"#);
    assert_eq!(status, 409, "{other}");
    let uuid = uuid::Uuid::parse_str(&id).expect("uuid");
    let placements: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE payload->>'request_id' = $1")
            .bind(uuid.to_string())
            .fetch_one(&cluster.pool)
            .await
            .expect("count");
    assert_eq!(placements, 2, "one placement at create, one for the resume");

    // A new sandbox from the stop snapshot: the source's files, the source unchanged.
    let copy = create(
        &cluster,
        json!({"agent": "coder", "source": format!("snapshot:{snapshot}"), "persistent": false}),
    );
    wait_state(&cluster, &copy, "running");
    let (_, content) = file(&cluster, &copy, "s.txt");
    assert_eq!(content, b"source\n");
    let (status, _) = exec(&cluster, &copy, "echo changed > s.txt");
    assert_eq!(status, 200);
    let (_, original) = file(&cluster, &id, "s.txt");
    assert_eq!(original, b"source\n", "the source never changes");

    // Stopped and not persistent: an operation does not resume it.
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{copy}/stop"), None);
    assert_eq!(status, 200);
    let (status, refused) = exec(&cluster, &copy, "true");
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "not_persistent");
    // A persistent one is resumed by the operation.
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    assert_eq!(status, 200);
    let (status, woke) = exec(&cluster, &id, "cat s.txt");
    assert_eq!(status, 200, "{woke}");
    assert_eq!(woke["result"]["stdout"], "source\n");
    assert_eq!(show(&cluster, &id)["state"], "running");
}

/// Idle-anchored timeouts: a persistent sandbox is stopped (its disk kept), a
/// non-persistent one destroyed, and `always_on` keeps one running.
#[tokio::test]
async fn timeouts_stop_a_persistent_sandbox_and_destroy_a_non_persistent_one() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-timeouts", 1, Settings::default()).await;
    let kept = create(&cluster, json!({"agent": "coder", "timeout_sec": 3}));
    let gone = create(
        &cluster,
        json!({"agent": "coder", "persistent": false, "idle_timeout_sec": 2}),
    );
    let on = create(
        &cluster,
        json!({"agent": "coder", "timeout_sec": 1, "idle_timeout_sec": 1, "always_on": true}),
    );
    for id in [&kept, &gone, &on] {
        cluster.wait_until("running", LONG, || {
            ["running", "stopped", "destroyed"]
                .contains(&show(&cluster, id)["state"].as_str().unwrap_or(""))
        });
    }
    let (status, _) = exec(&cluster, &kept, "echo durable > t.txt");
    assert_eq!(status, 200);
    let stopped = wait_state(&cluster, &kept, "stopped");
    assert_eq!(stopped["stop_reason"], "timeout", "{stopped}");
    assert!(stopped["stop_snapshot_id"].is_string(), "{stopped}");
    let destroyed = wait_state(&cluster, &gone, "destroyed");
    assert!(destroyed["destroyed_at"].is_string(), "{destroyed}");
    assert_eq!(
        show(&cluster, &on)["state"],
        "running",
        "always_on disables both"
    );
    let (status, content) = file(&cluster, &kept, "t.txt");
    assert_eq!(
        (status, content.as_slice()),
        (200, b"durable\n".as_slice()),
        "a timeout keeps the disk"
    );
}

fn post_keyed(cluster: &Cluster, path: &str, key: &str, body: &Value) -> (u16, Value, bool) {
    let response = exchange(
        cluster.api,
        "POST",
        path,
        &[
            format!("Authorization: Bearer {ADMIN}"),
            format!("Idempotency-Key: {key}"),
        ],
        Some("application/json"),
        body.to_string().as_bytes(),
    )
    .expect("request");
    let text = String::from_utf8_lossy(&response).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let replayed = head
        .to_ascii_lowercase()
        .contains("idempotent-replayed: true");
    (
        status,
        serde_json::from_str(body).unwrap_or(Value::Null),
        replayed,
    )
}

/// Fork: one capture for a fan-out of three, the source running and unchanged, each
/// fork its own (diverging, no copy of the source's identity); a key retried makes no
/// more. Named snapshots: restore into a new sandbox; delete leaves it unaffected.
#[tokio::test]
async fn forks_and_snapshots_make_new_sandboxes_and_leave_the_source_alone() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-fork", 2, Settings::default()).await;
    let source = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &source, "running");
    let (status, _) = exec(
        &cluster,
        &source,
        "echo base > a.txt; mkdir -p etc; echo source-id > etc/machine-id",
    );
    assert_eq!(status, 200);

    let (status, named) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{source}/snapshots"),
        Some(&json!({"name": "before forks"})),
    );
    assert_eq!(status, 201, "{named}");
    assert_eq!(
        (named["status"].as_str(), named["kind"].as_str()),
        (Some("ready"), Some("named"))
    );
    assert_eq!(named["name"], "before forks");

    let path = format!("/api/v1/sandboxes/{source}/fork");
    let (status, forked, replayed) = post_keyed(&cluster, &path, "branch-1", &json!({"count": 3}));
    assert_eq!(status, 201, "{forked}");
    assert!(!replayed);
    let forks: Vec<String> = forked["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .map(|s| s["sandbox_id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(forks.len(), 3, "{forked}");
    assert!(forked["source_frozen_ms"].is_i64(), "{forked}");
    let (status, again, replayed) = post_keyed(&cluster, &path, "branch-1", &json!({"count": 3}));
    assert_eq!(status, 201, "{again}");
    assert!(replayed, "the same key answers the same forks");
    assert_eq!(again["snapshot_id"], forked["snapshot_id"]);
    let (status, _, _) = post_keyed(&cluster, &path, "branch-1", &json!({"count": 2}));
    assert_eq!(status, 409, "the same key with other input");
    let source_uuid = uuid::Uuid::parse_str(&source).expect("uuid");
    let (made, captures): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM sandboxes WHERE forked_from = $1),
                (SELECT count(*) FROM project_snapshots WHERE sandbox_id = $1 AND kind = 'fork')",
    )
    .bind(source_uuid)
    .fetch_one(&cluster.pool)
    .await
    .expect("counts");
    assert_eq!(
        (made, captures),
        (3, 1),
        "three forks from one capture, once"
    );

    for (i, fork) in forks.iter().enumerate() {
        wait_state(&cluster, fork, "running");
        let (_, base) = file(&cluster, fork, "a.txt");
        assert_eq!(base, b"base\n");
        let (status, _) = file(&cluster, fork, "etc/machine-id");
        assert_eq!(status, 404, "a fork keeps no copy of the source's identity");
        let (status, _) = exec(&cluster, fork, &format!("echo {i} > mine.txt"));
        assert_eq!(status, 200);
    }
    for (i, fork) in forks.iter().enumerate() {
        let (_, mine) = file(&cluster, fork, "mine.txt");
        assert_eq!(
            mine,
            format!("{i}\n").as_bytes(),
            "each fork diverges on its own"
        );
    }
    assert_eq!(
        show(&cluster, &source)["state"],
        "running",
        "the source keeps running"
    );
    let (status, _) = file(&cluster, &source, "mine.txt");
    assert_eq!(status, 404, "the source is unchanged");
    let (_, identity) = file(&cluster, &source, "etc/machine-id");
    assert_eq!(identity, b"source-id\n");

    // Restore the named snapshot into a new sandbox; then delete the snapshot.
    let snapshot = named["snapshot_id"].as_str().expect("id");
    let (status, restored) = cluster.call(
        "POST",
        &format!("/api/v1/snapshots/{snapshot}/restore"),
        None,
    );
    assert_eq!(status, 201, "{restored}");
    let restored = restored["sandbox_id"].as_str().expect("id").to_string();
    wait_state(&cluster, &restored, "running");
    let (status, deleted) = cluster.call("DELETE", &format!("/api/v1/snapshots/{snapshot}"), None);
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["status"], "deleted");
    let (status, refused) = cluster.call(
        "POST",
        &format!("/api/v1/snapshots/{snapshot}/restore"),
        None,
    );
    assert_eq!(status, 409, "a deleted snapshot is not restored: {refused}");
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{restored}/stop"), None);
    assert_eq!(status, 200);
    let (status, resumed) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{restored}/resume"),
        None,
    );
    assert_eq!(status, 200, "{resumed}");
    let (_, base) = file(&cluster, &restored, "a.txt");
    assert_eq!(
        base, b"base\n",
        "a sandbox restored from a deleted snapshot is unaffected"
    );

    let (status, listed) = cluster.call(
        "GET",
        &format!("/api/v1/snapshots?sandbox_id={source}"),
        None,
    );
    assert_eq!(status, 200, "{listed}");
    let kinds: Vec<&str> = listed["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .filter_map(|s| s["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["fork", "named"], "{listed}");
}

/// `cairnctl sandbox` and `cairnctl snapshot` drive every sandbox route.
#[tokio::test]
async fn cairnctl_drives_sandboxes_and_snapshots() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-cli", 1, Settings::default()).await;
    let ctl = |args: &[&str]| {
        let output = std::process::Command::new(cairn_e2e::binary("cairnctl"))
            .args(args)
            .env("CAIRN_SERVER", format!("http://{}", cluster.api))
            .env("CAIRN_TOKEN", ADMIN)
            .output()
            .expect("cairnctl");
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let json = |args: &[&str]| {
        let (code, out, err) = ctl(args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
        serde_json::from_str::<Value>(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    };
    let created = json(&[
        "sandbox",
        "create",
        "--agent",
        "coder",
        "--timeout-sec",
        "600",
        "--json",
    ]);
    let id = created["sandbox_id"].as_str().expect("id").to_string();
    wait_state(&cluster, &id, "running");

    let (code, out, err) = ctl(&[
        "sandbox",
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo hi; echo oops >&2; exit 3",
    ]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (3, "hi\n", "oops\n"),
        "the command's status and output"
    );
    let local = cluster.dir.join("upload.txt");
    std::fs::write(&local, b"from a file\n").expect("local");
    let (code, out, err) = ctl(&[
        "sandbox",
        "files",
        "write",
        &id,
        "notes/n.txt",
        local.to_str().expect("path"),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = ctl(&["sandbox", "files", "read", &id, "notes/n.txt"]);
    assert_eq!((code, out.as_str()), (0, "from a file\n"));
    let (code, out, _) = ctl(&["sandbox", "files", "list", &id]);
    assert!(code == 0 && out.contains("notes"), "{out}");

    let saved = json(&["snapshot", "save", &id, "first", "--json"]);
    assert_eq!(saved["status"], "ready", "{saved}");
    let snapshot = saved["snapshot_id"].as_str().expect("snapshot").to_string();
    let listed = json(&["snapshot", "list", "--sandbox", &id, "--json"]);
    assert_eq!(
        listed["snapshots"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    let info = json(&["snapshot", "info", &snapshot, "--json"]);
    assert_eq!(info["name"], "first");
    let forked = json(&["sandbox", "fork", &id, "--count", "2", "--json"]);
    assert_eq!(
        forked["sandboxes"].as_array().map(Vec::len),
        Some(2),
        "{forked}"
    );
    let restored = json(&["snapshot", "restore", &snapshot, "--json"]);
    assert_eq!(restored["source"], format!("snapshot:{snapshot}"));
    let deleted = json(&["snapshot", "delete", &snapshot, "--json"]);
    assert_eq!(deleted["status"], "deleted");

    let paused = json(&["sandbox", "pause", &id, "--json"]);
    assert_eq!(paused["state"], "paused", "{paused}");
    let thawed = json(&["sandbox", "resume", &id, "--json"]);
    assert_eq!(thawed["state"], "running", "{thawed}");
    let stopped = json(&["sandbox", "stop", &id, "--json"]);
    assert_eq!(stopped["state"], "stopped", "{stopped}");
    let resumed = json(&[
        "sandbox",
        "resume",
        &id,
        "--idempotency-key",
        "r1",
        "--json",
    ]);
    assert_eq!(resumed["state"], "running", "{resumed}");
    let extended = json(&["sandbox", "extend", &id, "--timeout-sec", "900", "--json"]);
    assert_eq!(extended["timeout_sec"], 900);
    let (code, out, _) = ctl(&["sandbox", "operations", &id]);
    assert!(
        code == 0 && out.contains("exit 3") && out.contains("snapshot"),
        "{out}"
    );
    let (code, out, _) = ctl(&["sandbox", "list"]);
    assert!(code == 0 && out.contains(&id), "{out}");
    let destroyed = json(&["sandbox", "destroy", &id, "--json"]);
    assert_eq!(destroyed["state"], "destroyed");
    let (code, _, err) = ctl(&["sandbox", "exec", &id, "--", "true"]);
    assert_eq!(code, 4, "a destroyed sandbox is a conflict: {err}");
}

/// What one exec starts in the background keeps running for the next; pause freezes
/// it in place (a counter outside the tree stops growing) and resume continues it; a
/// pause past its limit behaves like a stop (processes gone, files kept).
#[tokio::test]
async fn pause_freezes_processes_in_place_and_its_limit_behaves_like_a_stop() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-pause", 0, Settings::default()).await;
    cluster
        .worker_env
        .push(("CAIRN_PAUSE_LIMIT_SECONDS".into(), "3".into()));
    cluster.add_worker();
    let id = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &id, "running");
    let counter = cluster.path("counter");
    let marker = format!("sleep 0.1{}", uuid::Uuid::new_v4().as_u128() % 1_000_000);
    let (status, started) = exec(
        &cluster,
        &id,
        &format!("(while :; do echo x >> {counter}; {marker}; done) > /dev/null 2>&1 &"),
    );
    assert_eq!(
        (status, &started["result"]["exit_code"]),
        (200, &json!(0)),
        "{started}"
    );
    let count = || cluster.lines("counter").len();
    let first = count();
    std::thread::sleep(Duration::from_millis(800));
    assert!(count() > first, "the background process outlives its exec");
    let (status, _) = exec(&cluster, &id, "echo later > later.txt");
    assert_eq!(status, 200);

    let (status, paused) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/pause"), None);
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["state"], "paused");
    std::thread::sleep(Duration::from_millis(300));
    let frozen = count();
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(count(), frozen, "a paused sandbox's processes do not run");
    assert!(
        !processes_with(&marker).is_empty(),
        "they are frozen, not gone"
    );
    let (status, again) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/pause"), None);
    assert_eq!(status, 409, "pause needs running: {again}");

    let (status, resumed) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/resume"), None);
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["state"], "running");
    std::thread::sleep(Duration::from_millis(800));
    assert!(count() > frozen, "resume continues them in place");

    // Paused past the limit (3 s here): a stop, with its snapshot; processes gone.
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/pause"), None);
    assert_eq!(status, 200);
    let stopped = wait_state(&cluster, &id, "stopped");
    assert_eq!(stopped["stop_reason"], "pause_expired", "{stopped}");
    cluster.wait_until("the processes end", LONG, || {
        processes_with(&marker).is_empty()
    });
    let settled = count();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(count(), settled, "nothing runs after the stop");
    let (_, later) = file(&cluster, &id, "later.txt");
    assert_eq!(
        later, b"later\n",
        "the files survive (an operation resumes it)"
    );
    assert!(
        processes_with(&marker).is_empty(),
        "processes do not survive a stop"
    );
}

/// A command entering a sandbox's held namespaces has what a step has and no more: the
/// unprivileged uid, no capabilities, `no_new_privs`, only its sandbox's processes, no
/// worker environment, its network only when asked, and a working directory beneath
/// the tree.
#[tokio::test]
async fn an_exec_in_a_sandbox_has_no_authority_beyond_its_tree() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-authority", 0, Settings::default()).await;
    cluster.worker_env.push((
        "AWS_SECRET_ACCESS_KEY".into(),
        "plain-worker-secret-7781".into(),
    ));
    cluster.add_worker();
    let id = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &id, "running");
    let probe = "id -u; grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status; \
                 ls /proc | grep -E '^[0-9]+$' | wc -l; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; \
                 cat /sys/class/net/*/address 2>/dev/null | wc -l; pwd";
    let (status, seen) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(&json!({"argv": ["sh", "-c", "mkdir -p sub"], "timeout_sec": 30})),
    );
    assert_eq!(status, 200, "{seen}");
    let (status, seen) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(&json!({"argv": ["sh", "-c", probe], "cwd": "sub", "network": false})),
    );
    assert_eq!(status, 200, "{seen}");
    let out = seen["result"]["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"1000"), "{out}");
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.contains("CapPrm:\t0000000000000000"), "{out}");
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    let processes: usize = lines
        .get(4)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(99);
    assert!(processes <= 8, "only the sandbox's own processes: {out}");
    assert!(
        !out.contains("plain-worker-secret"),
        "no worker environment: {out}"
    );
    assert_eq!(lines.last(), Some(&"/workspace/sub"), "{out}");
    let (_, with) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(&json!({"argv": ["sh", "-c", "tail -n +3 /proc/net/dev | wc -l"], "network": true})),
    );
    let (_, without) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(&json!({"argv": ["sh", "-c", "tail -n +3 /proc/net/dev | wc -l"], "network": false})),
    );
    let interfaces = |v: &Value| {
        v["result"]["stdout"]
            .as_str()
            .unwrap_or("")
            .trim()
            .parse::<u32>()
            .unwrap_or(0)
    };
    assert_eq!(
        interfaces(&without),
        1,
        "network:false has its own loopback only: {without}"
    );
    assert!(interfaces(&with) > 1, "network:true has the host's: {with}");
    let (status, refused) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(&json!({"argv": ["true"], "cwd": "../.."})),
    );
    assert_eq!(status, 422, "{refused}");
}

/// The reaper's sandbox rules, by time travel, on the snapshots real sandboxes made:
/// only the latest stop snapshot stays; named snapshots stay until deleted; a
/// destroyed sandbox's stop, fork and checkpoints go (bytes too) after the 24-hour
/// grace, while a fork (its own first checkpoint) keeps its tree.
#[tokio::test]
async fn the_reapers_sandbox_rules_act_on_real_sandbox_snapshots() {
    use cairn_reaper::retention::{Durations, Sweep};
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-reaper", 1, Settings::default()).await;
    let id = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &id, "running");
    let (status, _) = exec(&cluster, &id, "echo one > a.txt");
    assert_eq!(status, 200);
    let (_, first) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    let (status, _) = exec(&cluster, &id, "echo two >> a.txt");
    assert_eq!(status, 200, "the operation resumes it");
    let (_, named) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/snapshots"),
        Some(&json!({"name": "keep"})),
    );
    let (status, forked) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/fork"), None);
    assert_eq!(status, 201, "{forked}");
    let fork = forked["sandboxes"][0]["sandbox_id"]
        .as_str()
        .expect("fork")
        .to_string();
    wait_state(&cluster, &fork, "running");
    let (_, second) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    let (status, _) = cluster.call("DELETE", &format!("/api/v1/sandboxes/{id}"), None);
    assert_eq!(status, 200);

    let uuid = |v: &Value| uuid::Uuid::parse_str(v.as_str().expect("id")).expect("uuid");
    let (first, second) = (
        uuid(&first["stop_snapshot_id"]),
        uuid(&second["stop_snapshot_id"]),
    );
    let (named, fork_capture) = (uuid(&named["snapshot_id"]), uuid(&forked["snapshot_id"]));
    let state = |id: uuid::Uuid| {
        let pool = cluster.pool.clone();
        async move {
            sqlx::query_as::<_, (String, String)>(
                "SELECT status, retention FROM project_snapshots WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .expect("snapshot")
        }
    };
    let sweep = |at: chrono::DateTime<chrono::Utc>| {
        let pool = cluster.pool.clone();
        async move {
            Sweep {
                pool: &pool,
                now: at,
                durations: &Durations::default(),
                batch: 1000,
                dry_run: false,
            }
            .run()
            .await
            .expect("sweep")
        }
    };
    let now = chrono::Utc::now();
    sweep(now + chrono::Duration::hours(1)).await;
    assert_eq!(
        state(first).await.1,
        "superseded",
        "only the latest stop snapshot stays"
    );
    assert_eq!(
        state(second).await.1,
        "current",
        "within the grace of the destroy"
    );
    assert_eq!(state(fork_capture).await.1, "current");
    sweep(now + chrono::Duration::hours(25)).await;
    assert_eq!(
        state(second).await,
        ("deleted".into(), "reclaimed".into()),
        "a destroyed sandbox's snapshots go after the 24-hour grace"
    );
    assert_eq!(
        state(fork_capture).await,
        ("deleted".into(), "reclaimed".into())
    );
    assert_eq!(
        state(named).await.1,
        "current",
        "named snapshots stay until deleted"
    );
    let checkpoints: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM project_snapshots WHERE sandbox_id = $1 AND kind = 'checkpoint' AND retention = 'current'",
    )
    .bind(uuid::Uuid::parse_str(&id).expect("uuid"))
    .fetch_one(&cluster.pool)
    .await
    .expect("count");
    assert_eq!(checkpoints, 0, "its checkpoints go with it");

    // The fork owns its tree: stopped and resumed, it still has every file.
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{fork}/stop"), None);
    assert_eq!(status, 200);
    let (status, content) = file(&cluster, &fork, "a.txt");
    assert_eq!(
        (status, content.as_slice()),
        (200, b"one\ntwo\n".as_slice())
    );
}

/// A worker told to stop (SIGTERM: a rollout, a scale-down) stops the sandboxes it
/// holds at once, each with its stop snapshot (`worker_drained`), and exits without
/// waiting out its drain time; another worker resumes them with their files.
#[tokio::test]
async fn a_draining_worker_stops_its_sandboxes_for_another_to_resume() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start(
        "sandbox-drain",
        1,
        Settings {
            drain_seconds: 60,
            ..Settings::default()
        },
    )
    .await;
    let id = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &id, "running");
    let (status, _) = exec(&cluster, &id, "echo kept > kept.txt; (sleep 1000 &)");
    assert_eq!(status, 200);
    let started = std::time::Instant::now();
    cluster.workers[0]
        .process
        .signal(nix::sys::signal::Signal::SIGTERM);
    assert!(cluster.workers[0].process.wait_exit(LONG).is_some());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a held sandbox does not wait out the drain time: {:?}",
        started.elapsed()
    );
    let stopped = show(&cluster, &id);
    assert_eq!(
        (stopped["state"].as_str(), stopped["stop_reason"].as_str()),
        (Some("stopped"), Some("worker_drained")),
        "{stopped}"
    );
    cluster.add_worker();
    let (status, content) = file(&cluster, &id, "kept.txt");
    assert_eq!((status, content.as_slice()), (200, b"kept\n".as_slice()));
}

/// A sandbox whose tree cannot be prepared (its repository cannot be cloned) ends in
/// `error` with the reason; deleting the record destroys it.
#[tokio::test]
async fn a_sandbox_that_cannot_be_prepared_ends_in_error_and_its_record_is_deleted() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-error", 1, Settings::default()).await;
    let missing = cluster.dir.join("no-such-repository");
    let id = create(
        &cluster,
        json!({"agent": "coder", "repository": missing.to_string_lossy()}),
    );
    let failed = wait_state(&cluster, &id, "error");
    let reason = failed["error_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("clone"),
        "the reason says what failed: {failed}"
    );
    let (status, refused) = exec(&cluster, &id, "true");
    assert_eq!(status, 409, "{refused}");
    let (status, deleted) = cluster.call("DELETE", &format!("/api/v1/sandboxes/{id}"), None);
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["state"], "destroyed");
}

/// Cairn keeps no memory checkpoint: a pause that outlives its worker resumes from the
/// disk, on any worker, without its processes.
#[tokio::test]
async fn a_pause_that_outlives_its_worker_resumes_from_the_disk() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-pause-lost", 1, Settings::default()).await;
    let id = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &id, "running");
    let marker = format!("sleep 0.1{}", uuid::Uuid::new_v4().as_u128() % 1_000_000);
    let (status, _) = exec(
        &cluster,
        &id,
        &format!("echo kept > kept.txt; (while :; do {marker}; done) > /dev/null 2>&1 &"),
    );
    assert_eq!(status, 200);
    let (status, paused) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/pause"), None);
    assert_eq!(
        (status, &paused["state"]),
        (200, &json!("paused")),
        "{paused}"
    );
    cluster.workers[0]
        .process
        .signal(nix::sys::signal::Signal::SIGKILL);
    // Reaped, as its pod would be: a worker's start ends what a dead worker's frozen
    // sandbox left.
    assert!(cluster.workers[0].process.wait_exit(LONG).is_some());
    let stopped = wait_state(&cluster, &id, "stopped");
    assert_eq!(stopped["stop_reason"], "worker_lost", "{stopped}");
    cluster.add_worker();
    let (status, resumed) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/resume"), None);
    assert_eq!(
        (status, &resumed["state"]),
        (200, &json!("running")),
        "{resumed}"
    );
    let (_, kept) = file(&cluster, &id, "kept.txt");
    assert_eq!(kept, b"kept\n", "the disk survives");
    cluster.wait_until("the frozen processes of the lost worker end", LONG, || {
        processes_with(&marker).is_empty()
    });
}
