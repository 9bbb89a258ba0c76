//! `cairn-bench`: measures Cairn on the local services and prints the figures.
//!
//! `cairn-bench pipeline` starts a scheduler and W workers (the binaries next to this
//! one), submits N runs through the batch API, waits until every run completed, and
//! prints end-to-end runs per second and admission→claim latency p50/p99, for runs with
//! no steps (the pipeline's own cost) and runs with one `/bin/true` step.

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use serde_json::json;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(
    name = "cairn-bench",
    about = "Benchmarks of Cairn against the local services"
)]
struct Cli {
    #[command(subcommand)]
    command: Bench,
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Admission → queue → claim → completion throughput and latency.
    Pipeline {
        /// Runs per scenario.
        #[arg(long, default_value_t = 5000)]
        runs: usize,
        /// Worker processes.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Jobs each worker runs at once.
        #[arg(long, default_value_t = 32)]
        concurrency: u32,
        /// Runs per batch submission (at most 1,000).
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        /// PostgreSQL server (a fresh database is created on it per scenario).
        #[arg(
            long,
            env = "CAIRN_BENCH_POSTGRES",
            default_value = "postgres://postgres@127.0.0.1:5432"
        )]
        postgres: String,
    },
}

struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = nix_term(child);
        }
        for child in &mut self.0 {
            let _ = child.wait();
        }
    }
}

fn nix_term(child: &mut Child) -> std::io::Result<()> {
    // SIGTERM via kill(1) keeps this crate free of unsafe code and extra dependencies.
    Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .map(|_| ())
}

fn bin_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(exe.parent().context("binary directory")?.to_path_buf())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Bench::Pipeline {
            runs,
            workers,
            concurrency,
            batch,
            postgres,
        } => {
            println!("pipeline: {runs} runs per scenario, {workers} workers x {concurrency} concurrent jobs, batches of {batch}");
            for (label, steps) in [
                ("no steps", json!([])),
                (
                    "one /bin/true step",
                    json!([{"key": "true", "argv": ["/bin/true"]}]),
                ),
            ] {
                pipeline(
                    label,
                    steps,
                    runs,
                    workers,
                    concurrency,
                    batch.clamp(1, 1000),
                    &postgres,
                )
                .await?;
            }
        }
    }
    Ok(())
}

async fn pipeline(
    label: &str,
    steps: serde_json::Value,
    runs: usize,
    workers: usize,
    concurrency: u32,
    batch: usize,
    postgres: &str,
) -> anyhow::Result<()> {
    let bin = bin_dir()?;
    let stamp = uuid::Uuid::new_v4().simple().to_string();
    let database = format!("cairn_bench_{}", &stamp[..12]);
    let database_url = format!("{}/{database}", postgres.trim_end_matches('/'));
    let prefix = format!("bench-{}.", &stamp[..12]);
    let work = std::env::temp_dir().join(format!("cairn-bench-{}", &stamp[..12]));
    let token = format!("bench-admin-{stamp}");
    let port = free_port()?;
    let common = |cmd: &mut Command| {
        cmd.env("CAIRN_DATABASE_URL", &database_url)
            .env("CAIRN_QUEUE_PREFIX", &prefix)
            .env("CAIRN_REDIS_PREFIX", &prefix)
            .env("CAIRN_LOG_FORMAT", "json")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    };
    let mut processes = Processes(Vec::new());
    let mut scheduler = Command::new(bin.join("cairn-scheduler"));
    common(&mut scheduler);
    scheduler
        .env("CAIRN_LISTEN", format!("127.0.0.1:{port}"))
        .env("CAIRN_BOOTSTRAP_ADMIN_TOKEN", &token)
        .env("CAIRN_DATABASE_MAX_CONNECTIONS", "20");
    processes.0.push(
        scheduler
            .spawn()
            .context("starting cairn-scheduler (build with --release first)")?,
    );
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&http, &format!("{base}/readyz")).await?;
    for i in 0..workers {
        let mut worker = Command::new(bin.join("cairn-worker"));
        common(&mut worker);
        worker
            .env("CAIRN_WORKER_ID", format!("bench-{i}"))
            .env(
                "CAIRN_METRICS_LISTEN",
                format!("127.0.0.1:{}", free_port()?),
            )
            .env("CAIRN_WORKER_CONCURRENCY", concurrency.to_string())
            .env(
                "CAIRN_DATABASE_MAX_CONNECTIONS",
                (concurrency + 4).to_string(),
            )
            .env("CAIRN_WORKSPACES_DIR", work.join("workspaces"))
            .env("CAIRN_ARTIFACTS_URL", work.join("artifacts"));
        processes
            .0
            .push(worker.spawn().context("starting cairn-worker")?);
    }
    let pool = sqlx::PgPool::connect(&database_url).await?;

    let spec = json!({"agent": "bench", "steps": steps, "budgets": {"max_commands": 10, "max_wall_seconds": 600}});
    let started = Instant::now();
    let mut submitted = 0;
    while submitted < runs {
        let n = batch.min(runs - submitted);
        let body = json!({"runs": vec![spec.clone(); n]});
        let response = http
            .post(format!("{base}/api/v1/runs/batch"))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await?;
        if response.status().as_u16() != 201 {
            bail!("batch submission failed: {}", response.text().await?);
        }
        submitted += n;
    }
    let admitted_in = started.elapsed();
    loop {
        let done: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM execution_requests WHERE state IN ('completed', 'failed')",
        )
        .fetch_one(&pool)
        .await?;
        if done as usize >= runs {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("only {done} of {runs} runs ended within 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wall = started.elapsed();
    let (failed, p50, p99): (i64, f64, f64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state <> 'completed'),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM claimed_at - admitted_at))::float8,
                percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM claimed_at - admitted_at))::float8
           FROM execution_requests",
    )
    .fetch_one(&pool)
    .await?;
    println!(
        "{label:>20}: {runs} runs in {:.2}s = {:.0} runs/s end to end (admission alone {:.0} runs/s); admission→claim p50 {:.1} ms, p99 {:.1} ms; {failed} not completed",
        wall.as_secs_f64(),
        runs as f64 / wall.as_secs_f64(),
        runs as f64 / admitted_in.as_secs_f64(),
        p50 * 1000.0,
        p99 * 1000.0,
    );
    pool.close().await;
    drop(processes);
    let admin =
        sqlx::PgPool::connect(&format!("{}/postgres", postgres.trim_end_matches('/'))).await?;
    sqlx::query(&format!(
        "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
    ))
    .execute(&admin)
    .await?;
    for queue in ["runs", "continuations", "verifications", "dead"] {
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "delete_queue", &format!("{prefix}cairn.{queue}")])
            .output();
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

async fn wait_ready(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    for _ in 0..240 {
        if let Ok(response) = http.get(url).send().await {
            if response.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("{url} never answered 200")
}
