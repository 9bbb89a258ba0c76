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
        Self::take(|f| f.lock_shared()).await
    }

    /// Exclusive: this test restarts or flushes a service.
    pub async fn exclusive() -> ServiceLock {
        Self::take(|f| f.lock()).await
    }

    async fn take(lock: fn(&File) -> std::io::Result<()>) -> ServiceLock {
        tokio::task::spawn_blocking(move || {
            let file = lock_file();
            lock(&file).expect("take the services lock");
            ServiceLock { _file: file }
        })
        .await
        .expect("lock task")
    }
}

/// A checkpoint of `agent`'s task `context` in a local store that is never read.
pub fn new_checkpoint(agent: &str, context: Uuid) -> crate::lineage::NewSnapshot<'_> {
    crate::lineage::NewSnapshot {
        kind: "checkpoint",
        agent,
        repository: None,
        backend: "local",
        base_image: None,
        canonical_ref: None,
        work_context_id: Some(context),
        workspace_id: None,
        store_url: "file:///tmp/store",
        store_id: Uuid::from_u128(1),
        credential_generation: 0,
        owner: None,
        predecessor: None,
        name: None,
        writer_node: None,
    }
}

/// A prefix unique to one test, for Redis keys and queue names.
pub fn unique_prefix(label: &str) -> String {
    format!(
        "test-{label}-{}.",
        &Uuid::new_v4().simple().to_string()[..12]
    )
}

pub fn redis_url() -> String {
    std::env::var("CAIRN_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

pub fn amqp_url() -> String {
    std::env::var("CAIRN_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Admits a run of one step with its queued execution request and its announcement,
/// through the admission the API uses (by an operator token of the default tenant);
/// returns `(run_id, request_id)`.
pub async fn insert_request(pool: &sqlx::PgPool) -> (Uuid, Uuid) {
    let secret = Uuid::new_v4().simple().to_string();
    let operator =
        crate::token::insert(pool, "test-operator", "operator", Some("default"), &secret)
            .await
            .expect("operator token");
    let spec: crate::run::RunSpec = serde_json::from_value(serde_json::json!({
        "agent": "test-agent",
        "steps": [{"key": "s1", "argv": ["true"]}],
        "budgets": {"max_commands": 10, "max_wall_seconds": 600},
    }))
    .expect("spec");
    let mut tx = pool.begin().await.expect("begin");
    let run_ids = crate::request::admit::admit(&mut tx, &[spec], operator, "default", None)
        .await
        .expect("admit");
    tx.commit().await.expect("commit");
    let run_id = run_ids[0];
    let request_id =
        sqlx::query_scalar("SELECT id FROM execution_requests WHERE run_id = $1 AND kind = 'run'")
            .bind(run_id)
            .fetch_one(pool)
            .await
            .expect("its request");
    (run_id, request_id)
}

/// Commits a checkpoint of the work context of `request_id`'s run whose tree has the
/// digest `tree`, as a worker's capture does: the snapshot made ready and appended to
/// the lineage, whose head it becomes. Returns the snapshot.
pub async fn commit_tree(conn: &mut sqlx::PgConnection, request_id: Uuid, tree: &str) -> Uuid {
    let (context, agent): (Uuid, String) = sqlx::query_as(
        "SELECT r.work_context_id, r.agent FROM runs r JOIN execution_requests e ON e.run_id = r.id
          WHERE e.id = $1",
    )
    .bind(request_id)
    .fetch_one(&mut *conn)
    .await
    .expect("the run");
    let head = crate::lineage::head(conn, context)
        .await
        .expect("head")
        .map(|(id, _)| id);
    let new = crate::lineage::NewSnapshot {
        predecessor: head,
        ..new_checkpoint(&agent, context)
    };
    let id = crate::lineage::create_uploading(conn, &new)
        .await
        .expect("snapshot");
    let stored = crate::lineage::Stored {
        manifest_key: "manifests/fixture",
        size_bytes: 1,
        tree_digest: tree,
        pack_ids: &[],
    };
    assert!(crate::lineage::mark_ready(conn, id, &stored)
        .await
        .expect("ready"));
    crate::lineage::append(conn, context, &agent, head, id)
        .await
        .expect("appended");
    id
}

/// The request claimed as a worker claims it: the real lease claim (epoch 1, by `w1`)
/// and the request's move to executing. Returns the leases (to let the lease lapse),
/// the lease and a connection.
async fn claim_first(
    pool: &sqlx::PgPool,
    request_id: Uuid,
) -> (
    crate::lease::Leases,
    crate::lease::Lease,
    sqlx::pool::PoolConnection<sqlx::Postgres>,
) {
    let redis = crate::redis_conn::connect(&redis_url())
        .await
        .expect("redis");
    let leases = crate::lease::Leases::new(
        pool.clone(),
        redis,
        &unique_prefix("claim"),
        Duration::from_secs(60),
    );
    let lease = leases
        .claim(request_id, "w1")
        .await
        .expect("claim")
        .expect("a queued request is claimed");
    assert_eq!(lease.epoch, 1, "the first claim");
    let mut conn = pool.acquire().await.expect("conn");
    crate::request::transition(
        &mut conn,
        request_id,
        crate::request::RequestEvent::Claim,
        None,
        None,
    )
    .await
    .expect("claimed");
    (leases, lease, conn)
}

/// A step's outcome: exited 0 after `wall_ms` (`cpu_ms` of CPU), printing nothing.
pub fn exited_zero(wall_ms: i64, cpu_ms: i64) -> crate::journal::Outcome {
    crate::journal::Outcome {
        exit_code: Some(0),
        signal: None,
        timed_out: false,
        wall_ms,
        cpu_ms,
        output_digest: "abc".into(),
        stdout_tail: String::new(),
        stderr_tail: String::new(),
        output_artifact: String::new(),
        sandbox: serde_json::Value::Null,
        limit: None,
        cancelled: false,
    }
}

/// What a worker leaves when it retained its run's final report (blocked, asking for
/// verification) and lost its lease before the report was accepted: the request,
/// claimed (by the real lease claim, at epoch 1), needs reconciliation.
pub async fn retain_unaccepted_report(pool: &sqlx::PgPool, request_id: Uuid) {
    use crate::request::{self, RequestEvent};
    let (leases, lease, mut conn) = claim_first(pool, request_id).await;
    // The report is retained with the last step's receipt, on the checkpoint holding
    // its effects.
    let snapshot = commit_tree(&mut conn, request_id, "tree-of-the-report").await;
    crate::journal::write_intent(&mut conn, &lease, 1, "report", 0, false, None)
        .await
        .expect("intent");
    let outcome = exited_zero(0, 0);
    let receipt = crate::journal::Receipt {
        step_key: "report",
        attempt: 1,
        outcome: &outcome,
        tier: None,
    };
    crate::journal::record_receipt(&mut conn, &lease, &receipt, Some(snapshot))
        .await
        .expect("receipt");
    let body = serde_json::json!({"question": "run the tests?"});
    let report = crate::report::RetainedReport {
        outcome: "blocked",
        followup_kind: Some("verification"),
        body: &body,
        source_digest: None,
    };
    crate::report::retain(&mut conn, &lease, &report)
        .await
        .expect("report");
    leases.lapse(&lease).await;
    let unaccepted = Some("final_report_unaccepted");
    request::transition(
        &mut conn,
        request_id,
        RequestEvent::Reconcile,
        unaccepted,
        None,
    )
    .await
    .expect("needs reconciliation");
}

/// What a lapsed lease with spent attempts leaves: the request, claimed (by the real
/// lease claim, at epoch 1) before any step had a receipt, stopped at its checkpoint by
/// the owner's `stop_at_checkpoint`, as the sweeper stops it.
pub async fn stop_at_checkpoint(pool: &sqlx::PgPool, request_id: Uuid) {
    let (leases, lease, mut conn) = claim_first(pool, request_id).await;
    leases.lapse(&lease).await;
    crate::request::stop_at_checkpoint(&mut conn, request_id, "attempts_exhausted")
        .await
        .expect("stopped at its checkpoint");
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

/// The PostgreSQL server tests create their databases on (`DATABASE_URL`, any database).
pub fn postgres_server_url() -> String {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    match url.rfind('/') {
        Some(i) if i > "postgres://".len() => url[..i].to_string(),
        _ => url,
    }
}

/// A fresh, migrated database of one test, dropped when the value is dropped (even when
/// the test panics). Names carry their creation time so leftovers of killed runs are
/// dropped by later runs; two suites at once never share or drop each other's.
pub struct TestDb {
    pub pool: sqlx::PgPool,
    pub name: String,
    pub url: String,
}

const STALE_TEST_DB_SECS: u64 = 6 * 3600;

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// A unique test database name, `cairn_t_<unix time>_<id>`, so later runs can drop what
/// a killed run left behind.
pub fn database_name() -> String {
    format!(
        "cairn_t_{}_{}",
        unix_now(),
        &Uuid::new_v4().simple().to_string()[..12]
    )
}

impl TestDb {
    pub async fn new() -> TestDb {
        let now = unix_now();
        let name = database_name();
        let admin = sqlx::PgPool::connect(&format!("{}/postgres", postgres_server_url()))
            .await
            .expect("connect to the PostgreSQL server");
        drop_stale(&admin, now).await;
        create_migrated(&admin, &name).await;
        admin.close().await;
        let url = format!("{}/{name}", postgres_server_url());
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&url)
            .await
            .expect("connect to test database");
        TestDb { pool, name, url }
    }
}

/// Creates `name` with every migration of this build: a copy of a template database
/// migrated once per set of migrations (a copy costs a fraction of migrating).
pub async fn create_migrated(admin: &sqlx::PgPool, name: &str) {
    let template = migrated_template(admin).await;
    sqlx::query(&format!(
        "CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""
    ))
    .execute(admin)
    .await
    .expect("create test database");
}

/// The template holding this build's migrations, made by the first test that needs
/// it. Parallel test processes wait on a lock for it; it is built under another name
/// and renamed, so a half-migrated template is never copied.
async fn migrated_template(admin: &sqlx::PgPool) -> String {
    let mut checksums = Vec::new();
    for migration in crate::db::MIGRATOR.iter() {
        checksums.extend_from_slice(&migration.version.to_be_bytes());
        checksums.extend_from_slice(&migration.checksum);
    }
    let name = format!("cairn_tpl_{}", &crate::digest::sha256_hex(&checksums)[..16]);
    let mut conn = admin.acquire().await.expect("connect to the server");
    // A fixed key: "cairn template".
    const LOCK: i64 = 0x6361_6972_6e74_706c;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(LOCK)
        .execute(&mut *conn)
        .await
        .expect("lock");
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut *conn)
            .await
            .expect("read the databases");
    if !exists {
        let building = format!("{name}_building");
        let server = postgres_server_url();
        for statement in [
            format!("DROP DATABASE IF EXISTS \"{building}\" WITH (FORCE)"),
            format!("CREATE DATABASE \"{building}\""),
        ] {
            sqlx::query(&statement)
                .execute(&mut *conn)
                .await
                .expect("make the template");
        }
        let pool = sqlx::PgPool::connect(&format!("{server}/{building}"))
            .await
            .expect("connect to the template");
        crate::db::migrate(&pool)
            .await
            .expect("migrate the template");
        pool.close().await;
        sqlx::query(&format!(
            "ALTER DATABASE \"{building}\" RENAME TO \"{name}\""
        ))
        .execute(&mut *conn)
        .await
        .expect("name the template");
    }
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(LOCK)
        .execute(&mut *conn)
        .await;
    name
}

async fn drop_stale(admin: &sqlx::PgPool, now: u64) {
    let names: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'cairn\\_t\\_%'")
            .fetch_all(admin)
            .await
            .unwrap_or_default();
    for name in names {
        let created = name.split('_').nth(2).and_then(|t| t.parse::<u64>().ok());
        if created.is_some_and(|t| t + STALE_TEST_DB_SECS < now) {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .execute(admin)
                .await;
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        drop_database_blocking(&self.name);
    }
}

/// Runs `cleanup` from synchronous code (a `Drop`, perhaps inside a runtime) on a
/// short-lived runtime of its own thread, and waits for it; it is best-effort, so a
/// runtime that cannot start skips it.
fn clean_up_blocking<F, Fut>(cleanup: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(cleanup());
    })
    .join();
}

/// Creates a migrated test database from synchronous code ([`create_migrated`]).
pub fn create_migrated_blocking(name: &str) {
    let name = name.to_string();
    let server = postgres_server_url();
    let made = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let admin = sqlx::PgPool::connect(&format!("{server}/postgres"))
                .await
                .expect("connect to the PostgreSQL server");
            create_migrated(&admin, &name).await;
            admin.close().await;
        })
    })
    .join();
    made.expect("create the test database");
}

/// Drops a test database from synchronous code (a `Drop`); connections still open are
/// terminated.
pub fn drop_database_blocking(name: &str) {
    let name = name.to_string();
    let server = postgres_server_url();
    clean_up_blocking(|| async move {
        if let Ok(admin) = sqlx::PgPool::connect(&format!("{server}/postgres")).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .execute(&admin)
                .await;
            admin.close().await;
        }
    });
}

/// Deletes a test's queues and exchanges from synchronous code (a `Drop`).
pub fn delete_topology_blocking(prefix: &str) {
    let prefix = prefix.to_string();
    clean_up_blocking(|| async move {
        let topology = crate::queue::Topology::new(&prefix, 1);
        if let Ok(connection) = crate::queue::connect_once(&amqp_url()).await {
            if let Ok(channel) = connection.create_channel().await {
                let _ = topology.delete(&channel).await;
            }
            let _ = connection.close(200, "cleanup".into()).await;
        }
    });
}
