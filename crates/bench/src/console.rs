//! `cairn-bench console`: the API the console reads, with many runs in the database. A
//! scheduler of its own (no worker) answers each query the console makes — the first
//! page, a page deep in, each filter, the per-state counts, a run and its change feed's
//! first event — `--samples` times; p50, p99 and max are printed for a baseline of 1,000
//! runs and for `--runs`, side by side, in one run.
//!
//! The runs are loaded in bulk by SQL, not admitted: a mix of ended and live runs over
//! the last days, 20 agents, a `team` label of 50 values, one tenant.

use crate::stack::{Stack, StackSettings};
use crate::stats::percentile;
use anyhow::Context;
use std::time::{Duration, Instant};

/// The baseline's size.
const BASELINE: usize = 1_000;

/// One query the console makes.
struct Query {
    name: &'static str,
    path: String,
}

/// The queries, given a run id and a cursor deep in the list.
fn queries(run: &str, deep_cursor: &str) -> Vec<Query> {
    let q = |name, path: String| Query { name, path };
    vec![
        q("first page (50)", "/api/v1/runs?limit=50".into()),
        q(
            "a page deep in (cursor)",
            format!("/api/v1/runs?limit=50&cursor={deep_cursor}"),
        ),
        q("state=failed", "/api/v1/runs?limit=50&state=failed".into()),
        q("state=queued", "/api/v1/runs?limit=50&state=queued".into()),
        q(
            "agent=agent-7",
            "/api/v1/runs?limit=50&agent=agent-7".into(),
        ),
        q(
            "label team=team-3",
            "/api/v1/runs?limit=50&label=team%3Dteam-3".into(),
        ),
        q(
            "run id prefix (6 hex)",
            format!("/api/v1/runs?limit=50&run_id={}", &run[..6]),
        ),
        q("counts per state", "/api/v1/runs/counts".into()),
        q("one run", format!("/api/v1/runs/{run}")),
    ]
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Runs in the database for the large measurement.
    #[arg(long, default_value_t = 100_000)]
    runs: usize,
    /// Calls of each query.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    #[command(flatten)]
    postgres: crate::Postgres,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let Args {
        runs,
        samples,
        postgres,
    } = args;
    anyhow::ensure!(runs > BASELINE, "--runs must be more than {BASELINE}");
    let stack = Stack::start(StackSettings {
        postgres: &postgres.postgres,
        workers: 0,
        concurrency: 1,
        worker_env: Vec::new(),
    })
    .await?;
    let outcome = measure(&stack, runs, samples).await;
    stack.stop().await?;
    outcome
}

async fn measure(stack: &Stack, runs: usize, samples: usize) -> anyhow::Result<()> {
    println!(
        "console API: {samples} calls of each query, one at a time, at {BASELINE} runs and at {runs} runs"
    );
    load(stack, 0, BASELINE).await?;
    let small = time_all(stack, samples).await?;
    let started = Instant::now();
    load(stack, BASELINE, runs).await?;
    println!(
        "loaded {} more runs in {:.1} s",
        runs - BASELINE,
        started.elapsed().as_secs_f64()
    );
    sqlx::query("VACUUM ANALYZE runs, execution_requests")
        .execute(&stack.pool)
        .await?;
    let large = time_all(stack, samples).await?;
    println!(
        "\n| query | p50 ms ({BASELINE}) | p99 ms ({BASELINE}) | max ms ({BASELINE}) | p50 ms ({runs}) | p99 ms ({runs}) | max ms ({runs}) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for ((name, a), (_, b)) in small.iter().zip(&large) {
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            percentile(a, 0.50),
            percentile(a, 0.99),
            percentile(a, 1.0),
            percentile(b, 0.50),
            percentile(b, 0.99),
            percentile(b, 1.0)
        );
    }
    let worst = large
        .iter()
        .map(|(_, t)| percentile(t, 0.99))
        .fold(0.0, f64::max);
    println!("\nCONSOLE p99 at {runs} runs: {worst:.1} ms (the slowest query's)");
    Ok(())
}

/// Loads runs `from..to` (by their index: run `i` was created `i` × 3 s before now, so
/// the newest are the first), each with its request, in one statement per 20,000.
async fn load(stack: &Stack, from: usize, to: usize) -> anyhow::Result<()> {
    let mut start = from;
    while start < to {
        let end = (start + 20_000).min(to);
        sqlx::query(
            "WITH s AS (
                SELECT g, gen_random_uuid() AS id, gen_random_uuid() AS request_id,
                       now() - make_interval(secs => g * 3) AS at,
                       CASE WHEN g % 100 < 2 THEN 'queued' WHEN g % 100 < 3 THEN 'needs_reconciliation'
                            WHEN g % 100 < 11 THEN 'failed' WHEN g % 100 < 15 THEN 'cancelled'
                            ELSE 'completed' END AS state
                  FROM generate_series($1::int, $2::int - 1) g),
             made AS (
                INSERT INTO runs (id, root_run_id, work_context_id, agent, steps, max_commands,
                                  max_wall_seconds, max_attempts, state, request_digest, labels,
                                  created_at, updated_at, finished_at)
                SELECT id, id, id, 'agent-' || (g % 20),
                       '[{\"key\": \"build\", \"argv\": [\"true\"]}]'::jsonb, 10, 60, 1, state,
                       'bench', jsonb_build_object('team', 'team-' || (g % 50)), at, at,
                       CASE WHEN state IN ('completed', 'failed', 'cancelled') THEN at END
                  FROM s
                RETURNING id)
             INSERT INTO execution_requests (id, run_id, kind, state, max_attempts, max_commands,
                                             max_wall_seconds, admitted_at, claimed_at, finished_at)
             SELECT s.request_id, s.id, 'run', s.state, 1, 10, 60, s.at, s.at,
                    CASE WHEN s.state IN ('completed', 'failed', 'cancelled') THEN s.at END
               FROM s JOIN made ON made.id = s.id",
        )
        .bind(i32::try_from(start)?)
        .bind(i32::try_from(end)?)
        .execute(&stack.pool)
        .await
        .context("loading runs")?;
        start = end;
    }
    Ok(())
}

/// Each query's latencies in ms, in the order of [`queries`].
async fn time_all(stack: &Stack, samples: usize) -> anyhow::Result<Vec<(&'static str, Vec<f64>)>> {
    let newest: serde_json::Value = get(stack, "/api/v1/runs?limit=1").await?;
    let run = newest["runs"][0]["run_id"]
        .as_str()
        .context("no run listed")?
        .to_string();
    // Forty pages in (or as deep as the list goes).
    let mut cursor = String::new();
    for _ in 0..40 {
        let path = format!("/api/v1/runs?limit=50&cursor={cursor}");
        let path = if cursor.is_empty() {
            "/api/v1/runs?limit=50".to_string()
        } else {
            path
        };
        let page: serde_json::Value = get(stack, &path).await?;
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.to_string(),
            None => break,
        }
    }
    let mut out = Vec::new();
    for query in queries(&run, &cursor) {
        // One call first, so a cold cache is not the only slow one.
        get(stack, &query.path).await?;
        let mut times = Vec::with_capacity(samples);
        for _ in 0..samples {
            let started = Instant::now();
            get(stack, &query.path).await?;
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        out.push((query.name, times));
    }
    out.push(("change feed: connect to ready", feed(stack, samples).await?));
    Ok(out)
}

/// The time from opening the run change feed to its `ready` event.
async fn feed(stack: &Stack, samples: usize) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::new();
    for _ in 0..samples.min(50) {
        let started = Instant::now();
        let mut response = stack
            .http
            .get(format!("{}/api/v1/runs/events", stack.base))
            .bearer_auth(&stack.token)
            .timeout(Duration::from_secs(10))
            .send()
            .await?
            .error_for_status()?;
        let mut seen = String::new();
        while !seen.contains("event: ready") {
            let chunk = response.chunk().await?.context("the feed ended")?;
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

async fn get(stack: &Stack, path: &str) -> anyhow::Result<serde_json::Value> {
    let response = stack
        .http
        .get(format!("{}{path}", stack.base))
        .bearer_auth(&stack.token)
        .send()
        .await?;
    let status = response.status();
    let body = response.text().await?;
    anyhow::ensure!(status.is_success(), "{path}: {status} {body}");
    Ok(serde_json::from_str(&body)?)
}
