//! `cairn-bench`: measures Cairn on the local services and prints the figures.
//!
//! `cairn-bench pipeline` starts a scheduler and W workers (the binaries next to this
//! one), submits N runs through the batch API (in bursts, or at `--rate`), waits until
//! every run ended, and prints one table: runs per second, admission→claim and
//! admission→completed p50/p99/max, and the median time of each stage, for runs of K
//! `/bin/true` steps (`--steps 1,10,100`) over W workers
//! (`--scaling`: 1, 2 and 4); then a `SCENARIO <steps> x<workers>: N runs/s` line each.
//! With `--compare`, one-step runs with the step's isolation off and on run beside
//! Celery and apalis-postgres, whose jobs start `/bin/true` plainly and in bubblewrap,
//! and one table gives each system's jobs/s, its ratio to the best peer, and its cost
//! to PostgreSQL per job.
//!
//! `cairn-bench snapshot` times, on one tree: full capture, capture after 1% of the files
//! changed, and restore — beside `tar | zstd -1 -T0`, `zstd -d | tar -x`, and restic's
//! backup, incremental backup and restore when restic is installed.
//!
//! `cairn-bench console` times the API calls the console makes, at 1,000 runs and at
//! 100,000, side by side.
//!
//! `cairn-bench fence` times a fenced begin with the lease check in the BEGIN's round
//! trip, beside the check as a statement of its own.
//!
//! `cairn-bench steps` prints the per-step overhead (intent → receipt on a durable tree)
//! on an empty tree and on the 1 GiB tree with 1 % changed per step.

mod compare;
mod console;
mod fence;
mod isolation;
mod lifecycle;
mod meter;
mod peers;
mod pipeline;
mod reaper;
mod scratch;
mod snapshot;
mod stack;
mod stats;
mod steps;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// The PostgreSQL server a scenario creates its fresh databases on.
#[derive(Debug, clap::Args)]
pub struct Postgres {
    /// PostgreSQL server (each scenario creates its own fresh database on it).
    #[arg(
        long,
        env = "CAIRN_BENCH_POSTGRES",
        default_value = "postgres://postgres@127.0.0.1:5432"
    )]
    pub postgres: String,
}

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
        /// Worker processes; several (`1,2,4`) run each scenario once per count.
        #[arg(long, value_delimiter = ',', default_value = "2")]
        workers: Vec<usize>,
        /// Every scenario over 1, 2 and 4 workers (overrides --workers).
        #[arg(long)]
        scaling: bool,
        /// Jobs each worker runs at once.
        #[arg(long, default_value_t = 32)]
        concurrency: u32,
        /// Runs per batch submission (at most 1,000).
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        /// `/bin/true` steps per run, at least 1; several (`1,10`) run one scenario each.
        #[arg(long, value_delimiter = ',', default_value = "1")]
        steps: Vec<usize>,
        /// Submit at this steady rate (runs per second) instead of in bursts.
        #[arg(long)]
        rate: Option<f64>,
        /// With --rate: also give the latencies without the runs admitted in this many
        /// first seconds (a line `steady …` after the table), and the load's first
        /// seconds one by one (`warming …` lines: where a cold start's time goes); 0
        /// for neither.
        #[arg(long, default_value_t = 5.0)]
        warmup: f64,
        /// One-step runs with the step's isolation off and on, beside Celery and
        /// apalis-postgres (installed or built once from PyPI and crates.io by
        /// `crates/bench/peers/*/run`) with as many jobs, each job starting `/bin/true`
        /// plainly and in bubblewrap: one table, with each system's cost to PostgreSQL
        /// per job (statements need pg_stat_statements loaded). One-step bursts on the
        /// first --workers count: --steps, --rate and --scaling are refused with it.
        #[arg(long, conflicts_with_all = ["steps", "rate", "scaling"])]
        compare: bool,
        #[command(flatten)]
        postgres: Postgres,
    },
    /// What the lease fence costs a durable write: the check in the BEGIN's round trip
    /// beside the check as a statement of its own.
    Fence {
        /// Fenced transactions of each kind.
        #[arg(long, default_value_t = 5000)]
        transactions: usize,
        #[command(flatten)]
        postgres: Postgres,
    },
    /// One reaper sweep over a table of snapshot rows, a tenth of them due.
    Reaper {
        /// Snapshot rows.
        #[arg(long, default_value_t = 1_000_000)]
        rows: i64,
        /// Rows per batch.
        #[arg(long, default_value_t = 1000)]
        batch: i64,
        #[command(flatten)]
        postgres: Postgres,
    },
    /// What the step's isolation costs a step: `/bin/true` started in it (with and
    /// without the network) and, as the baseline, in a plain process group.
    Sandbox {
        /// Commands per mode.
        #[arg(long, default_value_t = 500)]
        runs: usize,
        /// Also a sandbox resource's lifecycle on the generated tree: fork (the
        /// source's freeze, fork → running, beside a restore), stop, and resume on
        /// another worker.
        #[arg(long)]
        lifecycle: bool,
        /// Files in the generated tree (with --lifecycle).
        #[arg(long, default_value_t = 50_000)]
        files: usize,
        /// Total size of the generated tree, in MiB (with --lifecycle).
        #[arg(long, default_value_t = 1024)]
        size_mib: u64,
        #[command(flatten)]
        postgres: Postgres,
    },
    /// Snapshot capture, incremental capture and restore against tar+zstd and restic.
    Snapshot {
        /// A tree to measure (copied first, never modified); default: a generated tree.
        #[arg(long)]
        tree: Option<PathBuf>,
        /// Files in the generated tree.
        #[arg(long, default_value_t = 50_000)]
        files: usize,
        /// Total size of the generated tree, in MiB.
        #[arg(long, default_value_t = 1024)]
        size_mib: u64,
    },
    /// Per-step overhead: intent → receipt on a durable tree, on an empty tree and on
    /// the generated tree with 1% of its files changed by each step.
    Steps {
        /// Measured steps per tree.
        #[arg(long, default_value_t = 20)]
        steps: usize,
        /// Files in the generated tree.
        #[arg(long, default_value_t = 50_000)]
        files: usize,
        /// Total size of the generated tree, in MiB.
        #[arg(long, default_value_t = 1024)]
        size_mib: u64,
        #[command(flatten)]
        postgres: Postgres,
    },
    /// The API the console reads (list pages, filters, counts, the change feed) at
    /// 1,000 runs and at --runs, p50/p99/max side by side.
    Console(console::Args),
    /// A step of `cairn-bench steps`: changes 1% of the files under a directory.
    #[command(hide = true)]
    ChangeOnePercent { dir: PathBuf },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Bench::Fence {
            transactions,
            postgres,
        } => fence::run(transactions, &postgres.postgres).await,
        Bench::Console(args) => console::run(args).await,
        Bench::Reaper {
            rows,
            batch,
            postgres,
        } => reaper::run(rows, batch, &postgres.postgres).await,
        Bench::Snapshot {
            tree,
            files,
            size_mib,
        } => snapshot::run(tree, files, size_mib).await,
        Bench::Sandbox {
            runs,
            lifecycle,
            files,
            size_mib,
            postgres,
        } => {
            sandbox(
                runs,
                lifecycle.then_some((files, size_mib)),
                &postgres.postgres,
            )
            .await
        }
        Bench::Pipeline {
            runs,
            workers,
            scaling,
            concurrency,
            batch,
            steps,
            rate,
            warmup,
            compare,
            postgres,
        } => {
            let pipeline = pipeline::Pipeline {
                runs,
                workers: if scaling { vec![1, 2, 4] } else { workers },
                concurrency,
                batch,
                steps,
                rate,
                warmup,
                postgres: &postgres.postgres,
            };
            if compare {
                compare::run(&pipeline).await
            } else {
                pipeline.run().await
            }
        }
        Bench::Steps {
            steps,
            files,
            size_mib,
            postgres,
        } => {
            steps::Steps {
                steps,
                files,
                size_mib,
                postgres: &postgres.postgres,
            }
            .run()
            .await
        }
        Bench::ChangeOnePercent { dir } => snapshot::change_one_percent(&dir).map(|_| ()),
    }
}

/// The step sandbox's cost, then (given its tree's files and MiB) a sandbox's lifecycle.
async fn sandbox(
    runs: usize,
    lifecycle: Option<(usize, u64)>,
    postgres: &str,
) -> anyhow::Result<()> {
    isolation::run(runs).await?;
    if let Some((files, size_mib)) = lifecycle {
        println!();
        let lifecycle = lifecycle::Lifecycle {
            files,
            size_mib,
            postgres,
        };
        lifecycle.run().await?;
    }
    Ok(())
}
