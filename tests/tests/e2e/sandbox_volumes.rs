//! Volumes end to end: storage on one worker's disk that a sandbox attaches at
//! `/volumes/<name>`, one sandbox at a time; it survives the sandbox's stop and its
//! worker's death and restart (only that worker places the sandbox again), keeps its
//! size, is never in a snapshot or a fork, and is removed from the disk when deleted.

use cairn_e2e::cluster::{Cluster, Settings};
use cairn_e2e::sandboxes::*;
use cairn_e2e::ServiceLock;
use serde_json::{json, Value};
use std::time::Duration;

fn stdout(result: &Value) -> String {
    result["result"]["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn run(cluster: &Cluster, id: &str, script: &str) -> Value {
    let (status, done) = exec(cluster, id, script);
    assert_eq!(status, 200, "{done}");
    done
}

#[tokio::test]
async fn a_volume_outlives_its_sandboxs_worker_and_stays_out_of_copies() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-volumes", 0, Settings::default()).await;
    // One sandbox slot each: the slot a worker's consumer holds while it waits is the
    // one a sandbox found on its disk must take.
    cluster
        .worker_env
        .push(("CAIRN_SANDBOX_SLOTS".into(), "1".into()));
    cluster.add_worker();
    cluster.add_worker();

    // Made (by cairnctl), listed, named once per tenant.
    let printed = cluster
        .cairnctl()
        .args(["--json", "volume", "create", "data", "--size-mb", "32"])
        .output()
        .expect("cairnctl");
    assert!(printed.status.success(), "{printed:?}");
    let made: Value = serde_json::from_slice(&printed.stdout).expect("json");
    assert_eq!(made["state"], "available", "{made}");
    assert!(made.get("directory_id").is_none(), "no host field: {made}");
    let volume_id = made["volume_id"].as_str().expect("id").to_string();
    let (status, again) = cluster.call("POST", "/api/v1/volumes", Some(&json!({"name": "data"})));
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (409, Some("volume_exists")),
        "{again}"
    );
    let (status, bad) = cluster.call("POST", "/api/v1/volumes", Some(&json!({"name": "../x"})));
    assert_eq!(status, 422, "{bad}");
    let (status, list) = cluster.call("GET", "/api/v1/volumes", None);
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["volumes"][0]["name"], "data", "{list}");

    // Attached at create, to one sandbox at a time.
    let id = create(&cluster, json!({"agent": "coder", "volumes": ["data"]}));
    assert_eq!(show(&cluster, &id)["volumes"], json!(["data"]));
    let (status, second) = cluster.call(
        "POST",
        "/api/v1/sandboxes",
        Some(&json!({"agent": "coder", "volumes": ["data"]})),
    );
    assert_eq!(status, 409, "{second}");
    assert_eq!(second["error"]["code"], "volume_attached", "{second}");
    let (status, missing) = cluster.call(
        "POST",
        "/api/v1/sandboxes",
        Some(&json!({"agent": "coder", "volumes": ["nope"]})),
    );
    assert_eq!(status, 404, "{missing}");
    wait_state(&cluster, &id, "running");
    let host = worker_of(&cluster, &id).await.expect("a worker hosts it");
    let index = cluster.worker_index(&host);

    // Written there, it keeps its size: past 32 MiB the write fails.
    run(
        &cluster,
        &id,
        "echo kept > /volumes/data/note.txt; echo tree > tree.txt",
    );
    let filled = run(
        &cluster,
        &id,
        "dd if=/dev/zero of=/volumes/data/big bs=1M count=64 2>&1; echo exit=$?",
    );
    let said = stdout(&filled);
    assert!(said.contains("Disk quota exceeded"), "{said}");
    assert!(!said.contains("exit=0"), "{said}");
    run(&cluster, &id, "rm -f /volumes/data/big");

    // A fork copies the tree, never the volume.
    let (status, forked) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/fork"), None);
    assert_eq!(status, 201, "{forked}");
    let fork = forked["sandboxes"][0]["sandbox_id"]
        .as_str()
        .expect("fork")
        .to_string();
    assert_eq!(forked["sandboxes"][0]["volumes"], json!([]), "{forked}");
    wait_state(&cluster, &fork, "running");
    let seen = run(
        &cluster,
        &fork,
        "cat tree.txt; ls /volumes 2>&1 || echo no-volumes",
    );
    assert_eq!(
        stdout(&seen),
        "tree\nls: cannot access '/volumes': No such file or directory\nno-volumes\n"
    );

    // Its worker dies: the sandbox stops; resumed, only a worker on that disk places it.
    cluster.workers[index]
        .process
        .signal(nix::sys::signal::Signal::SIGKILL);
    let stopped = wait_state(&cluster, &id, "stopped");
    assert_eq!(stopped["stop_reason"], "worker_lost", "{stopped}");
    let (status, resumed) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/resume"), None);
    assert_eq!(status, 202, "accepted, not yet running: {resumed}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = show(&cluster, &id);
    assert_eq!(
        waiting["state"], "stopped",
        "the other worker never takes it: {waiting}"
    );
    assert_eq!(waiting["pending"], "running", "{waiting}");
    // A volume on a disk no running worker has is not attached: nothing would start
    // its sandbox.
    let (status, ghost) = cluster.call("POST", "/api/v1/volumes", Some(&json!({"name": "ghost"})));
    assert_eq!(status, 201, "{ghost}");
    sqlx::query("UPDATE volumes SET directory_id = gen_random_uuid() WHERE name = 'ghost'")
        .execute(&cluster.pool)
        .await
        .expect("a gone worker's disk");
    let (status, refused) = cluster.call(
        "POST",
        "/api/v1/sandboxes",
        Some(&json!({"agent": "coder", "volumes": ["ghost"]})),
    );
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (409, Some("volume_unavailable")),
        "{refused}"
    );
    cluster.add_worker_named(&host);
    wait_state(&cluster, &id, "running");
    assert_eq!(
        worker_of(&cluster, &id).await.as_deref(),
        Some(host.as_str())
    );
    let read = run(&cluster, &id, "cat /volumes/data/note.txt");
    assert_eq!(stdout(&read), "kept\n");
    // Links the sandbox leaves in its volume to the worker's own files: the volume's
    // removal goes through none of them (invariant 10).
    let host_file = cluster.dir.join("host-file");
    std::fs::write(&host_file, "the host's").expect("host file");
    let plant = format!(
        "ln -s {} /volumes/data/to-file; ln -s {} /volumes/data/to-dir",
        host_file.display(),
        cluster.dir.display()
    );
    run(&cluster, &id, &plant);

    // Attached, it is not deleted; its sandbox destroyed, it is, and its data goes.
    let path = format!("/api/v1/volumes/{volume_id}");
    let (status, refused) = cluster.call("DELETE", &path, None);
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (409, Some("volume_attached")),
        "{refused}"
    );
    let (status, _) = cluster.call("DELETE", &format!("/api/v1/sandboxes/{id}"), None);
    assert_eq!(status, 200);
    wait_state(&cluster, &id, "destroyed");
    let (status, detached) = cluster.call("GET", &path, None);
    assert_eq!(
        (status, &detached["attached_to"]),
        (200, &Value::Null),
        "{detached}"
    );
    // Seen through the worker's own mounts (its disk may be an image mounted there).
    let worker = &cluster.workers[cluster.workers.len() - 1];
    let data = std::path::PathBuf::from(format!("/proc/{}/root", worker.process.pid()))
        .join(
            cluster
                .workspaces(&host)
                .strip_prefix("/")
                .expect("absolute"),
        )
        .join(".volumes")
        .join(&volume_id);
    assert!(
        data.join("note.txt").exists(),
        "the data is on its worker's disk"
    );
    let (status, deleting) = cluster.call("DELETE", &path, None);
    assert_eq!(status, 200, "{deleting}");
    cluster.wait_until("the volume deleted", LONG, || {
        cluster.call("GET", &path, None).1["state"] == "deleted"
    });
    assert!(!data.exists(), "its worker removed the data");
    assert_eq!(
        std::fs::read_to_string(&host_file).expect("still there"),
        "the host's"
    );
    let (status, gone) = cluster.call(
        "POST",
        "/api/v1/sandboxes",
        Some(&json!({"agent": "coder", "volumes": ["data"]})),
    );
    assert_eq!(status, 404, "{gone}");
}
