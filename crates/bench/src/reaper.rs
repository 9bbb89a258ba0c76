//! `cairn-bench reaper`: one sweep over a large snapshot table.

use crate::scratch::Scratch;
use std::time::Instant;

pub async fn run(rows: i64, batch: i64, postgres: &str) -> anyhow::Result<()> {
    let scratch = Scratch::create(postgres).await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&scratch.url)
        .await?;
    let store = std::env::temp_dir().join(format!("cairn-bench-reaper-{}", scratch.stamp));
    std::fs::create_dir_all(&store)?;
    let store_url = format!("file://{}", store.display());
    let started = Instant::now();
    sqlx::query(
        "INSERT INTO project_snapshots (id, kind, status, retention, agent, backend, store_url, created_at, last_used_at, retired_at)
         SELECT gen_random_uuid(), 'checkpoint', 'ready',
                CASE WHEN i % 10 = 0 THEN 'retired' ELSE 'current' END,
                'agent-' || (i % 100), 'local', $2, now() - interval '30 days', now(),
                CASE WHEN i % 10 = 0 THEN now() - interval '8 days' END
           FROM generate_series(1, $1) AS i",
    )
    .bind(rows)
    .bind(&store_url)
    .execute(&pool)
    .await?;
    sqlx::query("ANALYZE project_snapshots")
        .execute(&pool)
        .await?;
    println!(
        "reaper: {rows} snapshot rows ({} due) written in {:.1}s",
        rows / 10,
        started.elapsed().as_secs_f64()
    );
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT id, store_url, repair_attempts FROM project_snapshots
          WHERE status <> 'deleted'
            AND ((retention IN ('retired', 'superseded') OR status IN ('failed', 'quarantined'))
                 AND (COALESCE(retired_at, created_at) <= now() - interval '7 days'
                      OR retire_reason IN ('workspace_destroyed', 'memory_expired'))
                 AND status NOT IN ('creating', 'uploading', 'restoring')
              OR retention = 'pending_operator_repair' AND next_repair_at <= now())
          LIMIT 1000 FOR UPDATE SKIP LOCKED",
    )
    .fetch_all(&pool)
    .await?;
    println!("the reclaim scan:\n  {}", plan.join("\n  "));
    let durations = cairn_reaper::retention::Durations::default();
    let started = Instant::now();
    let report = cairn_reaper::retention::Sweep {
        pool: &pool,
        now: chrono::Utc::now(),
        durations: &durations,
        batch,
        dry_run: false,
    }
    .run()
    .await?;
    let took = started.elapsed();
    println!(
        "sweep: {} snapshots reclaimed in {:.2}s = {:.0} due rows/s ({:.0} table rows/s), batches of {batch}",
        report.snapshots_reclaimed,
        took.as_secs_f64(),
        report.snapshots_reclaimed as f64 / took.as_secs_f64(),
        rows as f64 / took.as_secs_f64()
    );
    pool.close().await;
    scratch.remove().await?;
    let _ = std::fs::remove_dir_all(&store);
    Ok(())
}
