//! Cairn on a database with a long history: a run's path and the scheduler's sweeps find
//! their rows by index, so what they cost does not grow with the finished rows kept.

use cairn_e2e::cluster::{append_step, run_spec, Cluster, Settings};
use cairn_e2e::{Isolation, ServiceLock};
use nix::sys::signal::Signal;
use sqlx::Connection;
use std::collections::BTreeMap;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// Finished rows seeded in each table before the cluster starts.
const HISTORY: i64 = 20_000;

/// The tables a run's path and the sweeps read, seeded with finished rows.
const TABLES: [&str; 9] = [
    "runs",
    "execution_requests",
    "workspaces",
    "holds",
    "project_snapshots",
    "lineage_heads",
    "journal_intents",
    "journal_receipts",
    "snapshot_restores",
];

/// Runs through a scheduler and a worker on a database holding 20,000 finished runs
/// with all they leave in the tables a run writes, with every statement planned for any
/// value of its parameters (a generic plan, which PostgreSQL settles on after a
/// statement's first five executions on a connection): no statement reads one of those
/// tables whole, from the cluster's start to its end. A
/// statement that binds a value the index's predicate names (a state) hides from such a
/// plan that the index covers its rows, and then scans the table on every call.
#[tokio::test]
async fn a_run_and_the_sweeps_read_no_table_whole_however_long_the_history() {
    let _services = ServiceLock::shared().await;
    let isolation = Isolation::new("history");
    // One connection, closed here, not a pool: under load a pooled connection was seen
    // to stay open after its pool closed, and the wait below for it to end timed out.
    let mut setup = sqlx::PgConnection::connect(&isolation.database_url)
        .await
        .expect("database");
    seed(&mut setup).await;
    let generic = format!(
        "ALTER DATABASE \"{}\" SET plan_cache_mode = force_generic_plan",
        isolation.database_name
    );
    sqlx::query(&generic)
        .execute(&mut setup)
        .await
        .expect("generic plans");
    setup.close().await.expect("the seeding's session ends");
    // The seeding's own reads are counted before: a session's counts reach the
    // statistics when it ends. From here on, the cluster's start counts too.
    let probe = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&isolation.database_url)
        .await
        .expect("database");
    // Clients only: autovacuum's workers, busy with the seeded tables, are listed too.
    let others = "backend_type = 'client backend' AND pid <> pg_backend_pid()";
    sessions_ended(&probe, &isolation.database_name, others).await;
    let before = table_counts(&probe).await;
    probe.close().await;

    let cluster = Cluster::start_on(isolation, "history", 1, Settings::default()).await;
    let file = cluster.path("effects");
    for line in ["a", "b"] {
        let spec = run_spec(vec![append_step(line, &file, line, 0.0, false)], 1);
        let (run_id, _) = cluster.submit(&spec);
        let run = cluster.wait_for_state(&run_id, &["completed", "failed"], LONG);
        assert_eq!(run["state"], "completed", "{run}");
    }
    // Some sweeps of the scheduler (every 0.3 s here) and renewals of the worker.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The overview's samples (every second here) found the runs' waits, by index.
    let sampled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM overview_samples WHERE admission_to_start_p50_ms IS NOT NULL",
    )
    .fetch_one(&cluster.pool)
    .await
    .expect("the overview's samples");
    assert!(sampled >= 1, "no sample holds the two runs' waits");
    // A backend's counts reach the statistics when its session ends, at the latest.
    cluster.scheduler.signal(Signal::SIGKILL);
    for worker in &cluster.workers {
        worker.process.signal(Signal::SIGKILL);
    }
    let database = &cluster.isolation.database_name;
    sessions_ended(&cluster.pool, database, "application_name = 'cairn'").await;
    let after = table_counts(&cluster.pool).await;
    let inserted = after["runs"].1 - before["runs"].1;
    assert_eq!(inserted, 2, "the statistics counted the two runs");
    for table in TABLES {
        let read = after[table].0 - before[table].0;
        assert!(
            read < HISTORY,
            "{table}: {read} rows read by sequential scans over two runs and 2 s of sweeps \
             (the table holds {HISTORY} finished rows)"
        );
    }
    assert_eq!(cluster.lines("effects"), ["a", "b"]);
}

/// Finished runs of another agent, each with its request, its destroyed tree and that
/// tree's ended hold, its superseded checkpoint and retired lineage head, one step's
/// intent and receipt, and its tree's restore record.
async fn seed(conn: &mut sqlx::PgConnection) {
    for statement in [
        "INSERT INTO runs (id, root_run_id, work_context_id, agent, steps, max_commands,
                           max_wall_seconds, max_attempts, state, request_digest, finished_at)
         SELECT id, id, gen_random_uuid(), 'history', '[]', 1, 60, 1, 'completed', 'seeded',
                now() - interval '1 day'
           FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, $1)) g",
        "INSERT INTO execution_requests (id, run_id, kind, state, max_attempts, max_commands,
                                         max_wall_seconds, finished_at)
         SELECT gen_random_uuid(), id, 'run', 'completed', 1, 1, 60, finished_at
           FROM runs WHERE agent = 'history' LIMIT $1",
        "INSERT INTO workspaces (id, agent, backend, state, directory_id, path, destroyed_at,
                                 request_id, run_id, work_context_id)
         SELECT gen_random_uuid(), 'history', 'local', 'destroyed', gen_random_uuid(),
                '/history/' || e.id, now(), e.id, e.run_id, r.work_context_id
           FROM execution_requests e JOIN runs r ON r.id = e.run_id LIMIT $1",
        "INSERT INTO holds (id, workspace_id, run_id, work_context_id, agent, reason, expires_at,
                            ended_at, end_reason)
         SELECT gen_random_uuid(), id, run_id, work_context_id, 'history', 'task', now(), now(),
                'task_ended'
           FROM workspaces WHERE agent = 'history' LIMIT $1",
        "INSERT INTO project_snapshots (id, kind, status, retention, agent, backend, store_url,
                                        work_context_id, sequence, request_id, workspace_id)
         SELECT gen_random_uuid(), 'checkpoint', 'ready', 'superseded', 'history', 'local',
                'file:///history', work_context_id, 1, request_id, id
           FROM workspaces WHERE agent = 'history' LIMIT $1",
        "INSERT INTO lineage_heads (work_context_id, agent, head_id, sequence, retired_at)
         SELECT work_context_id, 'history', id, 1, now()
           FROM project_snapshots WHERE agent = 'history' LIMIT $1",
        "INSERT INTO journal_intents (request_id, step_key, step_index, idempotent, lease_epoch,
                                      attempt, ended_at)
         SELECT id, 'only', 0, false, 1, 1, now() FROM execution_requests LIMIT $1",
        "INSERT INTO journal_receipts (request_id, step_key, lease_epoch, attempt, exit_code,
                                       wall_ms, cpu_ms, output_digest)
         SELECT request_id, step_key, 1, 1, 0, 1, 1, 'seeded' FROM journal_intents LIMIT $1",
        "INSERT INTO snapshot_restores (id, request_id, workspace_id, tier, snapshot_id, outcome)
         SELECT gen_random_uuid(), request_id, workspace_id, 'cold', id, 'succeeded'
           FROM project_snapshots WHERE agent = 'history' LIMIT $1",
    ] {
        sqlx::query(statement)
            .bind(HISTORY)
            .execute(&mut *conn)
            .await
            .expect("seeded history");
    }
    sqlx::query("ANALYZE")
        .execute(&mut *conn)
        .await
        .expect("statistics");
    for table in TABLES {
        let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&mut *conn)
            .await
            .expect("seeded rows");
        assert_eq!(rows, HISTORY, "{table} seeded");
    }
}

/// Of each table so far: the rows its sequential scans read, and the rows inserted.
async fn table_counts(pool: &sqlx::PgPool) -> BTreeMap<String, (i64, i64)> {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, COALESCE(seq_tup_read, 0), n_tup_ins FROM pg_stat_user_tables
          WHERE relname = ANY($1)",
    )
    .bind(TABLES)
    .fetch_all(pool)
    .await
    .expect("table statistics");
    rows.into_iter()
        .map(|(table, read, inserted)| (table, (read, inserted)))
        .collect()
}

/// Waits until no session that `which` (a condition on `pg_stat_activity`) names is
/// left on `database`.
async fn sessions_ended(pool: &sqlx::PgPool, database: &str, which: &str) {
    let count = format!("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND {which}");
    let ended = cairn_e2e::testing::eventually(LONG, || async {
        let left: i64 = sqlx::query_scalar(&count)
            .bind(database)
            .fetch_one(pool)
            .await
            .expect("sessions");
        (left == 0).then_some(())
    })
    .await;
    if ended.is_none() {
        let list = format!(
            "SELECT pid::text || ' ' || COALESCE(application_name, '') || ' ' || COALESCE(state, '')
                    || ' ' || COALESCE(wait_event, '') || ' ' || left(query, 120)
               FROM pg_stat_activity WHERE datname = $1 AND {which}"
        );
        let open: Vec<String> = sqlx::query_scalar(&list)
            .bind(database)
            .fetch_all(pool)
            .await
            .unwrap_or_default();
        panic!("sessions ({which}) are still open: {open:#?}");
    }
}
