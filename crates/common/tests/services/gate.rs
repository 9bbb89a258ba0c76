//! The flow-control gate's reads: what its standings say of each key, and that neither
//! the keyed runs that have ended nor a backlog without a key is read to say it.

use cairn_common::request::{admit, gate};
use cairn_common::run::RunSpec;
use cairn_common::testing::{ServiceLock, TestDb};
use serde_json::{json, Value};
use uuid::Uuid;

/// Runs of each key that ended long ago.
const HISTORY: usize = 1_000;
/// Queued runs without a key.
const BACKLOG: usize = 3_000;

/// The standings as they were read before the gate read only what it holds: every
/// queued or executing request, joined to its run. What the index-backed read must give.
const EVERY_ACTIVE_REQUEST: &str = "SELECT * FROM (
   SELECT r.tenant_id AS tenant, r.concurrency_key AS key, 'concurrency' AS kind,
          count(*) FILTER (WHERE e.held_by_gate) AS waiting,
          count(*) FILTER (WHERE NOT e.held_by_gate) AS in_flight,
          min(r.concurrency_limit) AS \"limit\"
     FROM execution_requests e JOIN runs r ON r.id = e.run_id
    WHERE r.concurrency_key IS NOT NULL AND e.kind = 'run' AND e.state IN ('queued', 'executing')
    GROUP BY 1, 2
   UNION ALL
   SELECT r.tenant_id, r.rate_key, 'rate',
          count(*) FILTER (WHERE e.held_by_gate AND e.state = 'queued'),
          count(*) FILTER (WHERE e.gate_released_at > now() - interval '1 second'),
          min(r.rate_per_second)
     FROM execution_requests e JOIN runs r ON r.id = e.run_id
    WHERE r.rate_key IS NOT NULL AND e.kind = 'run'
      AND (e.state = 'queued' OR e.gate_released_at > now() - interval '1 second')
    GROUP BY 1, 2) k
  ORDER BY waiting DESC, tenant, key, kind
  LIMIT 100";

/// Admits `count` runs of `spec`, as the API does; their requests.
async fn admitted(pool: &sqlx::PgPool, spec: Value, count: usize) -> Vec<Uuid> {
    let secret = Uuid::new_v4().simple().to_string();
    let operator =
        cairn_common::token::insert(pool, "gate-test", "operator", Some("default"), &secret)
            .await
            .expect("operator token");
    let spec: RunSpec = serde_json::from_value(spec).expect("spec");
    let specs = vec![spec; count];
    let mut tx = pool.begin().await.expect("begin");
    let runs = admit::admit(&mut tx, &specs, operator, "default", None)
        .await
        .expect("admit");
    tx.commit().await.expect("commit");
    sqlx::query_scalar("SELECT id FROM execution_requests WHERE run_id = ANY($1) ORDER BY id")
        .bind(&runs)
        .fetch_all(pool)
        .await
        .expect("their requests")
}

/// A one-step run with the flow-control fields of `flow`.
fn spec(flow: Value) -> Value {
    let mut spec = json!({
        "agent": "gate-test",
        "steps": [{"key": "s1", "argv": ["true"]}],
        "budgets": {"max_commands": 10, "max_wall_seconds": 600},
    });
    for (field, value) in flow.as_object().expect("fields") {
        spec[field] = value.clone();
    }
    spec
}

/// Moves requests as the gate's release and a worker would: out of the gate at
/// `released` (SQL), then to `state`.
async fn released(pool: &sqlx::PgPool, requests: &[Uuid], released: &str, state: &str) {
    sqlx::query(&format!(
        "UPDATE execution_requests SET held_by_gate = FALSE, gate_released_at = {released}, state = $2
          WHERE id = ANY($1)"
    ))
    .bind(requests)
    .bind(state)
    .execute(pool)
    .await
    .expect("released");
}

/// Three runs of a concurrency key (two out of the gate), three of a rate key (two
/// released "now", one of which has ended), a run held only for its priority, 1,000
/// ended runs of each key and 3,000 queued runs without one: the standings give each
/// key what reading every active request gives, and read almost none of the others.
#[tokio::test]
async fn the_standings_count_each_key_and_read_no_ended_or_unkeyed_run() {
    let _services = ServiceLock::shared().await;
    let db = TestDb::new().await;
    let pool = &db.pool;
    let build = json!({"concurrency_key": "build", "concurrency_limit": 2});
    let api = json!({"rate_limit": {"key": "api", "per_second": 5}});
    for flow in [&build, &api] {
        let ended = admitted(pool, spec(flow.clone()), HISTORY).await;
        released(pool, &ended, "now() - interval '1 day'", "completed").await;
    }
    let build = admitted(pool, spec(build), 3).await;
    let api = admitted(pool, spec(api), 3).await;
    admitted(pool, spec(json!({"priority": 5})), 1).await;
    admitted(pool, spec(json!({})), BACKLOG).await;
    let long_ago = "now() - interval '10 seconds'";
    released(pool, &build[..1], long_ago, "executing").await;
    released(pool, &build[1..2], long_ago, "queued").await;
    // Within the rate's last second however slowly this test runs.
    let now = "now() + interval '1 minute'";
    released(pool, &api[..1], now, "executing").await;
    released(pool, &api[1..2], now, "completed").await;
    // The statistics autovacuum keeps: without them the planner guesses at both tables.
    sqlx::query("ANALYZE execution_requests, runs")
        .execute(pool)
        .await
        .expect("statistics");

    let mut tx = pool.begin().await.expect("begin");
    let before = reads(&mut tx).await;
    let standings = gate::standings(&mut tx).await.expect("standings");
    let after = reads(&mut tx).await;
    let (scanned, fetched) = (after.0 - before.0, after.1 - before.1);
    let every: Vec<gate::KeyStanding> = sqlx::query_as(EVERY_ACTIVE_REQUEST)
        .fetch_all(&mut *tx)
        .await
        .expect("the standings from every active request");
    tx.rollback().await.expect("rollback");

    let said = serde_json::to_value(&standings).expect("encode");
    assert_eq!(said, serde_json::to_value(&every).expect("encode"));
    assert_eq!(
        said,
        json!([
            {"tenant": "default", "key": "api", "kind": "rate", "waiting": 1, "in_flight": 2, "limit": 5},
            {"tenant": "default", "key": "build", "kind": "concurrency", "waiting": 1, "in_flight": 2, "limit": 2},
        ])
    );
    assert!(
        scanned + fetched < 100,
        "the standings read {scanned} rows by scans and {fetched} by index, beside \
         {HISTORY} ended runs of each key and {BACKLOG} queued without one"
    );
}

/// The rows of requests and runs this session has read by scans and fetched by index
/// and not yet reported (the counts reach the statistics after a transaction ends, so
/// within one they only grow).
async fn reads(conn: &mut sqlx::PgConnection) -> (i64, i64) {
    sqlx::query_as(
        "SELECT COALESCE(sum(seq_tup_read), 0)::bigint, COALESCE(sum(idx_tup_fetch), 0)::bigint
           FROM pg_stat_xact_user_tables WHERE relname IN ('execution_requests', 'runs')",
    )
    .fetch_one(conn)
    .await
    .expect("this session's reads")
}
