//! Flow control end to end: a concurrency key's limit holds across every worker and a
//! worker's death, priorities order the claims, and a rate limit holds its rate.

use cairn_e2e::cluster::{run_spec, Cluster, Settings};
use cairn_e2e::ServiceLock;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(120);

fn keyed(step: Value, key: &str, limit: u32) -> Value {
    let mut spec = run_spec(vec![step], 3);
    spec["concurrency_key"] = json!(key);
    spec["concurrency_limit"] = json!(limit);
    spec
}

async fn executing(cluster: &Cluster, key: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM execution_requests e JOIN runs r ON r.id = e.run_id
          WHERE r.concurrency_key = $1 AND e.state = 'executing'",
    )
    .bind(key)
    .fetch_one(&cluster.pool)
    .await
    .expect("count")
}

async fn ended(cluster: &Cluster, ids: &[String]) -> usize {
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM runs WHERE id = ANY($1::uuid[]) AND state IN ('completed', 'failed', 'cancelled', 'needs_reconciliation', 'stopped_at_checkpoint')",
    )
    .bind(ids)
    .fetch_one(&cluster.pool)
    .await
    .expect("count");
    usize::try_from(ended).unwrap_or(0)
}

#[tokio::test]
async fn a_concurrency_key_never_has_more_than_its_limit_executing_across_a_worker_kill() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("flow-key", 2, Settings::default()).await;
    let step = json!({"key": "work", "argv": ["sleep", "0.3"], "idempotent": true});
    let ids: Vec<String> = (0..50)
        .map(|_| cluster.submit(&keyed(step.clone(), "repo-x", 2)).0)
        .collect();
    let (status, bad) = cluster.call(
        "POST",
        "/api/v1/runs",
        Some(&json!({
        "agent": "e2e", "steps": [step], "concurrency_limit": 2})),
    );
    assert_eq!(
        (status, bad["error"]["field"].as_str()),
        (422, Some("concurrency_limit")),
        "{bad}"
    );

    let started = Instant::now();
    let (mut most, mut killed) = (0, false);
    while ended(&cluster, &ids).await < ids.len() {
        assert!(
            started.elapsed() < LONG,
            "50 runs did not end\n{}",
            cluster.logs()
        );
        let now = executing(&cluster, "repo-x").await;
        most = most.max(now);
        assert!(now <= 2, "{now} runs of repo-x executing at once");
        // Mid-way, the worker holding one of them dies: its run keeps its slot until
        // the sweeper queues it again.
        if !killed && now > 0 && ended(&cluster, &ids).await >= 5 {
            let holder: Option<String> = sqlx::query_scalar(
                "SELECT e.lease_owner FROM execution_requests e JOIN runs r ON r.id = e.run_id
                  WHERE r.concurrency_key = 'repo-x' AND e.state = 'executing' AND e.lease_owner IS NOT NULL LIMIT 1",
            )
            .fetch_optional(&cluster.pool)
            .await
            .expect("holder");
            if let Some(holder) = holder {
                cluster.workers[cluster.worker_index(&holder)]
                    .process
                    .signal(Signal::SIGKILL);
                killed = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(
        killed,
        "no worker was killed mid-way (at most {most} executing at once)"
    );
    assert_eq!(most, 2, "the limit was reached, never passed");
    let completed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM runs WHERE id = ANY($1::uuid[]) AND state = 'completed'",
    )
    .bind(&ids)
    .fetch_one(&cluster.pool)
    .await
    .expect("count");
    assert_eq!(
        completed, 50,
        "every run completed, the killed one on another worker"
    );
    let (_, queues) = cluster.call("GET", "/api/v1/queues", None);
    assert!(queues["runs"]["held"].as_i64() == Some(0), "{queues}");
}

#[tokio::test]
async fn higher_priorities_are_claimed_first_when_workers_are_busy() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("flow-priority", 0, Settings::default()).await;
    cluster
        .worker_env
        .push(("CAIRN_WORKER_CONCURRENCY".into(), "1".into()));
    cluster.add_worker();
    let file = cluster.path("order");
    // The one slot is busy: everything with a priority waits for it.
    let blocker = run_spec(vec![json!({"key": "block", "argv": ["sleep", "2"]})], 1);
    let (blocker_id, _) = cluster.submit(&blocker);
    cluster.wait_for_state(&blocker_id, &["running"], LONG);
    let mut ids = Vec::new();
    for priority in [1, 5, -3, 10, 5] {
        let step =
            json!({"key": "note", "argv": ["sh", "-c", format!("echo {priority} >> {file}")]});
        let mut spec = run_spec(vec![step], 1);
        spec["priority"] = json!(priority);
        let (id, _) = cluster.submit(&spec);
        assert_eq!(cluster.run(&id)["held_by_flow_control"], true);
        ids.push(id);
    }
    let (_, queues) = cluster.call("GET", "/api/v1/queues", None);
    assert_eq!(queues["runs"]["held"], 5, "{queues}");
    let out = cluster.cairnctl().arg("queues").output().expect("cairnctl");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("5 held by flow control"), "{said}");
    for id in &ids {
        cluster.wait_for_state(id, &["completed"], LONG);
    }
    assert_eq!(cluster.lines("order"), ["10", "5", "5", "1", "-3"]);
}

#[tokio::test]
async fn a_rate_limit_of_five_a_second_holds_within_ten_percent_over_twenty_seconds() {
    let _services = ServiceLock::shared().await;
    // One worker's four slots are more than a 5/s run of `true` needs.
    let cluster = Cluster::start("flow-rate", 1, Settings::default()).await;
    let mut spec = run_spec(vec![json!({"key": "tick", "argv": ["true"]})], 1);
    spec["rate_limit"] = json!({"key": "api.example.com", "per_second": 5});
    let batch = json!({"runs": vec![spec; 150]});
    let (status, admitted) = cluster.call("POST", "/api/v1/runs/batch", Some(&batch));
    assert_eq!(status, 201, "{admitted}");
    let started = Instant::now();
    // Count the starts (claims) in a 20 s window that begins once the gate is steady.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let window: (f64, f64) = sqlx::query_as("SELECT EXTRACT(EPOCH FROM now())::float8, EXTRACT(EPOCH FROM now() + interval '20 seconds')::float8")
        .fetch_one(&cluster.pool)
        .await
        .expect("now");
    tokio::time::sleep(Duration::from_secs(21)).await;
    let starts: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM execution_requests e JOIN runs r ON r.id = e.run_id
          WHERE r.rate_key = 'api.example.com'
            AND e.claimed_at >= to_timestamp($1) AND e.claimed_at < to_timestamp($2)",
    )
    .bind(window.0)
    .bind(window.1)
    .fetch_one(&cluster.pool)
    .await
    .expect("count");
    eprintln!("flow control: {starts} starts of a 5/s key in 20 s");
    // No one-second window saw more than 5 releases.
    let most: i64 = sqlx::query_scalar(
        "SELECT COALESCE(max((SELECT count(*) FROM execution_requests o
                               WHERE o.gate_released_at >= e.gate_released_at
                                 AND o.gate_released_at < e.gate_released_at + interval '1 second')), 0)
           FROM execution_requests e WHERE e.gate_released_at IS NOT NULL",
    )
    .fetch_one(&cluster.pool)
    .await
    .expect("windows");
    assert!(most <= 5, "{most} releases within one second");
    assert!(
        (90..=110).contains(&starts),
        "{starts} starts in 20 s at 5/s (after {:?})",
        started.elapsed()
    );
}

/// A keyed run that needed a person did not count against its key meanwhile; decided,
/// it waits for the gate again instead of starting beside the key's running run.
#[tokio::test]
async fn a_run_queued_again_by_a_decision_waits_for_its_keys_slot() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("flow-readmit", 0, Settings::default()).await;
    let file = cluster.path("effects");
    let mut first = run_spec(
        vec![
            cairn_e2e::cluster::append_step("s1", &file, "s1", 0.0, false),
            cairn_e2e::cluster::append_step("s2", &file, "s2", 0.0, false),
        ],
        3,
    );
    first["concurrency_key"] = json!("deploy");
    // Its worker kills itself right after s2's intent: s2's outcome is unknown.
    cluster.add_faulty_worker("w1", "after_intent@2");
    let (first_id, _) = cluster.submit(&first);
    assert!(
        cluster.workers[0].process.wait_exit(LONG).is_some(),
        "{}",
        cluster.logs()
    );
    cluster.add_worker();
    cluster.wait_for_state(&first_id, &["needs_reconciliation"], LONG);

    let second = keyed(json!({"key": "slow", "argv": ["sleep", "3"]}), "deploy", 1);
    let (second_id, _) = cluster.submit(&second);
    cluster.wait_for_state(&second_id, &["running"], LONG);
    let decision = json!({"step_key": "s2", "decision": "mark_not_done", "reason": "s2 never ran"});
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (status, body) = cluster.call(
        "POST",
        &format!("/api/v1/runs/{first_id}/reconciliation/decisions/{id}"),
        Some(&decision),
    );
    assert_eq!(status, 201, "{body}");
    let first_now = cluster.run(&first_id);
    assert_eq!(
        (
            first_now["state"].as_str(),
            first_now["held_by_flow_control"].as_bool()
        ),
        (Some("queued"), Some(true)),
        "{first_now}"
    );
    while cluster.run(&first_id)["state"] != "completed" {
        assert!(
            executing(&cluster, "deploy").await <= 1,
            "two runs of deploy at once"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        cluster.run(&second_id)["state"],
        "completed",
        "the first waited for the second"
    );
}
