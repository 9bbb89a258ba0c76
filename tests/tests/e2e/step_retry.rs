//! Retry policies end to end: a failing step runs again after its backoff (the waits
//! show in the journal's timestamps), its run holds no worker slot while it waits, and
//! a failure the policy does not name, or the last allowed one, fails the run.

use cairn_e2e::cluster::{run_spec, Cluster, Settings};
use cairn_e2e::ServiceLock;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(90);

/// A step that fails (exit 75) until it has run `succeed_on` times, counting its runs in
/// `counter`.
fn flaky(counter: &str, succeed_on: u32, retry: Value) -> Value {
    let script = format!(
        "n=$(($(cat {counter} 2>/dev/null || echo 0) + 1)); echo $n > {counter}; echo run $n; [ $n -ge {succeed_on} ] || exit 75"
    );
    json!({"key": "flaky", "argv": ["sh", "-c", script], "retry": retry})
}

fn at(value: &Value) -> DateTime<Utc> {
    value
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("a time: {value}"))
}

#[tokio::test]
async fn a_failing_step_runs_again_after_its_backoff_without_holding_a_slot() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("retry", 0, Settings::default()).await;
    // One slot: a run waiting for its retry must leave it to others.
    cluster
        .worker_env
        .push(("CAIRN_WORKER_CONCURRENCY".into(), "1".into()));
    cluster.add_worker();
    let counter = cluster.path("flaky-count");
    let retry = json!({"max_attempts": 3, "backoff": {"initial_seconds": 2, "multiplier": 2, "jitter_percent": 0}, "on": [75]});
    let spec = run_spec(
        vec![
            json!({"key": "before", "argv": ["true"]}),
            flaky(&counter, 3, retry),
        ],
        1,
    );
    let (run_id, _) = cluster.submit(&spec);
    cluster.wait_until("the first retry to be scheduled", LONG, || {
        cluster.run(&run_id)["next_attempt_at"].is_string()
    });
    // Meanwhile the one slot is free: another run completes.
    let (other, _) = cluster.submit(&run_spec(
        vec![json!({"key": "quick", "argv": ["true"]})],
        1,
    ));
    cluster.wait_for_state(&other, &["completed"], LONG);
    assert_eq!(
        cluster.run(&run_id)["state"],
        "queued",
        "still waiting for its backoff"
    );

    let run = cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(
        run["attempt"], 1,
        "a step's retry is not a new attempt of the run"
    );
    let journal = cluster.journal(&run_id);
    let retries: Vec<&Value> = journal["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["entry_kind"] == "step_retry")
        .collect();
    assert_eq!(retries.len(), 2, "{journal}");
    for (i, (entry, wait)) in retries.iter().zip([2.0, 4.0]).enumerate() {
        assert_eq!(entry["body"]["failure"], i as u64 + 1, "{entry}");
        assert_eq!(entry["body"]["exit_code"], 75);
        let waited =
            (at(&entry["body"]["next_attempt_at"]) - at(&entry["created_at"])).num_milliseconds();
        assert!(
            (waited as f64 / 1000.0 - wait).abs() < 0.5,
            "waits {waited} ms, not {wait} s: {entry}"
        );
    }
    // Each run of the step started no earlier than the wait its failure named.
    let step = journal["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["step_key"] == "flaky")
        .expect("flaky");
    assert!(
        at(&step["started_at"]) >= at(&retries[1]["body"]["next_attempt_at"]),
        "{journal}"
    );
    assert_eq!(step["status"], "completed");
    assert_eq!(cluster.lines("flaky-count"), ["3"]);
    let before = journal["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["step_key"] == "before")
        .expect("before");
    assert_eq!(
        before["intent_epoch"], 1,
        "the step before ran once and was reused: {journal}"
    );
}

#[tokio::test]
async fn a_failure_the_policy_does_not_name_or_the_last_allowed_one_fails_the_run() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("retry-fail", 1, Settings::default()).await;
    let only_timeouts =
        json!({"max_attempts": 5, "backoff": {"initial_seconds": 1}, "on": ["timeout"]});
    let (named, _) = cluster.submit(&run_spec(
        vec![flaky(&cluster.path("a"), 9, only_timeouts)],
        1,
    ));
    let failed = cluster.wait_for_state(&named, &["failed"], LONG);
    assert_eq!(
        cluster.lines("a"),
        ["1"],
        "exit 75 is not a timeout: {failed}"
    );

    let twice = json!({"max_attempts": 2, "backoff": {"initial_seconds": 1, "jitter_percent": 0}});
    let mut spec = run_spec(vec![flaky(&cluster.path("b"), 9, Value::Null)], 1);
    spec["steps"][0]
        .as_object_mut()
        .expect("step")
        .remove("retry");
    spec["retry"] = twice;
    let (exhausted, _) = cluster.submit(&spec);
    cluster.wait_for_state(&exhausted, &["failed"], LONG);
    assert_eq!(
        cluster.lines("b"),
        ["2"],
        "the run's policy applies to its step: two executions"
    );

    let (status, error) = cluster.call(
        "POST",
        "/api/v1/runs",
        Some(&run_spec(
            vec![json!({"key": "s", "argv": ["true"], "retry": {"max_attempts": 1}})],
            1,
        )),
    );
    assert_eq!(
        (status, error["error"]["field"].as_str()),
        (422, Some("steps[0].retry.max_attempts")),
        "{error}"
    );
}
