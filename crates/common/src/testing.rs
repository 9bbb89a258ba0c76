//! Helpers for tests that talk to the real PostgreSQL, Redis and RabbitMQ.
//!
//! Each test isolates itself: its own database (`#[sqlx::test]`), its own Redis key
//! prefix and its own queue prefix. Tests that disrupt a service for everyone
//! (`FLUSHALL`, stopping RabbitMQ) take the machine-wide services lock exclusively; every
//! other service test holds it shared, so two suites on one machine never disrupt each
//! other's running tests.

use std::fs::File;
use std::time::Duration;
use uuid::Uuid;

/// The machine-wide lock file shared by every Cairn test process.
const LOCK_PATH: &str = "/tmp/cairn-test-services.lock";

/// Held for a test's duration; released on drop.
pub struct ServiceLock {
    _file: File,
}

fn lock_file() -> File {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_PATH)
        .expect("open the services lock file")
}

impl ServiceLock {
    /// Shared: this test uses the services but does not disrupt them.
    pub async fn shared() -> ServiceLock {
        tokio::task::spawn_blocking(|| {
            let file = lock_file();
            file.lock_shared().expect("take the services lock shared");
            ServiceLock { _file: file }
        })
        .await
        .expect("lock task")
    }

    /// Exclusive: this test restarts or flushes a service.
    pub async fn exclusive() -> ServiceLock {
        tokio::task::spawn_blocking(|| {
            let file = lock_file();
            file.lock().expect("take the services lock exclusively");
            ServiceLock { _file: file }
        })
        .await
        .expect("lock task")
    }
}

/// A prefix unique to one test, for Redis keys and queue names.
pub fn unique_prefix(label: &str) -> String {
    format!("test-{label}-{}.", &Uuid::new_v4().simple().to_string()[..12])
}

pub fn redis_url() -> String {
    std::env::var("CAIRN_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

pub fn amqp_url() -> String {
    std::env::var("CAIRN_AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Inserts a run with one queued execution request; returns `(run_id, request_id)`.
pub async fn insert_request(pool: &sqlx::PgPool) -> (Uuid, Uuid) {
    let run_id = Uuid::new_v4();
    let request_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO runs (id, root_run_id, task_id, agent, steps, max_commands, max_wall_seconds,
                           max_attempts, state, request_digest)
         VALUES ($1, $1, $1, 'test-agent', '[]', 10, 600, 3, 'queued', 'test')",
    )
    .bind(run_id)
    .execute(pool)
    .await
    .expect("insert run");
    sqlx::query(
        "INSERT INTO execution_requests (id, run_id, kind, state, max_attempts, max_commands, max_wall_seconds)
         VALUES ($1, $2, 'run', 'queued', 3, 10, 600)",
    )
    .bind(request_id)
    .bind(run_id)
    .execute(pool)
    .await
    .expect("insert execution request");
    (run_id, request_id)
}

/// Polls `check` until it returns `Some` or `timeout` passes.
pub async fn eventually<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a `rabbitmqctl` subcommand, panicking with its output on failure.
pub fn rabbitmqctl(args: &[&str]) {
    let output = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("run rabbitmqctl");
    assert!(
        output.status.success(),
        "rabbitmqctl {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
