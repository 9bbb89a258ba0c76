//! Sandboxes (the lifecycle seed) end to end, on the real binaries: placement through
//! the queue, exec and files journaled on durable trees, stop and resume on another
//! worker, a worker lost mid-exec or drained, pause, timeouts, what an exec may do.

use cairn_e2e::cluster::{Cluster, Settings, ADMIN};
use cairn_e2e::sandboxes::*;
use cairn_e2e::{processes_with, ServiceLock};
use serde_json::{json, Value};
use std::time::Duration;

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

/// What one exec starts in the background keeps running for the next; pause freezes
/// it in place (a counter outside the tree stops growing) and resume continues it; a
/// pause past its limit behaves like a stop (processes gone, files kept).
#[tokio::test]
async fn pause_freezes_processes_in_place_and_its_limit_behaves_like_a_stop() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-pause", 0, Settings::default()).await;
    cluster
        .worker_env
        // Well above the first pause's 1.3 s of checks, so only the last pause expires.
        .push(("CAIRN_PAUSE_LIMIT_SECONDS".into(), "8".into()));
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

    // Paused past the limit (8 s here): a stop, with its snapshot; processes gone.
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
    assert!(interfaces(&with) > 1, "network:true has its NAT: {with}");
    let (status, refused) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(&json!({"argv": ["true"], "cwd": "../.."})),
    );
    assert_eq!(status, 422, "{refused}");
}

/// A worker told to stop (SIGTERM: a rollout, a scale-down) stops the sandboxes it
/// holds at once, each with its stop snapshot (`worker_drained`), and exits without
/// waiting out its drain time, even for an exec waiting for input in a paused sandbox;
/// another worker resumes them with their files.
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
    // An exec waiting for input, paused with the rest: it holds up no drain either.
    let (status, open) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec?wait=false"),
        Some(&json!({"argv": ["cat"], "stdin": true, "timeout_sec": 600})),
    );
    assert_eq!(status, 202, "{open}");
    let open = format!(
        "/api/v1/sandboxes/{id}/operations/{}",
        open["operation_id"].as_str().expect("id")
    );
    cluster.wait_until("the exec runs", LONG, || {
        cluster.call("GET", &open, None).1["state"] == "running"
    });
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/pause"), None);
    assert_eq!(status, 200);
    wait_state(&cluster, &id, "paused");
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
    let (_, ended) = cluster.call("GET", &open, None);
    assert_eq!(ended["result"]["stopped"], true, "{ended}");
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

/// An upload never follows a link the agent left in its home: an exec links the name
/// the content used to be staged under (and a few others) to a root-owned host file,
/// and the next upload lands in the tree while the host file keeps its bytes and mode.
#[tokio::test]
async fn an_upload_never_writes_through_a_link_the_agent_planted() {
    use std::os::unix::fs::PermissionsExt;
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-upload-link", 0, Settings::default()).await;
    cluster.add_worker();
    let victim = std::env::temp_dir().join(format!("cairn-victim-{}", uuid::Uuid::new_v4()));
    std::fs::write(&victim, "the host's own").expect("victim");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).expect("mode");
    let id = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &id, "running");
    let plant = format!(
        "for n in .cairn-upload .cairn-upload-0 upload; do ln -sf {} \"$HOME/$n\"; done",
        victim.display()
    );
    let (status, seen) = exec(&cluster, &id, &plant);
    assert_eq!(status, 200, "{seen}");
    let (status, body) = raw(
        &cluster,
        "PUT",
        &format!("/api/v1/sandboxes/{id}/files/content?path=landed.txt"),
        b"uploaded bytes",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(file(&cluster, &id, "landed.txt").1, b"uploaded bytes");
    assert_eq!(std::fs::read(&victim).expect("victim"), b"the host's own");
    let mode = std::fs::metadata(&victim)
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the host file's mode is unchanged");
    let _ = std::fs::remove_file(victim);
}

/// A sandbox's `disk_mb` is its tree's quota: an exec writing past it fails with
/// `disk_quota`; resumed with a larger `disk_mb`, the tree keeps its files and has the
/// larger room.
#[tokio::test]
async fn a_sandboxs_disk_mb_is_its_quota_and_grows_on_resume() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-disk", 0, Settings::default()).await;
    cluster
        .worker_env
        .push(("CAIRN_DISK_QUOTA".into(), "required".into()));
    cluster.add_worker();
    let id = create(&cluster, json!({"agent": "coder", "disk_mb": 64}));
    wait_state(&cluster, &id, "running");
    let exec = |script: &str| {
        let (status, seen) = cluster.call(
            "POST",
            &format!("/api/v1/sandboxes/{id}/exec"),
            Some(&json!({"argv": ["sh", "-c", script], "timeout_sec": 60})),
        );
        assert_eq!(status, 200, "{seen}");
        seen["result"].clone()
    };
    let full = exec("echo kept > kept.txt; dd if=/dev/zero of=big bs=1M count=100 conv=fsync");
    assert_eq!(full["limit"], "disk_quota", "{full}");
    assert!(
        full["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("Disk quota exceeded"),
        "{full}"
    );
    let freed = exec("rm -f big");
    assert_eq!(freed["exit_code"], 0, "{freed}");
    let (status, stopped) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    assert_eq!(status, 200, "{stopped}");
    let (status, resumed) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/resume"),
        Some(&json!({"disk_mb": 256})),
    );
    assert_eq!(status, 200, "{resumed}");
    wait_state(&cluster, &id, "running");
    let grown = exec("cat kept.txt && dd if=/dev/zero of=big bs=1M count=100 conv=fsync");
    assert_eq!(grown["exit_code"], 0, "{grown}");
    assert!(
        grown["stdout"].as_str().unwrap_or("").contains("kept"),
        "{grown}"
    );
}

/// While a process the agent left running swaps a directory of the tree for a link to
/// a host directory and back, uploads into it and the captures of every operation
/// never reach the host directory: nothing is written there, and no snapshot holds
/// what it holds.
#[tokio::test]
async fn a_directory_swapped_for_a_link_mid_operation_never_leads_out_of_the_tree() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-swap", 0, Settings::default()).await;
    cluster.add_worker();
    let host = std::env::temp_dir().join(format!("cairn-host-dir-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&host).expect("host dir");
    std::fs::write(host.join("host-secret"), "the host's own").expect("secret");
    let id = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &id, "running");
    // In the step's view the link dangles; on the host it would lead to `host`.
    let swapper = format!(
        "mkdir -p d && echo own > d/own && \
         (end=$(($(date +%s) + 6)); while [ $(date +%s) -lt $end ]; do \
            mv d d.real && ln -s {host} d && rm d && mv d.real d; done) >/dev/null 2>&1 &",
        host = host.display()
    );
    let (status, seen) = exec(&cluster, &id, &swapper);
    assert_eq!(status, 200, "{seen}");
    let started = std::time::Instant::now();
    let mut rounds = 0;
    while started.elapsed() < Duration::from_secs(5) {
        rounds += 1;
        let (status, body) = raw(
            &cluster,
            "PUT",
            &format!("/api/v1/sandboxes/{id}/files/content?path=d/up-{rounds}.txt"),
            b"uploaded",
        );
        // Landed, or refused with a reason (the directory was a link at that moment).
        assert!(
            status == 200 || (400..500).contains(&status),
            "{status}: {}",
            String::from_utf8_lossy(&body)
        );
        let _ = exec(&cluster, &id, "true");
    }
    std::thread::sleep(Duration::from_secs(2));
    let left: Vec<String> = std::fs::read_dir(&host)
        .expect("host dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        vec!["host-secret".to_string()],
        "written into the host dir"
    );
    // No capture of any operation holds the host's file: every manifest in the store.
    let manifests = cluster.dir.join("artifacts/manifests");
    let mut read = 0;
    for file in std::fs::read_dir(&manifests).expect("manifests") {
        let path = file.expect("entry").path();
        let Ok(manifest) = cairn_snapshot::manifest::decode(&std::fs::read(&path).expect("read"))
        else {
            continue;
        };
        read += 1;
        for entry in &manifest.entries {
            assert!(
                !entry.path.ends_with("host-secret"),
                "{} holds {}",
                path.display(),
                entry.path
            );
        }
    }
    assert!(read > 0, "no manifest read");
    // What the captures kept comes back on a resume: the tree's own files only.
    let (status, stopped) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    assert_eq!(status, 200, "{stopped}");
    let (status, resumed) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/resume"), None);
    assert_eq!(status, 200, "{resumed}");
    wait_state(&cluster, &id, "running");
    let (status, listed) = exec(
        &cluster,
        &id,
        "find . -name host-secret | wc -l; find . -name own | wc -l",
    );
    assert_eq!(status, 200, "{listed}");
    let out = listed["result"]["stdout"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        out.starts_with("0\n"),
        "a snapshot holds the host's file: {out}"
    );
    // The swapper and the uploads race each other (a `mv` into a directory that an
    // upload just made), so the tree's own file may have moved; it is still there.
    assert!(
        !out.ends_with("\n0\n"),
        "the tree's own file is gone: {out}"
    );
    let _ = std::fs::remove_dir_all(host);
}

/// A worker's sandboxes have slots of their own: with one job slot and one sandbox
/// slot, a hosted sandbox leaves the job slot to a run, a second sandbox waits for the
/// sandbox slot (not the job slot), and the worker advertises both.
#[tokio::test]
async fn sandboxes_take_sandbox_slots_and_leave_job_slots_to_runs() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("slots", 0, Settings::default()).await;
    cluster.worker_env.extend([
        ("CAIRN_WORKER_CONCURRENCY".to_string(), "1".to_string()),
        ("CAIRN_SANDBOX_SLOTS".to_string(), "1".to_string()),
    ]);
    cluster.add_worker();
    let first = create(&cluster, json!({"agent": "coder", "timeout_sec": 600}));
    wait_state(&cluster, &first, "running");

    let (run_id, _) = cluster.submit(&json!({
        "agent": "coder", "steps": [{"key": "one", "argv": ["true"]}]
    }));
    let run = cluster.wait_for_state(&run_id, &["completed", "failed"], LONG);
    assert_eq!(
        run["state"], "completed",
        "a run beside a hosted sandbox: {run}"
    );

    let second = create(&cluster, json!({"agent": "coder", "timeout_sec": 600}));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        show(&cluster, &second)["state"],
        "creating",
        "the sandbox slot is taken"
    );
    let (status, workers) = cluster.call("GET", "/api/v1/workers", None);
    assert_eq!(status, 200, "{workers}");
    let worker = &workers["workers"][0];
    assert_eq!(
        (
            &worker["run_slots"],
            &worker["sandbox_slots"],
            &worker["sandboxes_hosted"]
        ),
        (&json!(1), &json!(1), &json!(1)),
        "{worker}"
    );

    let (status, stopped) = cluster.call("POST", &format!("/api/v1/sandboxes/{first}/stop"), None);
    assert!(status == 200 || status == 202, "{stopped}");
    wait_state(&cluster, &second, "running");
}

/// Two execs on a fresh sandbox whose worker is armed with the fault points `points`:
/// both end `done`, and their file holds both lines. Returns the cluster and the id.
async fn two_execs_survive(label: &str, points: &str) -> (Cluster, String) {
    let mut cluster = Cluster::start(label, 0, Settings::default()).await;
    cluster
        .worker_env
        .push(("CAIRN_FAULT_POINTS".into(), points.into()));
    cluster.add_worker();
    let id = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &id, "running");
    let (status, first) = exec(&cluster, &id, "echo one >> f.txt");
    assert_eq!((status, &first["state"]), (200, &json!("done")), "{first}");
    assert!(cluster
        .logs()
        .contains("fault injection: a commit's reply is lost"));
    let (status, second) = exec(&cluster, &id, "echo two >> f.txt");
    assert_eq!(
        (status, &second["state"]),
        (200, &json!("done")),
        "{second}"
    );
    let (status, body) = file(&cluster, &id, "f.txt");
    assert_eq!((status, body.as_slice()), (200, b"one\ntwo\n".as_slice()));
    (cluster, id)
}

/// An exec's receipt and checkpoint landed but the reply was lost: the worker reads the
/// snapshot's state back instead of capturing again. A capture again would find the
/// lineage moved past its tree, and every later exec of the sandbox would fail to
/// commit.
#[tokio::test]
async fn a_lost_reply_to_an_execs_commit_is_read_back() {
    let _services = ServiceLock::shared().await;
    let (cluster, id) = two_execs_survive("sandbox-seal-reply", "seal_reply").await;
    // One checkpoint per exec: the lost reply made no second capture of the first.
    let checkpoints: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM project_snapshots WHERE sandbox_id = $1 AND kind = 'checkpoint' AND status = 'ready'",
    )
    .bind(uuid::Uuid::parse_str(&id).expect("uuid"))
    .fetch_one(&cluster.pool)
    .await
    .expect("checkpoints");
    let receipts: Vec<Value> = operations(&cluster, &id);
    assert_eq!(checkpoints, 2, "{receipts:?}");
}

/// As above, and custody's read-back of the seal never answered either: the exec reads
/// its own receipt back before it would capture the tree again.
#[tokio::test]
async fn an_execs_receipt_is_read_back_when_its_seal_cannot_be() {
    let _services = ServiceLock::shared().await;
    let points = "seal_reply,seal_unanswered";
    let (cluster, _) = two_execs_survive("sandbox-seal-unanswered", points).await;
    assert!(cluster
        .logs()
        .contains("fault injection: a read-back is not answered"));
}
