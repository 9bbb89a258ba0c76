//! The worker fleet end to end: real scheduler and worker processes, killed, stopped and
//! drained, against real PostgreSQL, Redis and RabbitMQ.

use cairn_e2e::cluster::{append_step, run_spec, Cluster, Settings};
use cairn_e2e::interrupted::{die_after_second_intent, kill_during_second_step};
use cairn_e2e::ServiceLock;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

fn count(lines: &[String], line: &str) -> usize {
    lines.iter().filter(|l| l.as_str() == line).count()
}

#[tokio::test]
async fn a_run_completes_with_each_step_run_once_and_journaled() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("complete", 1, Settings::default()).await;
    let file = cluster.path("effects");
    let report = cluster.path("unused");
    let spec = run_spec(
        vec![
            append_step("a", &file, "a", 0.0, false),
            append_step("b", &file, "b", 0.0, false),
            json!({"key": "report", "argv": ["sh", "-c", "echo '{\"outcome\": \"complete\"}' > \"$CAIRN_REPORT_FILE\"; echo done"], "env": {"UNUSED": report}}),
        ],
        3,
    );
    let (run_id, _) = cluster.submit(&spec);
    let run = cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(run["usage"]["commands"], 3);
    assert_eq!(cluster.lines("effects"), ["a", "b"]);
    let journal = cluster.journal(&run_id);
    let steps = journal["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 3);
    for step in steps {
        assert_eq!(step["status"], "completed", "{step}");
        assert_eq!(step["exit_code"], 0);
        assert_eq!(step["intent_epoch"], step["receipt_epoch"]);
    }
    assert_eq!(steps[2]["stdout_tail"], "done\n");
    let accepted = journal["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .any(|e| e["entry_kind"] == "final_report_accepted");
    assert!(accepted, "the final report was accepted: {journal}");
    let consumed: i64 = sqlx::query_scalar("SELECT count(*) FROM report_consumptions")
        .fetch_one(&cluster.pool)
        .await
        .expect("count");
    assert_eq!(consumed, 1);
    assert!(cluster.metric(0, "cairn_worker_steps_run_total") >= 3.0);

    // A failing step fails the run and stops the plan there.
    let failing = run_spec(
        vec![
            json!({"key": "boom", "argv": ["sh", "-c", "echo oops >&2; exit 7"]}),
            append_step("after", &file, "after", 0.0, false),
        ],
        3,
    );
    let (failed_id, _) = cluster.submit(&failing);
    let failed = cluster.wait_for_state(&failed_id, &["failed"], LONG);
    assert!(
        failed["stop_reason"]
            .as_str()
            .is_some_and(|r| r.contains("boom") && r.contains('7')),
        "{failed}"
    );
    let boom = &cluster.journal(&failed_id)["steps"][0];
    assert_eq!(boom["stderr_tail"], "oops\n");
    assert_eq!(
        boom["status"], "failed",
        "a non-zero exit is a failed step: {boom}"
    );
    assert!(!cluster.lines("effects").contains(&"after".to_string()));
}

#[tokio::test]
async fn sigkill_mid_step_reuses_completed_steps_and_reruns_an_idempotent_one() {
    let _services = ServiceLock::shared().await;
    let (cluster, run_id, _) = kill_during_second_step("kill-idem", true, 3).await;
    let run = cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(run["attempt"], 2, "the sweeper gave it a second attempt");
    let lines = cluster.lines("effects");
    assert_eq!(
        count(&lines, "s1"),
        1,
        "s1 had a receipt and was reused: {lines:?}"
    );
    assert_eq!(count(&lines, "s3"), 1, "{lines:?}");
    assert_eq!(
        count(&lines, "s2-start"),
        2,
        "the idempotent step ran again: {lines:?}"
    );
    assert_eq!(
        count(&lines, "s2-end"),
        1,
        "the killed step never finished: {lines:?}"
    );
    let journal = cluster.journal(&run_id);
    let s1 = &journal["steps"][0];
    assert_eq!(s1["receipt_epoch"], 1, "s1's receipt is the first owner's");
    let s2 = &journal["steps"][1];
    assert!(s2["receipt_epoch"].as_i64() > Some(1));
}

/// A worker killed right after a step's intent committed, before the step started (a
/// fault point, not a racing kill): nobody can know whether the step ran, so a
/// non-idempotent step needs a person and is never started by the successor.
#[tokio::test]
async fn a_kill_between_a_steps_intent_and_its_start_needs_reconciliation() {
    let _services = ServiceLock::shared().await;
    let (cluster, run_id) = die_after_second_intent("after-intent").await;
    let run = cluster.wait_for_state(&run_id, &["needs_reconciliation"], LONG);
    assert_eq!(run["reconciliation_step"], "s2", "{run}");
    assert_eq!(run["stop_reason"], "unknown_outcome");
    let journal = cluster.journal(&run_id);
    assert_eq!(journal["steps"][0]["status"], "completed", "{journal}");
    assert_eq!(cluster.lines("effects"), ["s1"], "s2 was never started");
}

#[tokio::test]
async fn sigkill_mid_step_of_a_non_idempotent_step_needs_reconciliation() {
    let _services = ServiceLock::shared().await;
    let (cluster, run_id, _) = kill_during_second_step("kill-once", false, 3).await;
    let run = cluster.wait_for_state(&run_id, &["needs_reconciliation"], LONG);
    assert_eq!(run["reconciliation_step"], "s2", "{run}");
    assert_eq!(run["stop_reason"], "unknown_outcome");
    std::thread::sleep(Duration::from_millis(500));
    let lines = cluster.lines("effects");
    assert_eq!(count(&lines, "s1"), 1, "{lines:?}");
    assert_eq!(
        count(&lines, "s2-start"),
        1,
        "a step with an unknown outcome is not run again: {lines:?}"
    );
    assert_eq!(count(&lines, "s3"), 0, "{lines:?}");
}

#[tokio::test]
async fn a_stopped_run_continues_on_the_same_ticket_through_a_reviewed_continuation() {
    let _services = ServiceLock::shared().await;
    // One attempt only: when its worker dies, the request stops at its checkpoint.
    let (cluster, run_id, request_id) = kill_during_second_step("continue", true, 1).await;
    let stopped = cluster.wait_for_state(&run_id, &["stopped_at_checkpoint"], LONG);
    assert_eq!(stopped["stop_reason"], "attempts_exhausted");
    let used = stopped["usage"]["commands"].clone();

    cluster.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&json!({"enabled": true, "allow_checkpoint_continuation": true})),
    );
    let base = format!("/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}");
    let (_, candidate) = cluster.call("GET", &format!("{base}/candidate"), None);
    assert_eq!(candidate["admission"], "READY", "{candidate}");
    // The checkpoint names the tree s1's receipt stands on (the changed-source hold
    // compares it with the work context's tree now; missing, it would hold).
    let source = candidate["checkpoint"]["source_digest"]
        .as_str()
        .unwrap_or("");
    assert!(
        source.len() == 64 && source.bytes().all(|b| b.is_ascii_hexdigit()),
        "{candidate}"
    );
    let action = uuid::Uuid::new_v4().simple().to_string();
    let body = json!({
        "version": 1, "candidate_digest": candidate["candidate_digest"], "valid_for_seconds": 120,
        "acknowledge_retained_response_consumed_once": true, "acknowledge_no_completed_effect_replay": true,
        "acknowledge_same_request_attempt_and_budgets": true, "acknowledge_finite_ownership_lease": true
    });
    let (status, receipt) = cluster.call("POST", &format!("{base}/actions/{action}"), Some(&body));
    assert_eq!(status, 201, "{receipt}");

    let run = cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(
        run["attempt"], 1,
        "the same attempt: a continuation adds none"
    );
    assert!(
        run["usage"]["commands"].as_i64() > used.as_i64(),
        "usage carried forward and grew"
    );
    let (_, status) = cluster.call("GET", &format!("{base}/status"), None);
    assert_eq!(
        (status["status"].as_str(), status["action_id"].as_str()),
        (Some("completed"), Some(action.as_str()))
    );
    let lines = cluster.lines("effects");
    assert_eq!(
        count(&lines, "s1"),
        1,
        "completed effects are reused, never replayed: {lines:?}"
    );
    assert_eq!(count(&lines, "s3"), 1);
}

#[tokio::test]
async fn a_paused_worker_past_its_lease_cannot_write() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sigstop", 2, Settings::default()).await;
    let file = cluster.path("effects");
    let spec = run_spec(
        vec![
            json!({"key": "slow", "argv": ["sh", "-c", format!("echo start >> {file}; sleep 2; echo end >> {file}")], "idempotent": true}),
        ],
        3,
    );
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_until("the step to start", LONG, || {
        cluster.lines("effects").contains(&"start".to_string())
    });
    let first = cluster.worker_index(&cluster.holder(&request_id).await.expect("holder"));
    cluster.workers[first].process.signal(Signal::SIGSTOP);
    // The lease lapses, the sweeper gives the run a second attempt, the other worker runs it.
    let run = cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(run["attempt"], 2);
    let journal = cluster.journal(&run_id);
    let receipt_epoch = journal["steps"][0]["receipt_epoch"].clone();
    cluster.workers[first].process.signal(Signal::SIGCONT);
    cluster.wait_until("the paused worker's late write to be refused", LONG, || {
        cluster.metric(first, "cairn_worker_stale_writes_rejected_total") >= 1.0
            && cluster.metric(first, "cairn_worker_self_fenced_total") >= 1.0
    });
    std::thread::sleep(Duration::from_millis(500));
    let after = cluster.journal(&run_id);
    assert_eq!(
        after["steps"][0]["receipt_epoch"], receipt_epoch,
        "nothing the paused worker did became durable"
    );
    assert_eq!(cluster.run(&run_id)["state"], "completed");
}

#[tokio::test]
async fn sigterm_drains_within_the_drain_time_and_the_run_continues_elsewhere() {
    let _services = ServiceLock::shared().await;
    let settings = Settings {
        drain_seconds: 3,
        ..Settings::default()
    };
    let cluster = Cluster::start("drain", 1, settings).await;
    let file = cluster.path("effects");
    let spec = run_spec(
        vec![
            json!({"key": "long", "argv": ["sh", "-c", format!("echo start >> {file}; sleep 8; echo end >> {file}")], "idempotent": true}),
        ],
        3,
    );
    let (run_id, _) = cluster.submit(&spec);
    cluster.wait_until("the step to start", LONG, || {
        cluster.lines("effects").contains(&"start".to_string())
    });
    let mut cluster = cluster;
    cluster.add_worker();
    let started = std::time::Instant::now();
    cluster.workers[0].process.signal(Signal::SIGTERM);
    let status = cluster.workers[0]
        .process
        .wait_exit(Duration::from_secs(10))
        .expect("the worker exits");
    assert!(
        status.success(),
        "drained worker exits 0: {}",
        cluster.workers[0].process.log()
    );
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "exited within the drain time ({:?})",
        started.elapsed()
    );
    let run = cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(run["attempt"], 1, "a hand-back is not a failed attempt");
    // The metric moves just after the completion commits: wait for it, do not race it.
    cluster.wait_until(
        "the second worker to count the job it finished",
        LONG,
        || cluster.metric(1, "cairn_worker_jobs_completed_total") >= 1.0,
    );
}

/// A cancel reaches the worker at once, not at its next lease renewal (the lease lives
/// 30 s here, so a renewal is 10 s away), and the stopped step keeps its record: a
/// `cancelled` receipt with its output so far and the time it ran, charged.
#[tokio::test]
async fn cancelling_a_running_run_stops_its_step_at_once_and_keeps_its_record() {
    let _services = ServiceLock::shared().await;
    let settings = Settings {
        lease_ttl_seconds: 30,
        ..Settings::default()
    };
    let cluster = Cluster::start("cancel", 1, settings).await;
    let file = cluster.path("effects");
    let spec = run_spec(
        vec![json!({"key": "long", "argv": ["sh", "-c", format!(
            "echo start >> {file}; i=0; while [ $i -lt 60 ]; do echo tick $i; i=$((i+1)); sleep 0.5; done; echo end >> {file}"
        )]})],
        3,
    );
    let (run_id, _) = cluster.submit(&spec);
    cluster.wait_until("the step to start", LONG, || {
        cluster.lines("effects").contains(&"start".to_string())
    });
    std::thread::sleep(Duration::from_millis(1500));
    let (status, _) = cluster.call("POST", &format!("/api/v1/runs/{run_id}/cancel"), None);
    assert_eq!(status, 202);
    let started = std::time::Instant::now();
    let run = cluster.wait_for_state(&run_id, &["cancelled"], LONG);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the cancel landed after {:?}",
        started.elapsed()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(!cluster.lines("effects").contains(&"end".to_string()));

    let journal = cluster.journal(&run_id);
    let step = &journal["steps"][0];
    assert_eq!(step["status"], "cancelled", "{step}");
    assert!(
        step["stdout_tail"]
            .as_str()
            .is_some_and(|t| t.contains("tick 0\ntick 1\n")),
        "{step}"
    );
    let wall_ms = step["wall_ms"].as_i64().expect("wall time");
    assert!(wall_ms >= 1000, "{step}");
    assert!(
        run["usage"]["wall_ms"].as_i64().expect("charged") >= wall_ms,
        "{run}"
    );
}

#[tokio::test]
async fn budgets_are_never_reset_by_a_continuation() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("budget", 2, Settings::default()).await;
    let file = cluster.path("effects");
    let spec = json!({
        "agent": "e2e",
        "steps": [append_step("a", &file, "a", 0.0, false),
                  json!({"key": "b", "argv": ["sh", "-c", format!("echo b-start >> {file}; sleep 5")], "idempotent": true})],
        "budgets": {"max_commands": 2, "max_wall_seconds": 600},
        "max_attempts": 1
    });
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_until("b to start", LONG, || {
        cluster.lines("effects").contains(&"b-start".to_string())
    });
    let holder = cluster.worker_index(&cluster.holder(&request_id).await.expect("holder"));
    cluster.workers[holder].process.signal(Signal::SIGKILL);
    let stopped = cluster.wait_for_state(&run_id, &["stopped_at_checkpoint"], LONG);
    assert_eq!(
        stopped["usage"]["commands"], 2,
        "both commands were charged"
    );

    cluster.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&json!({"enabled": true, "allow_checkpoint_continuation": true})),
    );
    let base = format!("/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}");
    let (_, candidate) = cluster.call("GET", &format!("{base}/candidate"), None);
    let reasons: Vec<&str> = candidate["holds"]
        .as_array()
        .expect("holds")
        .iter()
        .filter_map(|h| h["reason"].as_str())
        .collect();
    assert!(reasons.contains(&"exhausted_limits"), "{candidate}");
    let body = json!({
        "version": 1, "candidate_digest": candidate["candidate_digest"], "valid_for_seconds": 60,
        "acknowledge_retained_response_consumed_once": true, "acknowledge_no_completed_effect_replay": true,
        "acknowledge_same_request_attempt_and_budgets": true, "acknowledge_finite_ownership_lease": true
    });
    let action = uuid::Uuid::new_v4().simple().to_string();
    let (status, error) = cluster.call("POST", &format!("{base}/actions/{action}"), Some(&body));
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (409, Some("candidate_held"))
    );

    // Even a continuation forced past review gets no more commands from the worker.
    let mut tx = cluster.pool.begin().await.expect("begin");
    sqlx::query(
        "INSERT INTO continuation_actions (id, kind, run_id, request_id, checkpoint_ref, input, input_digest, candidate_digest,
                witness_digest, admission_seal, valid_for_seconds, window_ends_at, status)
         VALUES ($1::uuid, 'checkpoint_continuation', $2::uuid, $3::uuid, 'forced', '{}', 'x', 'x', 'x', 'x', 60, now() + interval '60 seconds', 'queued')",
    )
    .bind(&action)
    .bind(&run_id)
    .bind(&request_id)
    .execute(&mut *tx)
    .await
    .expect("forced action");
    sqlx::query("UPDATE execution_requests SET state = 'queued' WHERE id = $1::uuid")
        .bind(&request_id)
        .execute(&mut *tx)
        .await
        .expect("queue");
    let message = json!({"kind": "checkpoint_continuation", "run_id": uuid::Uuid::parse_str(&run_id).expect("id"),
                         "request_id": uuid::Uuid::parse_str(&request_id).expect("id"), "action_id": uuid::Uuid::parse_str(&action).expect("id")});
    cairn_common::outbox::enqueue(&mut tx, "continuations", &message)
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    let failed = cluster.wait_for_state(&run_id, &["failed"], LONG);
    assert!(
        failed["stop_reason"]
            .as_str()
            .is_some_and(|r| r.contains("max_commands")),
        "{failed}"
    );
    assert_eq!(
        failed["usage"]["commands"], 2,
        "no command beyond the budget"
    );
    assert_eq!(count(&cluster.lines("effects"), "b-start"), 1);
}

#[tokio::test]
async fn a_retained_report_is_accepted_once_through_a_final_outcome_continuation() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("final", 0, Settings::default()).await;
    let file = cluster.path("effects");
    // The worker writes its report with the last receipt, then dies before accepting it
    // (the boundary a final-outcome continuation covers).
    let report = json!({"key": "report", "argv": ["sh", "-c", "printf '{\"outcome\": \"blocked\"}' > \"$CAIRN_REPORT_FILE\""]});
    let spec = run_spec(
        vec![append_step("only", &file, "only", 0.0, false), report],
        1,
    );
    cluster.add_faulty_worker("w1", "before_completion");
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["needs_reconciliation"], LONG);
    let (reason, _) = cluster.stop_reason(&request_id).await;
    assert_eq!(reason.as_deref(), Some("final_report_unaccepted"));
    cluster.add_worker();
    cluster.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&json!({"enabled": true, "allow_final_outcome_continuation": true})),
    );
    let base = format!("/api/v1/runs/{run_id}/final-outcome-continuations/requests/{request_id}");
    let (_, candidate) = cluster.call("GET", &format!("{base}/candidate"), None);
    assert_eq!(candidate["admission"], "READY", "{candidate}");
    let body = json!({
        "version": 1, "candidate_digest": candidate["candidate_digest"], "valid_for_seconds": 60,
        "acknowledge_already_consumed_final_output": true, "acknowledge_no_completed_effect_replay": true,
        "acknowledge_same_request_attempt_and_budgets": true, "acknowledge_finite_ownership_lease": true
    });
    let action = uuid::Uuid::new_v4().simple().to_string();
    let (status, _) = cluster.call("POST", &format!("{base}/actions/{action}"), Some(&body));
    assert_eq!(status, 201);
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let (_, read) = cluster.call("GET", &format!("{base}/status"), None);
    assert_eq!(read["status"], "completed");
    let consumed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM report_consumptions WHERE request_id = $1::uuid")
            .bind(&request_id)
            .fetch_one(&cluster.pool)
            .await
            .expect("count");
    assert_eq!(consumed, 1, "consumed exactly once");
    assert_eq!(cluster.lines("effects"), ["only"], "nothing ran again");
}

/// Redis keeps nothing on disk: restarting it mid-run loses every lease key, and still no
/// step runs twice and the run finishes.
#[tokio::test]
async fn a_redis_restart_mid_run_replays_nothing() {
    let _services = ServiceLock::exclusive().await;
    let cluster = Cluster::start("redis", 2, Settings::default()).await;
    let file = cluster.path("effects");
    let steps = (1..=4)
        .map(|i| append_step(&format!("s{i}"), &file, &format!("s{i}"), 0.7, false))
        .collect();
    let (run_id, _) = cluster.submit(&run_spec(steps, 3));
    cluster.wait_until("s1", LONG, || {
        cluster.lines("effects").contains(&"s1".to_string())
    });
    restart_redis();
    let run = cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(
        run["attempt"], 1,
        "the holder kept its lease: PostgreSQL decides, not Redis"
    );
    assert_eq!(cluster.lines("effects"), ["s1", "s2", "s3", "s4"]);
}

fn restart_redis() {
    let _ = std::process::Command::new("redis-cli")
        .args(["-p", "6379", "shutdown", "nosave"])
        .output();
    std::fs::create_dir_all("/var/lib/redis").expect("redis dir");
    std::fs::create_dir_all("/var/log/redis").expect("redis log dir");
    let started = std::process::Command::new("redis-server")
        .args([
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "-::1",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args([
            "--dir",
            "/var/lib/redis",
            "--logfile",
            "/var/log/redis/ci.log",
        ])
        .status()
        .expect("start redis");
    assert!(started.success());
    for _ in 0..100 {
        let pong = std::process::Command::new("redis-cli")
            .arg("ping")
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default();
        if pong.starts_with(b"PONG") {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("Redis did not come back");
}

/// RabbitMQ restarted while runs are being admitted and executed: every admitted run
/// still completes, and a sandbox created while the broker was down is placed once it
/// is back (each worker's two consumers, of jobs and of sandboxes, reconnect alone).
#[tokio::test]
async fn a_rabbitmq_restart_mid_run_loses_nothing() {
    let _services = ServiceLock::exclusive().await;
    let cluster = Cluster::start("rabbit", 2, Settings::default()).await;
    let file = cluster.path("effects");
    let mut runs = Vec::new();
    for i in 0..10 {
        runs.push(
            cluster
                .submit(&run_spec(
                    vec![append_step("only", &file, &format!("r{i}"), 0.3, false)],
                    3,
                ))
                .0,
        );
    }
    cairn_e2e::testing::rabbitmqctl(&["stop_app"]);
    for i in 10..20 {
        runs.push(
            cluster
                .submit(&run_spec(
                    vec![append_step("only", &file, &format!("r{i}"), 0.3, false)],
                    3,
                ))
                .0,
        );
    }
    let sandbox =
        cairn_e2e::sandboxes::create(&cluster, json!({"agent": "coder", "timeout_sec": 600}));
    std::thread::sleep(Duration::from_secs(2));
    cairn_e2e::testing::rabbitmqctl(&["start_app"]);
    cairn_e2e::testing::rabbitmqctl(&["await_startup"]);
    for run_id in &runs {
        cluster.wait_for_state(run_id, &["completed"], Duration::from_secs(120));
    }
    cairn_e2e::sandboxes::wait_state(&cluster, &sandbox, "running");
    let lines = cluster.lines("effects");
    for i in 0..20 {
        assert_eq!(count(&lines, &format!("r{i}")), 1, "run {i}: {lines:?}");
    }
}

/// A continuation is claimable only inside its admitted window: once the window ended
/// unclaimed, the request is back at a (new) checkpoint, and a fresh review admits it.
#[tokio::test]
async fn a_continuation_window_that_ends_unclaimed_admits_nothing() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("window", 1, Settings::default()).await;
    let file = cluster.path("effects");
    let spec = run_spec(
        vec![
            append_step("s1", &file, "s1", 0.0, false),
            json!({"key": "s2", "argv": ["sh", "-c", format!("echo s2-start >> {file}; sleep 4; echo s2-end >> {file}")], "idempotent": true}),
        ],
        1,
    );
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_until("s2 to start", LONG, || {
        cluster.lines("effects").contains(&"s2-start".to_string())
    });
    cluster.workers[0].process.signal(Signal::SIGKILL);
    cluster.wait_for_state(&run_id, &["stopped_at_checkpoint"], LONG);

    cluster.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&json!({"enabled": true, "allow_checkpoint_continuation": true})),
    );
    let base = format!("/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}");
    // No worker is alive: the one-second window ends unclaimed.
    let first = cluster.admit_checkpoint(&base, 1);
    let stopped = cluster.wait_for_state(&run_id, &["stopped_at_checkpoint"], LONG);
    assert_eq!(
        stopped["stop_reason"], "continuation_window_ended",
        "{stopped}"
    );
    let (_, status) = cluster.call("GET", &format!("{base}/status"), None);
    assert_eq!(
        (status["status"].as_str(), status["action_id"].as_str()),
        (Some("expired"), Some(first.as_str()))
    );
    let effects_before = cluster.lines("effects");
    cluster.add_worker();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        cluster.lines("effects"),
        effects_before,
        "the late delivery admitted nothing"
    );
    assert_eq!(cluster.run(&run_id)["state"], "stopped_at_checkpoint");

    // The new checkpoint can be reviewed and admitted again.
    let second = cluster.admit_checkpoint(&base, 120);
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let (_, status) = cluster.call("GET", &format!("{base}/status"), None);
    assert_eq!(
        (status["status"].as_str(), status["action_id"].as_str()),
        (Some("completed"), Some(second.as_str()))
    );
    assert_eq!(count(&cluster.lines("effects"), "s1"), 1);
}

/// An announcement naming another tenant than its run's carries no work into a
/// workspace: the worker drops it unclaimed, counts it, and the run waits queued for
/// its own announcement.
#[tokio::test]
async fn an_announcement_naming_another_tenant_is_dropped_unclaimed() {
    use cairn_common::outbox;
    use cairn_common::queue::JobQueue;
    use cairn_common::run::{JobKind, JobMessage};
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("tenant-announce", 0, Settings::default()).await;
    let (run_id, request_id) = cairn_common::testing::insert_request(&cluster.pool).await;
    take_announcement_of(&cluster, request_id).await;
    let message = JobMessage {
        kind: JobKind::Run,
        tenant: Some("beta".into()),
        run_id,
        request_id,
        action_id: None,
        attempt: Some(1),
    };
    let forged = serde_json::to_value(&message).expect("encode");
    let mut tx = cluster.pool.begin().await.expect("begin");
    outbox::enqueue(&mut tx, JobQueue::of(JobKind::Run).routing_key(), &forged)
        .await
        .expect("forged");
    tx.commit().await.expect("commit");
    cluster.add_worker();
    cluster.wait_until("the forged announcement is dropped", LONG, || {
        cluster.metric(0, "cairn_worker_tenant_mismatches_total") >= 1.0
    });
    let state = || async {
        sqlx::query_scalar::<_, String>("SELECT state FROM execution_requests WHERE id = $1")
            .bind(request_id)
            .fetch_one(&cluster.pool)
            .await
            .expect("state")
    };
    assert_eq!(state().await, "queued");
    // Its own announcement, stamped from the row, is claimed.
    let mut tx = cluster.pool.begin().await.expect("begin");
    outbox::announce(&mut tx, &message).await.expect("announce");
    tx.commit().await.expect("commit");
    let deadline = std::time::Instant::now() + LONG;
    while state().await == "queued" {
        assert!(std::time::Instant::now() < deadline, "never claimed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        cluster.metric(0, "cairn_worker_tenant_mismatches_total"),
        1.0
    );
}

/// Takes the admission's own announcement of `request_id` off the runs queue before any
/// worker consumes, as if it were lost: the run then has no announcement but the test's.
async fn take_announcement_of(cluster: &Cluster, request_id: uuid::Uuid) {
    use cairn_common::queue::{self, JobQueue, Topology};
    let connection = queue::connect(&cairn_common::testing::amqp_url())
        .await
        .expect("amqp");
    let runs = Topology::new(&cluster.isolation.prefix, 5).queue(JobQueue::Runs);
    let options = lapin::options::BasicGetOptions { no_ack: true };
    let taken = cairn_common::testing::eventually(LONG, || async {
        // A get from a queue the scheduler has not declared yet closes its channel: each
        // try opens its own.
        let channel = connection.create_channel().await.ok()?;
        let got = channel
            .basic_get(runs.as_str().into(), options)
            .await
            .ok()??;
        let message: serde_json::Value = serde_json::from_slice(&got.delivery.data).ok()?;
        Some(message)
    })
    .await
    .expect("the admission's announcement reached the queue");
    assert_eq!(taken["request_id"], request_id.to_string(), "{taken}");
}

/// The transaction that wrote a request's receipt of `step`, and the one that last
/// wrote its tree's row (the release).
async fn receipt_and_release_xids(
    cluster: &Cluster,
    request_id: &str,
    step: &str,
) -> (String, String) {
    sqlx::query_as(
        "SELECT r.xmin::text, w.xmin::text FROM journal_receipts r
           JOIN workspaces w ON w.request_id = r.request_id
          WHERE r.request_id = $1::uuid AND r.step_key = $2",
    )
    .bind(request_id)
    .bind(step)
    .fetch_one(&cluster.pool)
    .await
    .expect("the receipt and the tree's row")
}

/// A plan's last receipt, its checkpoint, its completion and its tree's release commit
/// in one transaction. A final report to accept keeps the completion in a transaction
/// of its own, as before.
#[tokio::test]
async fn a_plain_completion_commits_with_the_last_receipt() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("with-receipt", 0, Settings::default()).await;
    cluster.add_worker();
    let file = cluster.path("effects");
    let plain = run_spec(vec![append_step("only", &file, "only", 0.0, false)], 1);
    let (run_id, request_id) = cluster.submit(&plain);
    let run = cluster.wait_for_state(&run_id, &["completed", "failed"], LONG);
    assert_eq!(run["state"], "completed", "{run}");
    let (receipt, release) = receipt_and_release_xids(&cluster, &request_id, "only").await;
    assert_eq!(
        receipt, release,
        "the completion committed with the receipt"
    );
    let retired: bool = sqlx::query_scalar(
        "SELECT h.retired_at IS NOT NULL FROM lineage_heads h
           JOIN runs r ON r.work_context_id = h.work_context_id WHERE r.id = $1::uuid",
    )
    .bind(&run_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("the run's lineage");
    assert!(retired, "the completed task's lineage retired");
    // The seal that ends the tree writes its row and its capture's hold once, as the
    // tree's end: the row names the last receipt's snapshot, the hold ended with the task.
    let (at_receipt, hold_reason, hold_xid, receipt_xid): (bool, String, String, String) =
        sqlx::query_as(
            "SELECT COALESCE(w.snapshot_id = r.snapshot_id, FALSE), h.end_reason, h.xmin::text, r.xmin::text
               FROM journal_receipts r
               JOIN workspaces w ON w.request_id = r.request_id
               JOIN holds h ON h.workspace_id = w.id
              WHERE r.request_id = $1::uuid AND r.step_key = 'only'",
        )
        .bind(&request_id)
        .fetch_one(&cluster.pool)
        .await
        .expect("the receipt, the tree's row and its capture's hold");
    assert!(
        at_receipt,
        "the released tree's row names its last snapshot"
    );
    assert_eq!(
        hold_reason, "task_ended",
        "the capture's hold ended with the task"
    );
    assert_eq!(hold_xid, receipt_xid, "the hold ended with the receipt");
    // The lease goes with the move to completed, in the same statement.
    let (released, request_xid): (bool, String) = sqlx::query_as(
        "SELECT lease_owner IS NULL AND lease_deadline IS NULL, xmin::text
           FROM execution_requests WHERE id = $1::uuid",
    )
    .bind(&request_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("the request");
    assert!(released, "the completion released the lease");
    assert_eq!(request_xid, receipt_xid, "released with the receipt");

    let report = json!({"key": "report", "argv": ["sh", "-c", "printf '{\"outcome\": \"complete\"}' > \"$CAIRN_REPORT_FILE\""]});
    let reported = run_spec(
        vec![append_step("first", &file, "first", 0.0, false), report],
        1,
    );
    let (run_id, request_id) = cluster.submit(&reported);
    let run = cluster.wait_for_state(&run_id, &["completed", "failed"], LONG);
    assert_eq!(run["state"], "completed", "{run}");
    let (receipt, release) = receipt_and_release_xids(&cluster, &request_id, "report").await;
    assert_ne!(
        receipt, release,
        "a report is accepted in the completion's own transaction"
    );
    assert_eq!(cluster.lines("effects"), ["only", "first"]);
}

/// Submits `spec` to a worker `id` that kills itself right after the first intent
/// commits; returns the run and request ids once it is gone.
fn killed_after_intent(cluster: &mut Cluster, id: &str, spec: &Value) -> (String, String) {
    let index = cluster.add_faulty_worker(id, "after_intent");
    let ids = cluster.submit(spec);
    if cluster.workers[index].process.wait_exit(LONG).is_none() {
        panic!("never killed itself after the intent\n{}", cluster.logs());
    }
    ids
}

/// A request claimed again in the directory where its worker died gets a new row for
/// the tree at that path, and the earlier row of the path is destroyed in the
/// transaction that records it: only one row says where a tree is.
#[tokio::test]
async fn a_claim_at_a_dead_workers_path_destroys_its_earlier_row() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("same-path", 0, Settings::default()).await;
    let file = cluster.path("effects");
    let spec = run_spec(vec![append_step("only", &file, "only", 0.0, true)], 2);
    let (run_id, request_id) = killed_after_intent(&mut cluster, "f", &spec);
    // Restarted under its name, on its directory: the tree's path is the same.
    cluster.add_worker_named("f");
    let run = cluster.wait_for_state(&run_id, &["completed", "failed"], LONG);
    assert_eq!(run["state"], "completed", "{run}");
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT w.state, w.path, w.xmin::text FROM workspaces w
          WHERE w.request_id = $1::uuid ORDER BY w.created_at",
    )
    .bind(&request_id)
    .fetch_all(&cluster.pool)
    .await
    .expect("the request's tree rows");
    assert_eq!(rows.len(), 2, "a row per acquisition: {rows:?}");
    assert_eq!(rows[0].1, rows[1].1, "both trees at one path");
    assert_eq!(rows[0].0, "destroyed", "the dead worker's row: {rows:?}");
    let restored: Vec<String> = sqlx::query_scalar(
        "SELECT xmin::text FROM snapshot_restores WHERE request_id = $1::uuid ORDER BY created_at",
    )
    .bind(&request_id)
    .fetch_all(&cluster.pool)
    .await
    .expect("the request's restore records");
    assert_eq!(
        restored.last(),
        Some(&rows[0].2),
        "the earlier row ended with the new tree's record"
    );
    assert_eq!(cluster.lines("effects"), ["only"]);
}

/// A fresh request's first intent commits with its tree's record in use: the worker,
/// killed right after that intent, left both written by one transaction (a successor
/// still finds the step started, as after any intent).
#[tokio::test]
async fn a_fresh_requests_first_intent_commits_with_its_tree() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("first-intent", 0, Settings::default()).await;
    let file = cluster.path("effects");
    let spec = run_spec(vec![append_step("only", &file, "only", 0.0, false)], 1);
    let (_, request_id) = killed_after_intent(&mut cluster, "w1", &spec);
    let (intent, tree): (String, String) = sqlx::query_as(
        "SELECT i.xmin::text, r.xmin::text FROM journal_intents i
           JOIN snapshot_restores r ON r.request_id = i.request_id
          WHERE i.request_id = $1::uuid AND i.step_key = 'only'",
    )
    .bind(&request_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("the intent and the tree's record");
    assert_eq!(intent, tree, "the intent committed with the tree's record");
    // The intent's charge recorded how the tree was acquired, in the same statement.
    let context: Option<Value> =
        sqlx::query_scalar("SELECT resume_context FROM execution_requests WHERE id = $1::uuid")
            .bind(&request_id)
            .fetch_one(&cluster.pool)
            .await
            .expect("the resume context");
    let tier = context.as_ref().map(|c| c["restore_tier"].clone());
    assert!(
        tier.as_ref().is_some_and(Value::is_string),
        "the first intent recorded the resume context: {context:?}"
    );
    assert!(
        cluster.lines("effects").is_empty(),
        "the step never started"
    );
}
