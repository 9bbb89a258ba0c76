//! Opening the database as processes do at start, against the real PostgreSQL.

use cairn_common::{db, testing};

/// Processes started together on a database that does not exist yet all come up: for
/// every process that loses the creation race, the database "already exists", however
/// PostgreSQL words it.
#[tokio::test]
async fn processes_racing_to_create_the_database_all_come_up() {
    for _ in 0..5 {
        let name = testing::database_name();
        let url = format!("{}/{name}", testing::postgres_server_url());
        let racing = (0..6).map(|_| db::create_if_missing(&url));
        let results = futures::future::join_all(racing).await;
        testing::drop_database_blocking(&name);
        for result in results {
            assert!(result.is_ok(), "a racing process failed: {result:?}");
        }
    }
}

/// A process's pool has its warm connections open once `connect` returns (before the
/// process reports ready), each a PostgreSQL backend that has started, and keeps them
/// while idle.
#[tokio::test]
async fn a_pool_opens_its_warm_connections_before_it_is_used() {
    let test = testing::TestDb::new().await;
    let pool = db::connect(&test.url, 20, None).await.expect("connect");
    // sqlx's upkeep of the minimum may open one more than it, at the same time.
    assert!(pool.size() >= db::WARM_CONNECTIONS, "{} open", pool.size());
    let backends: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'cairn'",
    )
    .fetch_one(&pool)
    .await
    .expect("count backends");
    // At least: the connection that checked the database exists may still be leaving.
    assert!(
        backends >= i64::from(db::WARM_CONNECTIONS),
        "{backends} backends"
    );
    // A small pool warms what it may hold.
    let small = db::connect(&test.url, 2, None).await.expect("connect");
    assert_eq!(small.size(), 2);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    // sqlx's upkeep of the minimum may open one more than it.
    assert!(pool.num_idle() >= db::WARM_CONNECTIONS as usize);
    pool.close().await;
    small.close().await;
}

/// After a rollback the older release's processes migrate a schema a newer release
/// migrated further: they start on it, applying nothing; a known migration whose
/// checksum differs still stops them.
#[tokio::test]
async fn an_older_release_starts_on_a_schema_a_newer_one_migrated_further() {
    let test = testing::TestDb::new().await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (99999999999999, 'a newer release''s migration', true, '\\x00', 1)",
    )
    .execute(&test.pool)
    .await
    .expect("record a newer migration");
    db::migrate(&test.pool)
        .await
        .expect("an older release accepts a schema migrated further");
    sqlx::query("UPDATE _sqlx_migrations SET checksum = '\\x00' WHERE version = 1")
        .execute(&test.pool)
        .await
        .expect("alter a known migration's checksum");
    let changed = db::migrate(&test.pool).await;
    assert!(
        matches!(changed, Err(db::DbError::Migrate(_))),
        "{changed:?}"
    );
}

/// A process's sessions compile no plan (JIT), with or without a limit on idle
/// transactions (set beside it): a misestimated plan would otherwise be compiled at each
/// execution.
#[tokio::test]
async fn a_processs_sessions_never_compile_plans() {
    let test = testing::TestDb::new().await;
    for idle in [None, Some(std::time::Duration::from_secs(30))] {
        let pool = db::connect(&test.url, 2, idle).await.expect("connect");
        let jit: String = sqlx::query_scalar("SHOW jit")
            .fetch_one(&pool)
            .await
            .expect("jit");
        assert_eq!(jit, "off", "idle-in-transaction limit {idle:?}");
        let limit: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
            .fetch_one(&pool)
            .await
            .expect("idle limit");
        let expected = if idle.is_some() { "30s" } else { "0" };
        assert_eq!(limit, expected, "the idle limit is set beside it");
        pool.close().await;
    }
}
