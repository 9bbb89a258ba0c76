//! The reaper as processes: one leader at a time with failover, and a sweep killed
//! half-way that the next leader finishes.

use cairn_e2e::{binary, free_addr, testing, wait_for_status, Isolation, Process, ServiceLock};
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

fn start_reaper(isolation: &Isolation, batch: u32) -> (Process, std::net::SocketAddr) {
    let addr = free_addr();
    let mut env = isolation.env();
    env.push(("CAIRN_METRICS_LISTEN".into(), addr.to_string()));
    env.push(("CAIRN_REAPER_INTERVAL_SECONDS".into(), "0.2".into()));
    env.push(("CAIRN_REAPER_BATCH".into(), batch.to_string()));
    let mut process = Process::start("cairn-reaper", &env);
    wait_for_status(&mut process, addr, "/readyz", 200, Duration::from_secs(60));
    (process, addr)
}

async fn leaders_since(pool: &sqlx::PgPool, since: chrono::DateTime<chrono::Utc>) -> Vec<String> {
    sqlx::query_scalar("SELECT DISTINCT summary->>'leader' FROM sweeps WHERE component = 'reaper' AND started_at >= $1")
        .bind(since)
        .fetch_all(pool)
        .await
        .expect("sweeps")
}

#[tokio::test]
async fn one_reaper_leads_and_a_standby_takes_over_when_it_dies() {
    let _services = ServiceLock::shared().await;
    let isolation = Isolation::new("reaper-ha");
    let (first, _) = start_reaper(&isolation, 1000);
    let (second, _) = start_reaper(&isolation, 1000);
    let pool = sqlx::PgPool::connect(&isolation.database_url)
        .await
        .expect("db");
    let since = chrono::Utc::now();
    // Wait for a first sweep, then give a second leader ten intervals to show itself.
    let swept = testing::eventually(Duration::from_secs(30), || async {
        (!leaders_since(&pool, since).await.is_empty()).then_some(())
    })
    .await;
    assert!(swept.is_some(), "no reaper ever swept:\n{}", first.log());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leaders = leaders_since(&pool, since).await;
    assert_eq!(leaders.len(), 1, "exactly one leader sweeps: {leaders:?}");
    let leader = leaders[0].clone();
    let (mut dead, mut survivor) = if leader.ends_with(&format!("-{}", first.pid())) {
        (first, second)
    } else {
        (second, first)
    };
    assert!(leader.ends_with(&format!("-{}", dead.pid())), "{leader}");
    dead.signal(Signal::SIGKILL);
    dead.wait_exit(Duration::from_secs(5));
    let after = chrono::Utc::now();
    let expected = format!("-{}", survivor.pid());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let leaders = leaders_since(&pool, after).await;
        if leaders.iter().any(|l| l.ends_with(&expected)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the standby never took over: {leaders:?}\n{}",
            survivor.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    survivor.signal(Signal::SIGTERM);
    assert!(survivor
        .wait_exit(Duration::from_secs(20))
        .is_some_and(|s| s.success()));
    pool.close().await;
}

#[tokio::test]
async fn a_sweep_killed_half_way_is_finished_by_the_next_one() {
    let _services = ServiceLock::shared().await;
    let isolation = Isolation::new("reaper-crash");
    // Migrate through a first reaper run, then stop it before the backlog exists.
    let (mut setup, _) = start_reaper(&isolation, 1000);
    setup.signal(Signal::SIGTERM);
    setup.wait_exit(Duration::from_secs(20));
    let pool = sqlx::PgPool::connect(&isolation.database_url)
        .await
        .expect("db");
    sqlx::query("INSERT INTO workspaces (id, agent, backend, state) VALUES ('00000000-0000-0000-0000-000000000001', 'a', 'local', 'stopped')")
        .execute(&pool)
        .await
        .expect("workspace");
    sqlx::query(
        "INSERT INTO holds (id, workspace_id, agent, reason, expires_at)
         SELECT gen_random_uuid(), '00000000-0000-0000-0000-000000000001', 'a', 'backlog', now() - interval '1 minute'
           FROM generate_series(1, 60000)",
    )
    .execute(&pool)
    .await
    .expect("backlog");
    let open = || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM holds WHERE ended_at IS NULL")
                .fetch_one(&pool)
                .await
                .expect("count")
        }
    };
    let (mut reaper, _) = start_reaper(&isolation, 50);
    let started = Instant::now();
    loop {
        let remaining = open().await;
        if remaining < 60000 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the sweep never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    reaper.signal(Signal::SIGKILL);
    reaper.wait_exit(Duration::from_secs(5));
    let remaining = open().await;
    assert!(
        remaining > 0,
        "killed half-way, with work left ({remaining})"
    );
    let (mut next, _) = start_reaper(&isolation, 1000);
    let deadline = Instant::now() + Duration::from_secs(60);
    while open().await > 0 {
        assert!(
            Instant::now() < deadline,
            "the next sweep did not finish the backlog:\n{}",
            next.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A sweep's row is written after its work, so the backlog can be gone before it.
    let recorded = testing::eventually(Duration::from_secs(30), || async {
        let sweeps: i64 =
            sqlx::query_scalar("SELECT count(*) FROM sweeps WHERE component = 'reaper'")
                .fetch_one(&pool)
                .await
                .ok()?;
        (sweeps > 0).then_some(())
    })
    .await;
    assert!(recorded.is_some(), "no sweep was recorded:\n{}", next.log());
    let status = std::process::Command::new(binary("cairnctl"))
        .args(["reaper", "status"])
        .env("CAIRN_DATABASE_URL", &isolation.database_url)
        .output()
        .expect("cairnctl");
    assert!(status.status.success());
    assert!(String::from_utf8_lossy(&status.stdout).contains("LEADER"));
    let pending = std::process::Command::new(binary("cairnctl"))
        .args(["--json", "reaper", "pending"])
        .env("CAIRN_DATABASE_URL", &isolation.database_url)
        .output()
        .expect("cairnctl");
    assert_eq!(String::from_utf8_lossy(&pending.stdout).trim(), "[]");
    next.signal(Signal::SIGTERM);
    assert!(next
        .wait_exit(Duration::from_secs(20))
        .is_some_and(|s| s.success()));
    pool.close().await;
}

/// The reaper holds a store's lock for four lease TTLs while a worker captures into
/// that store: the worker never waits for it holding its request row, so its renewals
/// go on, it is never fenced, and the run completes in its first attempt once the lock
/// is gone.
#[tokio::test]
async fn a_long_reclaim_lock_never_fences_a_capturing_worker() {
    use cairn_e2e::cluster::{append_step, run_spec, Cluster, Settings};
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("reaper-lock", 1, Settings::default()).await;
    let identity = cluster.dir.join("artifacts").join("store-id");
    let store_id =
        std::fs::read_to_string(&identity).expect("the worker wrote the store's identity");
    let mut reaper = cluster.pool.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(store_id.trim())
        .execute(&mut *reaper)
        .await
        .expect("the reaper's lock");
    let spec = run_spec(
        vec![
            append_step("s1", "log.txt", "one", 0.0, false),
            append_step("s2", "log.txt", "two", 0.0, false),
        ],
        1,
    );
    let (run_id, _) = cluster.submit(&spec);
    tokio::time::sleep(Duration::from_secs(4 * cluster.settings.lease_ttl_seconds)).await;
    reaper.rollback().await.expect("the lock is let go");
    let run = cluster.wait_for_state(
        &run_id,
        &["completed", "failed", "needs_reconciliation"],
        Duration::from_secs(90),
    );
    assert_eq!(run["state"], "completed", "{run}");
    assert_eq!(run["attempt"], 1, "never fenced: {run}");
    assert_eq!(cluster.metric(0, "cairn_worker_self_fenced_total"), 0.0);
}

/// A dry run reads what is there: against a database that does not exist it fails
/// with a clear error and creates nothing.
#[tokio::test]
async fn a_dry_run_creates_no_database() {
    let isolation = Isolation::unmade("reaper-dry");
    let output = std::process::Command::new(binary("cairn-reaper"))
        .arg("--dry-run")
        .envs(isolation.env())
        .output()
        .expect("the reaper runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("dry run"), "{stderr}");
    let server = sqlx::PgPool::connect(&cairn_common::testing::postgres_server_url())
        .await
        .expect("server");
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&isolation.database_name)
            .fetch_one(&server)
            .await
            .expect("exists");
    assert!(!exists, "the dry run created the database");
}
