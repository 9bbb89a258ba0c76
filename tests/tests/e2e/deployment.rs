//! What an orchestrator relies on: readiness that reflects what a component needs to
//! serve, secrets read from files, no work parked on a busy worker, and a drain that
//! finishes steps but starts no new one.

use cairn_e2e::cluster::{run_spec, Cluster, Settings, ADMIN};
use cairn_e2e::{free_addr, request, wait_for_status, Isolation, Process, ServiceLock};
use nix::sys::signal::Signal;
use serde_json::json;
use std::time::{Duration, Instant};

const START: Duration = Duration::from_secs(60);
const LONG: Duration = Duration::from_secs(60);

/// An AMQP URL where nothing listens.
fn dead_amqp_url() -> String {
    format!("amqp://guest:guest@{}/%2f", free_addr())
}

fn with(mut env: Vec<(String, String)>, name: &str, value: &str) -> Vec<(String, String)> {
    env.retain(|(n, _)| n != name);
    env.push((name.into(), value.into()));
    env
}

fn gauge(addr: std::net::SocketAddr, dependency: &str) -> Option<f64> {
    let body = cairn_e2e::http(addr, "GET", "/metrics")
        .expect("metrics")
        .body;
    let series = format!("cairn_dependency_up{{dependency=\"{dependency}\"}} ");
    body.lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse().ok())
}

#[tokio::test]
async fn outages_of_what_a_component_serves_without_leave_it_ready_and_show_in_its_checks() {
    let _services = ServiceLock::shared().await;
    let isolation = Isolation::new("ready");
    let no_amqp = with(isolation.env(), "CAIRN_AMQP_URL", &dead_amqp_url());
    let no_redis = with(
        isolation.env(),
        "CAIRN_REDIS_URL",
        &format!("redis://{}", free_addr()),
    );
    // The scheduler's API needs only PostgreSQL; a worker serves no traffic.
    for (binary, listen_var, env, down) in [
        (
            "cairn-scheduler",
            "CAIRN_LISTEN",
            no_amqp.clone(),
            "rabbitmq",
        ),
        ("cairn-scheduler", "CAIRN_LISTEN", no_redis, "redis"),
        ("cairn-worker", "CAIRN_METRICS_LISTEN", no_amqp, "rabbitmq"),
    ] {
        let addr = free_addr();
        let mut process = Process::start(binary, &with(env, listen_var, &addr.to_string()));
        let ready = wait_for_status(&mut process, addr, "/readyz", 200, START).json();
        assert_eq!(ready["status"], "ready", "{binary}: {ready}");
        assert_eq!(ready["checks"][down], "unavailable", "{binary}: {ready}");
        assert_eq!(ready["checks"]["postgres"], "ok", "{binary}: {ready}");
        assert_eq!(gauge(addr, down), Some(0.0), "{binary}");
        assert_eq!(gauge(addr, "postgres"), Some(1.0), "{binary}");
    }
}

#[tokio::test]
async fn secrets_come_from_files_and_stay_out_of_the_environment() {
    let _services = ServiceLock::shared().await;
    let isolation = Isolation::new("files");
    let dir = std::env::temp_dir().join(format!("cairn-secrets-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let database_file = dir.join("database-url");
    std::fs::write(&database_file, format!("{}\n", isolation.database_url)).expect("write");
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{ADMIN}\n")).expect("write");
    let addr = free_addr();
    let mut env = isolation.env();
    env.retain(|(name, _)| name != "CAIRN_DATABASE_URL");
    env.extend([
        ("CAIRN_LISTEN".to_string(), addr.to_string()),
        (
            "CAIRN_DATABASE_URL_FILE".to_string(),
            database_file.display().to_string(),
        ),
        (
            "CAIRN_BOOTSTRAP_ADMIN_TOKEN_FILE".to_string(),
            token_file.display().to_string(),
        ),
    ]);
    let mut scheduler = Process::start("cairn-scheduler", &env);
    wait_for_status(&mut scheduler, addr, "/readyz", 200, START);
    // The token from the file is the admin's, on the database from the file.
    let runs = request(addr, "GET", "/api/v1/runs", Some(ADMIN), None).expect("call");
    assert_eq!(runs.status, 200, "{}", runs.body);
    let on_database: i64 = {
        let pool = sqlx::PgPool::connect(&isolation.database_url)
            .await
            .expect("database");
        sqlx::query_scalar("SELECT count(*) FROM api_tokens")
            .fetch_one(&pool)
            .await
            .expect("tokens")
    };
    assert_eq!(
        on_database, 1,
        "the bootstrap token went to the file's database"
    );
    let environ = std::fs::read(format!("/proc/{}/environ", scheduler.pid())).expect("environ");
    let environ = String::from_utf8_lossy(&environ);
    assert!(!environ.contains(&isolation.database_url) && !environ.contains(ADMIN));

    // Both forms at once are refused, naming them; so is a file that is not there.
    let mut both = env.clone();
    both.push(("CAIRN_DATABASE_URL".into(), isolation.database_url.clone()));
    let missing = with(env, "CAIRN_DATABASE_URL_FILE", "/nonexistent/cairn-db");
    for (env, says) in [
        (
            both,
            "CAIRN_DATABASE_URL and CAIRN_DATABASE_URL_FILE are both set",
        ),
        (
            missing,
            "CAIRN_DATABASE_URL_FILE: cannot read /nonexistent/cairn-db",
        ),
    ] {
        let mut refused = Process::start("cairn-scheduler", &env);
        let status = refused.wait_exit(Duration::from_secs(10)).expect("exits");
        assert_eq!(status.code(), Some(2));
        assert!(refused.log().contains(says), "{}", refused.log());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn sleeping_step(key: &str, file: &str, seconds: u32) -> serde_json::Value {
    json!({
        "key": key,
        "argv": ["sh", "-c", format!("echo start-{key} >> {file}; sleep {seconds}; echo end-{key} >> {file}")],
        "idempotent": false
    })
}

#[tokio::test]
async fn a_busy_worker_holds_no_delivery_that_another_worker_could_start() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("parked", 0, Settings::default()).await;
    cluster.worker_env = vec![("CAIRN_WORKER_CONCURRENCY".into(), "1".into())];
    cluster.add_worker();
    let file = cluster.path("effects");
    let (first, _) = cluster.submit(&run_spec(vec![sleeping_step("a", &file, 20)], 1));
    cluster.wait_until("the first step to start", LONG, || {
        cluster.lines("effects").contains(&"start-a".to_string())
    });
    let (second, _) = cluster.submit(&run_spec(vec![sleeping_step("b", &file, 0)], 1));
    // Time for RabbitMQ to push the second run to the busy worker, were it consuming.
    std::thread::sleep(Duration::from_secs(1));
    cluster.add_worker();
    cluster.wait_for_state(&second, &["completed"], LONG);
    // Had the busy worker held the delivery, the sweeper would have found it parked
    // there (queued while the new worker waited for work) and announced it again.
    let scheduler = cairn_e2e::http(cluster.api, "GET", "/metrics")
        .expect("metrics")
        .body;
    let reannounced = scheduler
        .lines()
        .find_map(|l| l.strip_prefix("cairn_sweeper_parked_reannounced_total "))
        .expect("the sweeper's counter");
    assert_eq!(
        reannounced.trim(),
        "0",
        "the second run was parked on the busy worker"
    );
    assert_eq!(cluster.run(&first)["state"], "running");
}

/// Starts a three-step run on one worker, adds a second, SIGTERMs the first while the
/// first step runs, and returns how long the first took to exit and each step's receipt
/// epoch once the run completed.
async fn drain_mid_run(label: &str, snapshots_shared: bool) -> (Duration, Vec<i64>) {
    let settings = Settings {
        drain_seconds: 60,
        ..Settings::default()
    };
    let mut cluster = Cluster::start(label, 0, settings).await;
    cluster.worker_env = vec![(
        "CAIRN_SNAPSHOTS_SHARED".into(),
        snapshots_shared.to_string(),
    )];
    cluster.add_worker();
    let file = cluster.path("effects");
    let steps = ["a", "b", "c"]
        .map(|key| sleeping_step(key, &file, 3))
        .to_vec();
    let (run_id, _) = cluster.submit(&run_spec(steps, 1));
    cluster.wait_until("the first step to start", LONG, || {
        cluster.lines("effects").contains(&"start-a".to_string())
    });
    cluster.add_worker();
    let signalled = Instant::now();
    cluster.workers[0].process.signal(Signal::SIGTERM);
    let status = cluster.workers[0]
        .process
        .wait_exit(Duration::from_secs(30))
        .expect("the worker exits");
    let exited_after = signalled.elapsed();
    assert!(status.success(), "{}", cluster.workers[0].process.log());
    let run = cluster.wait_for_state(&run_id, &["completed"], LONG);
    assert_eq!(run["attempt"], 1, "a hand-back is not a failed attempt");
    // Every step ran once and to its end: none was stopped.
    let lines = cluster.lines("effects");
    for key in ["a", "b", "c"] {
        for edge in ["start", "end"] {
            let line = format!("{edge}-{key}");
            assert_eq!(lines.iter().filter(|l| **l == line).count(), 1, "{lines:?}");
        }
    }
    let journal = cluster.journal(&run_id);
    let epochs = journal["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| step["receipt_epoch"].as_i64().expect("epoch"))
        .collect();
    (exited_after, epochs)
}

#[tokio::test]
async fn with_shared_snapshots_a_draining_worker_hands_the_run_back_at_the_step_boundary() {
    let _services = ServiceLock::shared().await;
    let (exited_after, epochs) = drain_mid_run("boundary", true).await;
    assert!(
        exited_after < Duration::from_secs(8),
        "the drained worker ran more than its current step ({exited_after:?})"
    );
    assert!(
        epochs[1] > epochs[0] && epochs[2] == epochs[1],
        "b and c ran under the second worker's claim: {epochs:?}"
    );
}

#[tokio::test]
async fn without_shared_snapshots_a_draining_worker_finishes_the_run_itself() {
    let _services = ServiceLock::shared().await;
    // No other worker could restore its checkpoints: it keeps the run within the drain.
    let (_, epochs) = drain_mid_run("finish", false).await;
    assert!(
        epochs.iter().all(|epoch| *epoch == epochs[0]),
        "every step ran under the first worker's claim: {epochs:?}"
    );
}
