//! `cairn-bench fence`: what the lease fence costs a durable write, with the check sent in
//! the BEGIN's round trip (`SELECT cairn_fence(...); BEGIN`) beside the same check as a
//! statement of its own after the BEGIN (the path an owner name that would need quoting
//! still takes). Each transaction is begun fenced and rolled back, so that no WAL flush
//! hides the round trips; the two kinds alternate.

use crate::scratch::Scratch;
use cairn_common::lease::{Lease, Leases};
use std::time::Instant;
use uuid::Uuid;

pub async fn run(transactions: usize, postgres: &str) -> anyhow::Result<()> {
    let scratch = Scratch::create(postgres).await?;
    let measured = measure(transactions, &scratch.url).await;
    scratch.remove().await?;
    let [one, two] = measured?;
    println!("fence: {transactions} fenced transactions of each kind, begun and rolled back on one connection");
    println!(
        "{:<44} {:>9} {:>9} {:>9}",
        "kind", "p50 µs", "p99 µs", "mean µs"
    );
    for (label, times) in [
        ("check in the BEGIN's round trip (Cairn)", &one),
        ("check as its own statement (baseline)", &two),
    ] {
        println!(
            "{label:<44} {:>9.0} {:>9.0} {:>9.0}",
            percentile(times, 0.50),
            percentile(times, 0.99),
            times.iter().sum::<f64>() / times.len().max(1) as f64
        );
    }
    println!(
        "SCENARIO fence: {:.0} µs p50 per fenced begin (baseline {:.0} µs)",
        percentile(&one, 0.50),
        percentile(&two, 0.50)
    );
    Ok(())
}

/// Times of the one-trip and the two-trip fenced begin, in µs.
async fn measure(transactions: usize, url: &str) -> anyhow::Result<[Vec<f64>; 2]> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    // An owner with a space cannot be written into the query's text unquoted, so its
    // lease takes the two-trip path: the same check, as its own statement.
    let one = held(&pool, "bench-fence").await?;
    let two = held(&pool, "bench fence").await?;
    let mut times = [Vec::new(), Vec::new()];
    for i in 0..transactions * 2 {
        let lease = if i % 2 == 0 { &one } else { &two };
        let started = Instant::now();
        let tx = lease.begin_fenced(&pool).await?;
        tx.rollback().await?;
        times[i % 2].push(started.elapsed().as_secs_f64() * 1e6);
    }
    pool.close().await;
    Ok(times)
}

/// A request admitted and claimed by `owner` for an hour, through the owners' own
/// functions (admission, the lease claim).
async fn held(pool: &sqlx::PgPool, owner: &str) -> anyhow::Result<Lease> {
    use cairn_common::{redis_conn, request::admit, token};
    let secret = Uuid::new_v4().simple().to_string();
    let operator = token::insert(pool, "bench-fence", "operator", Some("default"), &secret).await?;
    let spec = serde_json::from_value(serde_json::json!({
        "agent": "bench", "steps": [{"key": "s1", "argv": ["true"]}],
    }))?;
    let mut tx = pool.begin().await?;
    let runs = admit::admit(&mut tx, &[spec], operator, "default", None).await?;
    tx.commit().await?;
    let request: Uuid = sqlx::query_scalar("SELECT id FROM execution_requests WHERE run_id = $1")
        .bind(runs[0])
        .fetch_one(pool)
        .await?;
    // Redis holds only the lease's liveness hint, which the fence never reads; the
    // hint expires with the lease.
    let url = std::env::var("CAIRN_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("bench-fence-{}.", Uuid::new_v4().simple());
    let leases = Leases::new(
        pool.clone(),
        redis_conn::connect_lazily(&url)?,
        &prefix,
        HOUR,
    );
    leases
        .claim(request, owner)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the admitted request {request} could not be claimed"))
}

const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);

/// The `q` quantile of unsorted times.
fn percentile(times: &[f64], q: f64) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    crate::stats::percentile(&sorted, q)
}
