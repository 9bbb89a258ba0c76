//! An exec's output as the command prints it: `cairnctl sandbox exec` prints each line
//! while the command still runs, the API serves the whole output, its tail and its
//! operation, and retention deletes it 7 days (here 0 s) after the exec ended.

use cairn_e2e::cluster::{Cluster, Settings};
use cairn_e2e::sandboxes::*;
use cairn_e2e::ServiceLock;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};

/// The sandbox's latest operation of `kind`.
fn latest(cluster: &Cluster, sandbox: &str, kind: &str) -> Value {
    let (status, list) = cluster.call(
        "GET",
        &format!("/api/v1/sandboxes/{sandbox}/operations"),
        None,
    );
    assert_eq!(status, 200, "{list}");
    let operations = list["operations"].as_array().cloned().unwrap_or_default();
    operations
        .into_iter()
        .rev()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}: {list}"))
}

#[tokio::test]
async fn an_exec_prints_its_output_while_it_runs() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("exec-output", 1, Settings::default()).await;
    let sandbox = create(&cluster, json!({"agent": "coder", "timeout_sec": 600}));
    wait_state(&cluster, &sandbox, "running");
    let script = "echo one; sleep 3; echo two; printf 'err\\000\\n' >&2; exit 4";
    let mut child = cluster
        .cairnctl()
        .args(["sandbox", "exec", &sandbox, "--", "sh", "-c", script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cairnctl");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("text");
    assert_eq!(first, "one");
    assert!(
        child.try_wait().expect("state").is_none(),
        "the first line arrived only after the command ended"
    );
    let running = latest(&cluster, &sandbox, "exec");
    assert!(
        matches!(running["state"].as_str(), Some("running" | "pending")),
        "{running}"
    );
    let rest: Vec<String> = lines.map(|l| l.expect("text")).collect();
    assert_eq!(rest, ["two"]);
    let mut stderr = Vec::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_end(&mut stderr)
        .expect("stderr");
    let status = child.wait().expect("exit");
    assert_eq!(
        status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&stderr)
    );
    assert_eq!(stderr, b"err\0\n", "stderr, byte for byte");

    let done = latest(&cluster, &sandbox, "exec");
    let operation = done["operation_id"].as_str().expect("id");
    let base = format!("/api/v1/sandboxes/{sandbox}/operations/{operation}");
    let (status, read) = cluster.call("GET", &base, None);
    assert_eq!(
        (status, &read["state"], &read["result"]["exit_code"]),
        (200, &json!("done"), &json!(4)),
        "{read}"
    );
    assert_eq!(
        raw(&cluster, "GET", &format!("{base}/output"), b""),
        (200, b"one\ntwo\n".to_vec())
    );
    let tail = raw(
        &cluster,
        "GET",
        &format!("{base}/output?stream=stdout&tail_bytes=4"),
        b"",
    );
    assert_eq!(tail, (200, b"two\n".to_vec()));
    let (status, _) = raw(
        &cluster,
        "GET",
        &format!("{base}/output?stream=stderr"),
        b"",
    );
    assert_eq!(status, 200);

    // Only an exec has output; an unknown operation is a 404.
    let (status, _) = raw(
        &cluster,
        "PUT",
        &format!("/api/v1/sandboxes/{sandbox}/files/content?path=a.txt"),
        b"a",
    );
    assert_eq!(status, 200);
    let write = latest(&cluster, &sandbox, "write");
    let path = format!(
        "/api/v1/sandboxes/{sandbox}/operations/{}/output",
        write["operation_id"].as_str().expect("id")
    );
    assert_eq!(raw(&cluster, "GET", &path, b"").0, 404);
    let unknown = format!(
        "/api/v1/sandboxes/{sandbox}/operations/{}/output",
        "0".repeat(32)
    );
    assert_eq!(raw(&cluster, "GET", &unknown, b"").0, 404);
}

/// Retention covers an exec's output: the reaper deletes it `reclaim_after` (0 s here)
/// after the exec ended, and the API then says so (410).
#[tokio::test]
async fn the_reaper_reclaims_an_execs_output() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("exec-reclaim", 1, Settings::default()).await;
    let sandbox = create(&cluster, json!({"agent": "coder", "timeout_sec": 600}));
    wait_state(&cluster, &sandbox, "running");
    let (status, _) = exec(&cluster, &sandbox, "echo kept");
    assert_eq!(status, 200);
    let operation = latest(&cluster, &sandbox, "exec")["operation_id"]
        .as_str()
        .expect("id")
        .to_string();
    let path = format!("/api/v1/sandboxes/{sandbox}/operations/{operation}/output");
    assert_eq!(raw(&cluster, "GET", &path, b""), (200, b"kept\n".to_vec()));
    let stored = cluster
        .dir
        .join("artifacts")
        .join("outputs")
        .join(&operation);
    assert!(stored.exists(), "{}", stored.display());
    cluster.reap_once(&[("CAIRN_RECLAIM_AFTER_SECONDS", "0")]);
    assert!(!stored.exists(), "{} is still there", stored.display());
    let (status, body) = raw(&cluster, "GET", &path, b"");
    assert_eq!(status, 410, "{}", String::from_utf8_lossy(&body));
}
