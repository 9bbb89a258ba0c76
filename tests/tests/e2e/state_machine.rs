//! The request state machine on real binaries: a continuation's window, a cancel and
//! the wall-time budget hold where work is claimed and recorded, a stale message runs
//! nothing, and a worker's pool fits its concurrency.

use cairn_e2e::cluster::{append_step, run_spec, Cluster, Settings};
use cairn_e2e::{testing, Process, ServiceLock};
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(90);
const ENDED: &[&str] = &[
    "completed",
    "failed",
    "cancelled",
    "stopped_at_checkpoint",
    "needs_reconciliation",
];

fn allow_checkpoint_continuations(cluster: &Cluster) {
    let policy = json!({"enabled": true, "allow_checkpoint_continuation": true});
    let (status, body) = cluster.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&policy),
    );
    assert_eq!(status, 200, "{body}");
}

/// Admits a checkpoint continuation open for `valid_for` seconds; returns its id.
fn admit(cluster: &Cluster, run_id: &str, request_id: &str, valid_for: u64) -> String {
    let base = format!("/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}");
    cluster.admit_checkpoint(&base, valid_for)
}

/// `count` steps that each sleep `seconds`, then append their key to `file`.
fn slow_steps(file: &str, count: usize, seconds: f64) -> Vec<Value> {
    (1..=count)
        .map(|i| append_step(&format!("s{i}"), file, &format!("s{i}"), seconds, true))
        .collect()
}

async fn action_status(cluster: &Cluster, action: &str) -> String {
    sqlx::query_scalar("SELECT status FROM continuation_actions WHERE id = $1::uuid")
        .bind(action)
        .fetch_one(&cluster.pool)
        .await
        .expect("action")
}

#[tokio::test]
async fn a_continuation_stops_when_its_window_ends() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("window-ends", 1, Settings::default()).await;
    let file = cluster.path("effects");
    let (run_id, request_id) = cluster.submit(&run_spec(slow_steps(&file, 12, 1.0), 1));
    cluster.wait_until("s1", LONG, || cluster.lines("effects").len() == 1);
    cluster.workers[0].process.signal(Signal::SIGKILL);
    cluster.wait_for_state(&run_id, &["stopped_at_checkpoint"], LONG);

    allow_checkpoint_continuations(&cluster);
    cluster.add_worker();
    let action = admit(&cluster, &run_id, &request_id, 3);
    let run = cluster.wait_for_state(&run_id, ENDED, LONG);
    assert_eq!(
        (run["state"].as_str(), run["stop_reason"].as_str()),
        (
            Some("stopped_at_checkpoint"),
            Some("continuation_window_ended")
        ),
        "the window is the contract: {run}"
    );
    assert_eq!(action_status(&cluster, &action).await, "failed");
    // No step started after the window ended, and none was receipted after it (a step
    // ending at the boundary may commit within a moment).
    let (late_intents, late_receipts): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM journal_intents i WHERE i.request_id = a.request_id
                   AND i.started_at > a.window_ends_at),
                (SELECT count(*) FROM journal_receipts r WHERE r.request_id = a.request_id
                   AND r.finished_at > a.window_ends_at + interval '1 second')
           FROM continuation_actions a WHERE a.id = $1::uuid",
    )
    .bind(&action)
    .fetch_one(&cluster.pool)
    .await
    .expect("journal");
    assert_eq!((late_intents, late_receipts), (0, 0), "{}", cluster.logs());
    assert!(
        cluster.lines("effects").len() < 12,
        "the plan did not run to its end"
    );
}

async fn lease_epoch(cluster: &Cluster, request: uuid::Uuid) -> i64 {
    sqlx::query_scalar("SELECT lease_epoch FROM execution_requests WHERE id = $1")
        .bind(request)
        .fetch_one(&cluster.pool)
        .await
        .expect("epoch")
}

/// Waits until a worker has claimed (and let go of) the request once more.
async fn claimed_after(cluster: &Cluster, request: uuid::Uuid, epoch: i64) {
    let deadline = std::time::Instant::now() + LONG;
    while lease_epoch(cluster, request).await <= epoch {
        assert!(std::time::Instant::now() < deadline, "{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_stale_run_message_after_a_window_ended_runs_nothing() {
    let _services = ServiceLock::shared().await;
    // No sweep will come in time: the gap between a window's end and the next sweep.
    let settings = Settings {
        sweep_interval_seconds: 3600.0,
        ..Settings::default()
    };
    let mut cluster = Cluster::start("stale-run", 0, settings).await;
    let file = cluster.path("effects");
    let (run_id, request_id) = cluster.submit(&run_spec(slow_steps(&file, 2, 0.0), 1));
    let request = uuid::Uuid::parse_str(&request_id).expect("id");
    let run = uuid::Uuid::parse_str(&run_id).expect("id");
    // Stopped at its checkpoint before any worker took it; then a reviewed continuation
    // admitted it, whose window has ended and whose own message is gone (consumed in the
    // gap). Only the run's first message, delivered again, is left.
    let mut conn = cluster.pool.acquire().await.expect("conn");
    cairn_common::request::stop_at_checkpoint(&mut conn, request, "attempts_exhausted")
        .await
        .expect("stop");
    let action = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO continuation_actions (id, kind, run_id, request_id, checkpoint_ref, input, input_digest,
                candidate_digest, witness_digest, admission_seal, valid_for_seconds, window_ends_at, status)
         VALUES ($1, 'checkpoint_continuation', $2, $3, 'checkpoint:1', '{}', 'x', 'x', 'x', 'x', 1,
                 now() - interval '1 second', 'queued')",
    )
    .bind(action)
    .bind(run)
    .bind(request)
    .execute(&mut *conn)
    .await
    .expect("action");
    let event = cairn_common::request::RequestEvent::ContinueFromCheckpoint;
    cairn_common::request::transition(&mut conn, request, event, None, None)
        .await
        .expect("admitted");
    let epoch = lease_epoch(&cluster, request).await;
    cluster.add_worker();
    claimed_after(&cluster, request, epoch).await;
    assert_eq!(
        cluster.lines("effects"),
        Vec::<String>::new(),
        "nothing ran"
    );
    assert_eq!(
        cluster.run(&run_id)["state"],
        "queued",
        "the plan never started"
    );

    // The continuation's own message, delivered late: its window is checked at claim.
    let message = json!({"kind": "checkpoint_continuation", "run_id": run, "request_id": request,
                         "action_id": action, "attempt": 1});
    let epoch = lease_epoch(&cluster, request).await;
    cairn_common::outbox::enqueue(&mut conn, "continuations", &message)
        .await
        .expect("enqueue");
    drop(conn);
    claimed_after(&cluster, request, epoch).await;
    // The stop is written after the claim, in the worker's next transaction.
    let run = cluster.wait_for_state(&run_id, &["stopped_at_checkpoint"], LONG);
    assert_eq!(
        run["stop_reason"].as_str(),
        Some("continuation_window_ended"),
        "{run}"
    );
    let expired = testing::eventually(LONG, || async {
        (action_status(&cluster, &action.to_string()).await == "expired").then_some(())
    })
    .await;
    assert!(expired.is_some(), "{}", cluster.logs());
    assert_eq!(
        cluster.lines("effects"),
        Vec::<String>::new(),
        "nothing ran"
    );
}

#[tokio::test]
async fn the_wall_time_of_an_interrupted_step_is_charged() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("wall-budget", 1, Settings::default()).await;
    let file = cluster.path("effects");
    let step = json!({"key": "s1", "idempotent": true, "timeout_seconds": 120,
                      "argv": ["sh", "-c", format!("echo start >> {file}; sleep 6; echo end >> {file}")]});
    // One attempt fits in 7 s, but not one after the killed attempt's charge (at least
    // the 2 s before the kill); the 6 s step gives the kill 4 s of slack to land.
    let spec = json!({"agent": "e2e", "steps": [step], "max_attempts": 3,
                      "budgets": {"max_commands": 50, "max_wall_seconds": 7}});
    let (run_id, _) = cluster.submit(&spec);
    cluster.wait_until("the step to start", LONG, || {
        cluster.lines("effects").contains(&"start".to_string())
    });
    std::thread::sleep(Duration::from_secs(2));
    cluster.workers[0].process.signal(Signal::SIGKILL);
    cluster.add_worker();
    let run = cluster.wait_for_state(&run_id, ENDED, LONG);
    assert_eq!(run["state"], "failed", "7 s cannot hold 2 s + 6 s: {run}");
    assert!(
        run["usage"]["wall_ms"].as_i64().unwrap_or(0) >= 2000,
        "the killed step was charged: {run}"
    );
    assert!(
        !cluster.lines("effects").contains(&"end".to_string()),
        "no attempt ran the step past the budget"
    );
}

#[tokio::test]
async fn a_cancel_that_wins_is_a_cancel() {
    let _services = ServiceLock::shared().await;
    // Renewals every 10 s: only the intent check can see the cancel in time.
    let settings = Settings {
        lease_ttl_seconds: 30,
        ..Settings::default()
    };
    let cluster = Cluster::start("cancel-wins", 1, settings).await;
    let file = cluster.path("effects");
    let (run_id, _) = cluster.submit(&run_spec(slow_steps(&file, 20, 0.2), 1));
    cluster.wait_until("s2", LONG, || cluster.lines("effects").len() >= 2);
    let (status, body) = cluster.call("POST", &format!("/api/v1/runs/{run_id}/cancel"), None);
    assert_eq!(status, 202, "{body}");
    let at_cancel = cluster.lines("effects").len();
    let run = cluster.wait_for_state(&run_id, ENDED, LONG);
    assert_eq!(run["state"], "cancelled", "{run}");
    let after = cluster.lines("effects").len();
    assert!(
        after <= at_cancel + 1,
        "only the step running at the cancel may finish: {at_cancel} then {after}"
    );
}

#[tokio::test]
async fn a_worker_pool_fits_its_concurrency() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("pool", 0, Settings::default()).await;
    cluster.worker_env = vec![("CAIRN_WORKER_CONCURRENCY".into(), "25".into())];
    // Too small a pool for 25 jobs is refused before the worker claims anything.
    let mut env = cluster.isolation.env();
    env.extend([
        ("CAIRN_WORKER_CONCURRENCY".to_string(), "25".to_string()),
        (
            "CAIRN_DATABASE_MAX_CONNECTIONS".to_string(),
            "10".to_string(),
        ),
        (
            "CAIRN_WORKSPACES_DIR".to_string(),
            cluster.path("refused-workspaces"),
        ),
    ]);
    let mut refused = Process::start("cairn-worker", &env);
    let exit = refused
        .wait_exit(Duration::from_secs(30))
        .expect("it exits");
    assert_eq!(exit.code(), Some(2), "{}", refused.log());
    assert!(
        refused.log().contains("CAIRN_DATABASE_MAX_CONNECTIONS"),
        "{}",
        refused.log()
    );

    // Left unset, the pool is sized from the concurrency: 25 jobs at once all finish.
    cluster.add_worker();
    let file = cluster.path("effects");
    let runs: Vec<String> = (0..25)
        .map(|i| {
            let step = append_step("s1", &file, &format!("r{i}"), 2.0, false);
            cluster.submit(&run_spec(vec![step], 1)).0
        })
        .collect();
    for run_id in &runs {
        let run = cluster.wait_for_state(run_id, ENDED, LONG);
        assert_eq!(run["state"], "completed", "{run}");
    }
}
