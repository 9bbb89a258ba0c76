//! Copies of sandboxes end to end: snapshots as resources, restore, fork, idempotent
//! resume and fork, the reaper's rules on real snapshots, and `cairnctl`.

use cairn_e2e::cluster::{Cluster, Settings, ADMIN};
use cairn_e2e::sandboxes::*;
use cairn_e2e::{exchange, ServiceLock};
use serde_json::{json, Value};

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

/// Fork: one capture for a fan-out of three, the source running and unchanged, each
/// fork its own (diverging, no copy of the source's identity); a key retried makes no
/// more. Named snapshots: restore into a new sandbox; delete leaves it unaffected.
#[tokio::test]
async fn forks_and_snapshots_make_new_sandboxes_and_leave_the_source_alone() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-fork", 2, Settings::default()).await;
    let source = create(
        &cluster,
        json!({"agent": "coder", "metadata": {"team": "forks"}}),
    );
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
    // The answer is the new sandbox itself (the first of the three), a new id.
    assert_eq!(
        forked["sandbox_id"].as_str(),
        Some(forks[0].as_str()),
        "{forked}"
    );
    assert_eq!(forked["state"], "creating", "{forked}");
    assert_eq!(
        forked["metadata"],
        json!({"team": "forks"}),
        "a fork keeps its labels"
    );
    assert_ne!(forked["sandbox_id"].as_str(), Some(source.as_str()));
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

    // Each sandbox's own machine id, host name and SSH host key, in its `/etc`.
    let identity_of = |id: &str| {
        let script = "cat /etc/machine-id; uname -n; cat /etc/ssh/ssh_host_ed25519_key.pub";
        let (status, seen) = exec(&cluster, id, script);
        assert_eq!(status, 200, "{seen}");
        let out = seen["result"]["stdout"]
            .as_str()
            .expect("stdout")
            .to_string();
        assert_eq!(out.lines().count(), 3, "{out}");
        assert!(
            out.lines()
                .nth(2)
                .is_some_and(|l| l.starts_with("ssh-ed25519 ")),
            "{out}"
        );
        out
    };
    let mut identities = vec![identity_of(&source)];
    for (i, fork) in forks.iter().enumerate() {
        wait_state(&cluster, fork, "running");
        identities.push(identity_of(fork));
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
    for (i, a) in identities.iter().enumerate() {
        for b in &identities[i + 1..] {
            for (x, y) in a.lines().zip(b.lines()) {
                assert_ne!(
                    x, y,
                    "each fork has its own machine id, host name and host key"
                );
            }
        }
    }
    // A stop and a resume keep the sandbox's identity (the worker may differ).
    for verb in ["stop", "resume"] {
        let (status, body) =
            cluster.call("POST", &format!("/api/v1/sandboxes/{source}/{verb}"), None);
        assert_eq!(status, 200, "{verb}: {body}");
    }
    wait_state(&cluster, &source, "running");
    assert_eq!(
        identity_of(&source),
        identities[0],
        "kept across a stop and a resume"
    );

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
    assert_eq!(kinds, ["stop", "fork", "named"], "{listed}");
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
    // --wait answers once the sandbox runs; its labels come back with it and filter
    // the list.
    let created = json(&[
        "sandbox",
        "create",
        "--agent",
        "coder",
        "--timeout-seconds",
        "600",
        "--metadata",
        "team=cli",
        "--wait",
        "--json",
    ]);
    assert_eq!(created["state"], "running", "{created}");
    assert_eq!(created["metadata"], json!({"team": "cli"}), "{created}");
    let id = created["sandbox_id"].as_str().expect("id").to_string();
    let listed = json(&["sandbox", "list", "--metadata", "team=cli", "--json"]);
    assert_eq!(
        listed["sandboxes"][0]["sandbox_id"],
        id.as_str(),
        "{listed}"
    );
    let listed = json(&["sandbox", "list", "--metadata", "team=nobody", "--json"]);
    assert_eq!(listed["sandboxes"], json!([]), "{listed}");

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
    let extended = json(&[
        "sandbox",
        "extend",
        &id,
        "--timeout-seconds",
        "900",
        "--json",
    ]);
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

/// A named snapshot published as a template (`cairnctl template create`) starts new
/// sandboxes with its tree; the next publication is version 2, and version 1 still
/// starts from what it named.
#[tokio::test]
async fn a_template_version_starts_new_sandboxes_from_its_snapshot() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("templates", 1, Settings::default()).await;
    let json = |args: &[&str]| {
        let output = cluster
            .cairnctl()
            .args(args)
            .arg("--json")
            .output()
            .expect("cairnctl");
        let out = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{args:?}: {out}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_str::<Value>(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    };
    let source = create(&cluster, json!({"agent": "coder", "timeout_sec": 600}));
    wait_state(&cluster, &source, "running");
    let (status, _) = exec(&cluster, &source, "echo one > base.txt");
    assert_eq!(status, 200);
    let first = json(&["snapshot", "save", &source, "base v1"]);
    let first_id = first["snapshot_id"].as_str().expect("snapshot").to_string();
    let v1 = json(&["template", "create", "base", "--source", &first_id]);
    assert_eq!(v1["version"], 1, "{v1}");
    let (status, _) = exec(&cluster, &source, "echo two > base.txt");
    assert_eq!(status, 200);
    let second = json(&["snapshot", "save", &source, "base v2"]);
    let v2 = json(&[
        "template",
        "create",
        "base",
        "--source",
        second["snapshot_id"].as_str().expect("id"),
    ]);
    assert_eq!(v2["version"], 2, "{v2}");

    let v1_id = v1["template_id"].as_str().expect("id");
    let made = json(&[
        "sandbox",
        "create",
        "--agent",
        "coder",
        "--template",
        v1_id,
        "--wait",
    ]);
    assert_eq!(
        (&made["state"], &made["template_id"]),
        (&json!("running"), &json!(v1_id)),
        "{made}"
    );
    let made_id = made["sandbox_id"].as_str().expect("id");
    assert_eq!(
        file(&cluster, made_id, "base.txt"),
        (200, b"one\n".to_vec()),
        "version 1's tree"
    );
    let listed = json(&["template", "list", "--name", "base"]);
    assert_eq!(
        listed["templates"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
}

/// A fork (of a tree of 64 MiB or more) its source's worker has a slot for starts from
/// the source's tree staged on that worker's disk (a copy-on-write snapshot taken while the source was frozen for
/// the capture, no restore), and holds exactly what the capture holds: a file the
/// capture left out (it holds a secret) is not in it. The forks it has no slot for go to
/// any worker at once, restored from the capture; the staged tree goes once none waits.
#[tokio::test]
async fn a_fork_on_its_sources_worker_starts_from_the_staged_tree() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-staged", 0, Settings::default()).await;
    cluster
        .worker_env
        .push(("CAIRN_SANDBOX_SLOTS".into(), "2".into()));
    cluster.add_worker();
    cluster.add_worker();
    let source = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &source, "running");
    // Past 64 MiB, a tree is staged rather than restored.
    let script = "mkdir -p d etc && echo kept > d/a.txt && echo AKIA1234567890ABCDEF > creds.txt \
                  && echo 0123456789abcdef > etc/machine-id && head -c 70000000 /dev/zero > big.bin";
    assert_eq!(exec(&cluster, &source, script).0, 200);
    let host = worker_of(&cluster, &source).await.expect("hosted");
    let index = cluster.worker_index(&host);
    let (status, forked) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{source}/fork"),
        Some(&json!({"count": 3})),
    );
    assert_eq!(status, 201, "{forked}");
    let forks: Vec<String> = forked["sandboxes"]
        .as_array()
        .expect("forks")
        .iter()
        .map(|f| f["sandbox_id"].as_str().expect("id").to_string())
        .collect();
    for fork in &forks {
        wait_state(&cluster, fork, "running");
        let (status, seen) = exec(
            &cluster,
            fork,
            "cat d/a.txt; ls creds.txt etc/machine-id 2>/dev/null || echo gone",
        );
        assert_eq!(status, 200, "{seen}");
        let out = seen["result"]["stdout"].as_str().unwrap_or_default();
        assert!(
            out.starts_with("kept\n") && out.ends_with("gone\n"),
            "{out}"
        );
    }
    // One free slot on the source's worker: one fork staged there, two restored.
    let log = cluster.workers[index].process.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("stag") || l.contains("WARN") || l.contains("running") || l.contains("claim")
        })
        .collect();
    assert_eq!(
        cluster.metric(index, "cairn_worker_forks_staged_total"),
        1.0,
        "{said:#?}"
    );
    let mut hosts = Vec::new();
    for fork in &forks {
        hosts.push(worker_of(&cluster, fork).await.expect("hosted"));
    }
    assert_eq!(hosts.iter().filter(|h| **h == host).count(), 1, "{hosts:?}");
    // Seen through the worker's own mounts: the staged tree goes once no fork waits.
    let staged = std::path::PathBuf::from(format!(
        "/proc/{}/root",
        cluster.workers[index].process.pid()
    ))
    .join(
        cluster
            .workspaces(&host)
            .strip_prefix("/")
            .expect("absolute"),
    )
    .join(".forks");
    cluster.wait_until("the staged tree removed", LONG, || {
        std::fs::read_dir(&staged).map_or(true, |mut d| d.next().is_none())
    });
    // The staged fork's first checkpoint is its cut copy's index, recorded with no
    // walk: it describes the tree as a capture of it does (its stop snapshot's, the
    // tree unchanged since), and the tree resumed from it is whole.
    let staged = &forks[hosts.iter().position(|h| *h == host).expect("staged")];
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{staged}/stop"), None);
    assert_eq!(status, 200);
    wait_state(&cluster, staged, "stopped");
    let digests: Vec<(String, String)> = sqlx::query_as(
        "SELECT kind, tree_digest FROM project_snapshots
          WHERE sandbox_id = $1 AND kind IN ('checkpoint', 'stop') ORDER BY created_at",
    )
    .bind(uuid::Uuid::parse_str(staged).expect("uuid"))
    .fetch_all(&cluster.pool)
    .await
    .expect("digests");
    assert_eq!(digests.len(), 2, "{digests:?}");
    assert_eq!(digests[0].1, digests[1].1, "{digests:?}");
    let (status, resumed) =
        cluster.call("POST", &format!("/api/v1/sandboxes/{staged}/resume"), None);
    assert_eq!(status, 200, "{resumed}");
    wait_state(&cluster, staged, "running");
    let (status, seen) = exec(
        &cluster,
        staged,
        "cat d/a.txt; wc -c < big.bin; ls creds.txt etc/machine-id 2>/dev/null || echo gone",
    );
    assert_eq!(status, 200, "{seen}");
    assert_eq!(seen["result"]["stdout"], "kept\n70000000\ngone\n");
    // The source goes on as it was.
    let (_, kept) = file(&cluster, &source, "creds.txt");
    assert_eq!(kept, b"AKIA1234567890ABCDEF\n");
}
