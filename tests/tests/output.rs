//! A step's output is bytes: every byte value reaches the artifact and the receipt's
//! tail, and the secrets a step prints are redacted before anything is stored.

use cairn_common::output::unescape;
use cairn_e2e::cluster::{run_spec, Cluster, Settings};
use cairn_e2e::ServiceLock;
use serde_json::{json, Value};
use std::time::Duration;

/// Every byte 0–255, NUL and invalid UTF-8 included, printed to stdout and to stderr: the
/// step's receipt is written (the run completes), both artifacts hold the bytes exactly,
/// and both tails give them back.
#[tokio::test]
async fn every_byte_a_step_prints_is_kept() {
    let _services = ServiceLock::shared().await;
    let format: String = (0..=255u8).map(|b| format!("\\{b:03o}")).collect();
    let script = format!("printf '{format}'; printf '{format}' >&2");
    let (_cluster, step) = completed_step("output-bytes", &script).await;
    let all: Vec<u8> = (0..=255u8).collect();
    for stream in ["stdout", "stderr"] {
        let tail = step[format!("{stream}_tail")].as_str().expect("tail");
        assert_eq!(
            unescape(tail).as_deref(),
            Some(&all[..]),
            "{stream} tail {tail:?}"
        );
        let base = step["output_artifact"].as_str().expect("artifact");
        let stored = std::fs::read(format!("{base}.{stream}")).expect("artifact file");
        assert_eq!(stored, all, "{stream} artifact");
    }
}

/// A step prints a private key block and tokens: its artifacts and tails hold
/// `[redacted]` in their place, and none of them.
#[tokio::test]
async fn secrets_a_step_prints_are_redacted() {
    let _services = ServiceLock::shared().await;
    let key = "PRIVATE KEY";
    let github = format!("{}_{}", "ghp", "k".repeat(36));
    let aws = format!("{}{}", "AKIA", "Q".repeat(16));
    let script = format!(
        "echo 'token {github} here'; printf -- '-----BEGIN OPENSSH {key}-----\\nb3BlbnNzaA\\n-----END OPENSSH {key}-----\\n'; echo 'id {aws}' >&2; echo done"
    );
    let (_cluster, step) = completed_step("output-redact", &script).await;
    let base = step["output_artifact"].as_str().expect("artifact");
    let mut seen = String::new();
    for stream in ["stdout", "stderr"] {
        seen.push_str(step[format!("{stream}_tail")].as_str().expect("tail"));
        seen.push_str(&String::from_utf8_lossy(
            &std::fs::read(format!("{base}.{stream}")).expect("artifact"),
        ));
    }
    for secret in [github.as_str(), aws.as_str(), "b3BlbnNzaA", "BEGIN OPENSSH"] {
        assert!(!seen.contains(secret), "{secret} was stored: {seen}");
    }
    assert!(seen.contains("token [redacted] here"), "{seen}");
    assert!(seen.contains("id [redacted]"), "{seen}");
    assert!(seen.contains("done"), "{seen}");
}

/// Runs one shell step on a fresh cluster; returns the cluster (which keeps the step's
/// artifacts) and the step's journal entry once it completed.
async fn completed_step(label: &str, script: &str) -> (Cluster, Value) {
    let cluster = Cluster::start(label, 1, Settings::default()).await;
    let step = json!({"key": "out", "argv": ["sh", "-c", script], "idempotent": true});
    let (run_id, _) = cluster.submit(&run_spec(vec![step], 1));
    let ended = ["completed", "failed", "needs_reconciliation"];
    let run = cluster.wait_for_state(&run_id, &ended, Duration::from_secs(60));
    assert_eq!(run["state"], "completed", "{run}");
    let step = cluster.journal(&run_id)["steps"][0].clone();
    (cluster, step)
}
