//! Every binary starts against the real services, serves its probes and metrics, and
//! drains on SIGTERM; an invalid configuration is one clear line and a non-zero exit.

use cairn_e2e::{free_addr, testing, wait_for_status, Isolation, Process, ServiceLock};
use nix::sys::signal::Signal;
use std::time::Duration;

const START: Duration = Duration::from_secs(60);

fn started(
    binary: &str,
    isolation: &Isolation,
    listen_var: &str,
) -> (Process, std::net::SocketAddr) {
    let addr = free_addr();
    let mut env = isolation.env();
    env.push((listen_var.into(), addr.to_string()));
    (Process::start(binary, &env), addr)
}

/// The scheduler is ready once PostgreSQL answers; its relay's RabbitMQ connection (and
/// the topology it declares) follows. Waits for it; returns the checks.
fn rabbitmq_connected(addr: std::net::SocketAddr) -> serde_json::Value {
    let deadline = std::time::Instant::now() + START;
    loop {
        let ready = cairn_e2e::http(addr, "GET", "/readyz").expect("readyz");
        let checks = ready.json()["checks"].clone();
        if checks["rabbitmq"] == "ok" || std::time::Instant::now() > deadline {
            return checks;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn assert_drains_on_sigterm(mut process: Process) {
    process.signal(Signal::SIGTERM);
    let status = process
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| {
            panic!(
                "{} did not stop after SIGTERM:\n{}",
                process.name,
                process.log()
            )
        });
    assert!(
        status.success(),
        "{} exited with {status}:\n{}",
        process.name,
        process.log()
    );
}

#[tokio::test]
async fn the_scheduler_creates_its_database_serves_probes_and_drains() {
    let _services = ServiceLock::shared().await;
    let isolation = Isolation::unmade("sched");
    let (mut scheduler, addr) = started("cairn-scheduler", &isolation, "CAIRN_LISTEN");

    wait_for_status(&mut scheduler, addr, "/healthz", 200, START);
    let ready = wait_for_status(&mut scheduler, addr, "/readyz", 200, START).json();
    assert_eq!(ready["status"], "ready");
    let checks = rabbitmq_connected(addr);
    for dependency in ["postgres", "redis", "rabbitmq"] {
        assert_eq!(checks[dependency], "ok", "{checks}");
    }
    let metrics = cairn_e2e::http(addr, "GET", "/metrics").expect("metrics");
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.body.contains("cairn_outbox_published_total"),
        "{}",
        metrics.body
    );

    // The database did not exist before the scheduler started; it migrated it.
    let pool = sqlx::PgPool::connect(&isolation.database_url)
        .await
        .expect("database exists");
    let policy: i64 = sqlx::query_scalar("SELECT count(*) FROM recovery_policy")
        .fetch_one(&pool)
        .await
        .expect("schema migrated");
    assert_eq!(policy, 1);
    pool.close().await;

    assert_drains_on_sigterm(scheduler);
}

/// The scheduler's relay publishes what is written to its outbox.
#[tokio::test]
async fn the_scheduler_relays_its_outbox_to_rabbitmq() {
    let _services = ServiceLock::shared().await;
    let isolation = Isolation::new("relay");
    let (mut scheduler, addr) = started("cairn-scheduler", &isolation, "CAIRN_LISTEN");
    wait_for_status(&mut scheduler, addr, "/readyz", 200, START);
    rabbitmq_connected(addr);

    let pool = sqlx::PgPool::connect(&isolation.database_url)
        .await
        .expect("database");
    let mut tx = pool.begin().await.expect("begin");
    let message_id =
        cairn_common::outbox::enqueue(&mut tx, "runs", &serde_json::json!({"hello": "cairn"}))
            .await
            .expect("enqueue");
    tx.commit().await.expect("commit");

    let connection = cairn_common::queue::connect(&testing::amqp_url())
        .await
        .expect("amqp");
    let channel = connection.create_channel().await.expect("channel");
    let topology = cairn_common::queue::Topology::new(&isolation.prefix, 5);
    let queue = topology.queue(cairn_common::queue::JobQueue::Runs);
    let delivered = testing::eventually(Duration::from_secs(20), || async {
        channel
            .basic_get(queue.as_str().into(), lapin_get_options())
            .await
            .ok()
            .flatten()
    })
    .await
    .unwrap_or_else(|| panic!("message never reached {queue}:\n{}", scheduler.log()));
    let got = delivered
        .delivery
        .properties
        .message_id()
        .clone()
        .expect("message id");
    assert_eq!(got.as_str(), message_id.simple().to_string());
    // The relay marks the row published only after the broker's confirm, so the
    // message can be delivered a moment before that update commits.
    let marked = testing::eventually(Duration::from_secs(20), || async {
        (cairn_common::outbox::pending(&pool).await.ok()? == 0).then_some(())
    })
    .await;
    assert!(
        marked.is_some(),
        "the relayed row was never marked published:\n{}",
        scheduler.log()
    );

    assert_drains_on_sigterm(scheduler);
    let _ = topology.delete(&channel).await;
    pool.close().await;
}

fn lapin_get_options() -> lapin::options::BasicGetOptions {
    lapin::options::BasicGetOptions { no_ack: true }
}

#[tokio::test]
async fn the_worker_and_the_reaper_serve_probes_and_drain() {
    let _services = ServiceLock::shared().await;
    let isolation = Isolation::new("probes");
    for binary in ["cairn-worker", "cairn-reaper"] {
        let (mut process, addr) = started(binary, &isolation, "CAIRN_METRICS_LISTEN");
        wait_for_status(&mut process, addr, "/healthz", 200, START);
        let ready = wait_for_status(&mut process, addr, "/readyz", 200, START).json();
        assert_eq!(ready["checks"]["postgres"], "ok", "{binary}: {ready}");
        let metrics = cairn_e2e::http(addr, "GET", "/metrics").expect("metrics");
        assert_eq!(metrics.status, 200, "{binary}");
        assert_drains_on_sigterm(process);
    }
}

/// Logging never stops shutdown: with stderr on a pipe whose reader is gone, every
/// binary still starts, and still drains and exits on SIGTERM.
#[tokio::test]
async fn every_binary_exits_on_sigterm_with_stderr_on_a_closed_pipe() {
    let _services = ServiceLock::shared().await;
    let isolation = Isolation::new("closedpipe");
    for (binary, listen_var, probe) in [
        ("cairn-scheduler", "CAIRN_LISTEN", "/readyz"),
        ("cairn-worker", "CAIRN_METRICS_LISTEN", "/readyz"),
        ("cairn-reaper", "CAIRN_METRICS_LISTEN", "/readyz"),
    ] {
        let addr = free_addr();
        let mut env = isolation.env();
        env.push((listen_var.into(), addr.to_string()));
        // The pretty format, as a terminal user's pipe would carry it.
        env.retain(|(k, _)| k != "CAIRN_LOG_FORMAT");
        let mut process = Process::start_with_closed_stderr(binary, &env);
        wait_for_status(&mut process, addr, probe, 200, START);
        assert_drains_on_sigterm(process);
    }
}

/// The pretty format is for a person at a terminal: into a file it writes no colour codes.
#[tokio::test]
async fn the_pretty_format_writes_no_colour_codes_into_a_file() {
    let _services = ServiceLock::shared().await;
    let isolation = Isolation::new("pretty");
    let addr = free_addr();
    let mut env = isolation.env();
    env.retain(|(k, _)| k != "CAIRN_LOG_FORMAT");
    env.push(("CAIRN_METRICS_LISTEN".into(), addr.to_string()));
    let mut reaper = Process::start("cairn-reaper", &env);
    wait_for_status(&mut reaper, addr, "/readyz", 200, START);
    let log = reaper.log();
    assert!(log.contains("INFO"), "the reaper logged: {log:?}");
    assert!(!log.contains('\u{1b}'), "colour codes in a file: {log:?}");
    assert_drains_on_sigterm(reaper);
}

#[test]
fn an_invalid_configuration_is_one_line_and_a_non_zero_exit() {
    let cases: [(&str, &[(&str, &str)]); 6] = [
        ("cairn-scheduler", &[("CAIRN_LISTEN", "not-an-address")]),
        (
            "cairn-scheduler",
            &[("CAIRN_DATABASE_URL", "mysql://localhost/cairn")],
        ),
        ("cairn-worker", &[("CAIRN_AMQP_URL", "http://localhost")]),
        ("cairn-worker", &[("CAIRN_LOG_FORMAT", "xml")]),
        (
            "cairn-reaper",
            &[("CAIRN_METRICS_LISTEN", "127.0.0.1:99999")],
        ),
        ("cairnctl", &[("CAIRN_DATABASE_URL", "redis://localhost")]),
    ];
    for (binary, env) in cases {
        let mut command = std::process::Command::new(cairn_e2e::binary(binary));
        if binary == "cairnctl" {
            command.arg("migrate");
        }
        let output = command
            .envs(env.iter().copied())
            .output()
            .expect("run binary");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{binary} {env:?}: {stderr}");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{binary} {env:?}: one line, got {stderr:?}"
        );
        assert!(
            stderr.starts_with("invalid configuration: "),
            "{binary}: {stderr}"
        );
        // It names the variable, with its value unless that may hold a secret (a URL).
        let (var, value) = env[0];
        let named = if var.ends_with("_URL") {
            format!("{var}: ")
        } else {
            format!("{var}={value}: ")
        };
        assert!(stderr.contains(&named), "{binary}: {stderr}");
        if var.ends_with("_URL") {
            assert!(!stderr.contains(value), "{binary}: {stderr}");
        }
    }
    // A setting with a list of values lists them.
    let output = std::process::Command::new(cairn_e2e::binary("cairn-worker"))
        .env("CAIRN_LOG_FORMAT", "xml")
        .output()
        .expect("run binary");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim_end(),
        "invalid configuration: CAIRN_LOG_FORMAT=xml: allowed values: pretty, json"
    );
}
