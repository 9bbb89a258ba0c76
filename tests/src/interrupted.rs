//! Runs whose worker dies mid-plan: the scenarios the takeover, reconciliation and
//! console tests share.

use crate::cluster::{append_step, run_spec, Cluster, Settings};
use nix::sys::signal::Signal;
use serde_json::json;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// Submits s1 (quick), s2 (slow, killed mid-way: it appends `s2-start` to `effects`,
/// prints a line, sleeps 4 s, then appends `s2-end`) and s3, on two workers, and kills
/// the worker holding the run with SIGKILL while s2 runs, after s2's first output was
/// uploaded. Returns the cluster, the run's id and its request's id.
pub async fn kill_during_second_step(
    label: &str,
    idempotent: bool,
    max_attempts: u32,
) -> (Cluster, String, String) {
    let cluster = Cluster::start(label, 2, Settings::default()).await;
    let file = cluster.path("effects");
    let spec = run_spec(
        vec![
            append_step("s1", &file, "s1", 0.0, false),
            json!({"key": "s2", "argv": ["sh", "-c", format!("echo s2-start >> {file}; echo 'half of s2'; sleep 4; echo s2-end >> {file}")], "idempotent": idempotent}),
            append_step("s3", &file, "s3", 0.0, false),
        ],
        max_attempts,
    );
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_until("s2 to start", LONG, || {
        cluster.lines("effects").contains(&"s2-start".to_string())
    });
    // Live output is uploaded within 250 ms: s2's first line is there to read.
    std::thread::sleep(Duration::from_millis(1000));
    let holder = cluster
        .holder(&request_id)
        .await
        .expect("a worker holds the run");
    let victim = cluster.worker_index(&holder);
    cluster.workers[victim].process.signal(Signal::SIGKILL);
    (cluster, run_id, request_id)
}

/// Submits s1 and s2, each appending its name to `effects`, to a worker that kills
/// itself right after s2's intent commits (a fault point, not a racing kill), then
/// starts another worker: nobody can know whether s2 ran. Returns the cluster and the
/// run's id; the run is on its way to `needs_reconciliation`.
pub async fn die_after_second_intent(label: &str) -> (Cluster, String) {
    let mut cluster = Cluster::start(label, 0, Settings::default()).await;
    let file = cluster.path("effects");
    let spec = run_spec(
        vec![
            append_step("s1", &file, "s1", 0.0, false),
            append_step("s2", &file, "s2", 0.0, false),
        ],
        3,
    );
    // s1's intent is the first to pass the point, s2's the second.
    cluster.add_faulty_worker("w1", "after_intent@2");
    let (run_id, _) = cluster.submit(&spec);
    if cluster.workers[0].process.wait_exit(LONG).is_none() {
        panic!("never killed itself after s2's intent\n{}", cluster.logs());
    }
    cluster.add_worker();
    (cluster, run_id)
}
