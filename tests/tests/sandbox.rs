//! The step sandbox end to end (invariant 10), through the API and the real binaries:
//! the three escapes a hostile step tried before it existed, the spec's network and
//! limits, and the worker's report of what the host allows.

use cairn_e2e::cluster::{run_spec, Cluster, Settings};
use cairn_e2e::ServiceLock;
use serde_json::{json, Value};
use std::net::TcpListener;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);

fn sh(key: &str, script: &str) -> Value {
    json!({"key": key, "argv": ["sh", "-c", script], "timeout_seconds": 120})
}

/// `sleep 1000.<random>`: a command line no other process has.
fn unique_sleep() -> String {
    format!(
        "sleep 1000.{}",
        uuid::Uuid::new_v4().as_u128() % 1_000_000_000
    )
}

/// The journal's row of `key`.
fn step_of(cluster: &Cluster, run_id: &str, key: &str) -> Value {
    let journal = cluster.journal(run_id);
    journal["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["step_key"] == key)
        .cloned()
        .unwrap_or_else(|| panic!("no step {key}: {journal}"))
}

/// A worker holds an AWS key, a database URL with a password and the bootstrap admin
/// token in its environment: a step that reads every environment and descriptor it can
/// reach finds none of them.
#[tokio::test]
async fn a_step_cannot_read_the_worker_environment_or_descriptors() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-environ", 0, Settings::default()).await;
    // Not shaped like any token the output redaction knows: only the sandbox keeps them.
    let secrets = [
        ("AWS_SECRET_ACCESS_KEY", "plain-aws-secret-4417"),
        ("DATABASE_URL", "postgres://app:plain-db-pass-9921@db/app"),
        ("CAIRN_BOOTSTRAP_ADMIN_TOKEN", "plain-admin-token-5530"),
    ];
    for (name, value) in secrets {
        cluster.worker_env.push((name.into(), value.into()));
    }
    cluster.add_worker();
    let script = "tr '\\0' '\\n' </proc/$PPID/environ; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' <$f; done; \
                  ls -l /proc/[0-9]*/fd/ 2>&1; cat /proc/1/cmdline | tr '\\0' ' '; echo; id";
    let (run_id, _) = cluster.submit(&run_spec(vec![sh("read", script)], 1));
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let step = step_of(&cluster, &run_id, "read");
    let seen = format!("{}{}", step["stdout_tail"], step["stderr_tail"]);
    for (_, value) in secrets {
        for part in ["plain-aws-secret", "plain-db-pass", "plain-admin-token"] {
            assert!(
                !(value.contains(part) && seen.contains(part)),
                "{part} leaked: {seen}"
            );
        }
    }
    assert!(!seen.contains("CAIRN_DATABASE_URL"), "{seen}");
    assert!(seen.contains("uid=1000"), "{seen}");
    assert_eq!(step["sandbox"]["isolated"], true, "{step}");
}

/// Step 1 links `/` into the tree; step 2 asks for `cwd: escape/etc`: it is refused with
/// a receipt that says why, and the run fails there. Nothing a step writes to a host path
/// lands, and it sees neither the workspaces nor the snapshot store.
#[tokio::test]
async fn a_symlink_cwd_is_refused_and_a_write_outside_is_impossible() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-cwd", 1, Settings::default()).await;
    let outside = cluster.dir.join("outside-marker");
    let workspaces = cluster.workspaces("w1");
    let etc_marker = format!("cairn-marker-{}", uuid::Uuid::new_v4().simple());
    let mut read = sh("read", "cat passwd");
    read["cwd"] = json!("escape/etc");
    let spec = run_spec(
        vec![
            sh(
                "link",
                &format!(
                    "ln -s / escape; touch {0} /etc/{3} {1}/marker 2>/dev/null; \
                     ls {1} >/dev/null 2>&1 && echo saw-workspaces; \
                     ls {2} >/dev/null 2>&1 && echo saw-store; echo linked",
                    outside.display(),
                    workspaces.display(),
                    cluster.dir.join("artifacts").display(),
                    etc_marker,
                ),
            ),
            read,
            sh("after", "echo should-not-run"),
        ],
        1,
    );
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["failed"], LONG);
    let (reason, _) = cluster.stop_reason(&request_id).await;
    let reason = reason.unwrap_or_default();
    assert!(
        reason.contains("leaves the workspace"),
        "the refusal says why: {reason}"
    );
    // Neither the worker's workspaces (this run's and others') nor the snapshot store
    // are in its view.
    let link = step_of(&cluster, &run_id, "link");
    assert_eq!(link["stdout_tail"], "linked\n", "{link}");
    let read = step_of(&cluster, &run_id, "read");
    assert!(
        read["stderr_tail"]
            .as_str()
            .unwrap_or_default()
            .contains("escape/etc"),
        "{read}"
    );
    assert!(!read["stdout_tail"]
        .as_str()
        .unwrap_or_default()
        .contains("root:"));
    let journal = cluster.journal(&run_id);
    assert!(
        journal["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .all(|s| s["step_key"] != "after"),
        "{journal}"
    );
    assert!(!outside.exists(), "a write outside the workspace landed");
    assert!(!workspaces.join("marker").exists());
    assert!(!std::path::Path::new("/etc").join(&etc_marker).exists());
}

/// `sh -c "setsid sh -c 'sleep …' & sleep 100"`: on its timeout, and on a cancel, the
/// step ends within the kill grace, its receipt is written on time, and the `setsid`
/// orphan is gone.
#[tokio::test]
async fn a_setsid_orphan_is_gone_within_the_kill_grace_after_timeout_and_cancel() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-orphan", 1, Settings::default()).await;
    let grace = Duration::from_secs(cluster.settings.kill_grace_seconds);

    // Timeout.
    // Unique per run: an orphan of another run (or of an older build) is not this one's.
    let (timed_marker, cancelled_marker) = (unique_sleep(), unique_sleep());
    let mut timed = sh(
        "orphan",
        &format!("setsid sh -c '{timed_marker}' & sleep 100"),
    );
    timed["timeout_seconds"] = json!(2);
    let submitted = Instant::now();
    let (run_id, _) = cluster.submit(&run_spec(vec![timed], 1));
    cluster.wait_for_state(&run_id, &["failed"], LONG);
    let took = submitted.elapsed();
    assert!(
        took < Duration::from_secs(2) + grace + Duration::from_secs(8),
        "the timed-out step ended after {took:?}"
    );
    let step = step_of(&cluster, &run_id, "orphan");
    assert_eq!(step["timed_out"], true, "{step}");
    assert!(
        cairn_e2e::processes_with(&timed_marker).is_empty(),
        "the orphan outlived its step"
    );

    // Cancel.
    let started = cluster.path("started");
    let cancelled = sh(
        "orphan",
        &format!("setsid sh -c '{cancelled_marker}' & touch {started}; sleep 100"),
    );
    let (run_id, _) = cluster.submit(&run_spec(vec![cancelled], 1));
    cluster.wait_until("the step to start", LONG, || {
        std::path::Path::new(&started).exists()
    });
    assert!(!cairn_e2e::processes_with(&cancelled_marker).is_empty());
    let asked = Instant::now();
    let (status, body) = cluster.call("POST", &format!("/api/v1/runs/{run_id}/cancel"), None);
    assert_eq!(status, 202, "{body}");
    cluster.wait_for_state(&run_id, &["cancelled"], LONG);
    let took = asked.elapsed();
    assert!(
        took < grace + Duration::from_secs(8),
        "the cancelled step ended after {took:?}"
    );
    cluster.wait_until(
        "the orphan to be gone",
        grace + Duration::from_secs(2),
        || cairn_e2e::processes_with(&cancelled_marker).is_empty(),
    );
}

/// `network: false` cannot reach a listener on the host's loopback; a step that does not
/// say (the worker's default, `true`) reaches it.
#[tokio::test]
async fn network_false_blocks_the_host_loopback_and_network_true_reaches_it() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-network", 1, Settings::default()).await;
    let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = listener.local_addr().expect("addr").port();
    let connect = format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('reached')\""
    );
    let mut closed = sh("closed", &format!("{connect} || echo blocked"));
    closed["network"] = json!(false);
    let (run_id, _) = cluster.submit(&run_spec(vec![sh("open", &connect), closed], 1));
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let open = step_of(&cluster, &run_id, "open");
    assert_eq!(open["stdout_tail"], "reached\n", "{open}");
    assert_eq!(open["sandbox"]["network"], true);
    let closed = step_of(&cluster, &run_id, "closed");
    assert_eq!(closed["stdout_tail"], "blocked\n", "{closed}");
    assert_eq!(closed["sandbox"]["network"], false);
    drop(listener);
}

/// A fork loop ends at the step's `pids` limit, with `pids_limit` in its receipt.
#[tokio::test]
async fn a_fork_loop_ends_at_its_pids_limit_with_a_clear_receipt() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-pids", 1, Settings::default()).await;
    let mut fork = sh("fork", "while :; do sleep 30 & done");
    fork["limits"] = json!({"pids": 32});
    let (run_id, request_id) = cluster.submit(&run_spec(vec![fork], 1));
    cluster.wait_for_state(&run_id, &["failed"], LONG);
    let step = step_of(&cluster, &run_id, "fork");
    assert_eq!(step["limit"], "pids_limit", "{step}");
    assert_eq!(step["sandbox"]["limits"]["pids"], 32);
    let (reason, _) = cluster.stop_reason(&request_id).await;
    assert!(reason.unwrap_or_default().contains("pids_limit"));
    // Out-of-bounds limits are refused at admission.
    let mut bad = sh("fork", "true");
    bad["limits"] = json!({"memory_mb": 1});
    let (status, body) = cluster.call("POST", "/api/v1/runs", Some(&run_spec(vec![bad], 1)));
    assert_eq!(status, 422, "{body}");
}

/// The worker's `/readyz` and metric report what this host allows, as the host is.
#[tokio::test]
async fn the_worker_reports_what_the_host_allows() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-report", 1, Settings::default()).await;
    let ready = cairn_e2e::http(cluster.workers[0].addr, "GET", "/readyz").expect("readyz");
    let body: Value = serde_json::from_str(&ready.body).expect("json");
    let sandbox = &body["details"]["sandbox"];
    let bwrap = std::process::Command::new("bwrap")
        .arg("--version")
        .output();
    let installed = bwrap.as_ref().is_ok_and(|o| o.status.success());
    let userns = std::process::Command::new("bwrap")
        .args([
            "--ro-bind",
            "/",
            "/",
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "true",
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert_eq!(sandbox["isolated"], installed && userns, "{body}");
    if let Ok(out) = &bwrap {
        assert_eq!(
            sandbox["mechanism"],
            String::from_utf8_lossy(&out.stdout).trim(),
            "{body}"
        );
    }
    let cgroup = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "v2"
    } else if std::path::Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists() {
        "v1"
    } else {
        "none"
    };
    assert_eq!(sandbox["cgroup"], cgroup, "{body}");
    let isolated = cluster.metric(
        0,
        "cairn_worker_sandbox_capability{capability=\"isolated\"}",
    );
    assert_eq!(isolated, if installed && userns { 1.0 } else { 0.0 });
}
