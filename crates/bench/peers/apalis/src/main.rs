//! The apalis-postgres peer: `--jobs` jobs pushed to apalis's PostgreSQL storage and run
//! by `--workers` workers of `--concurrency` jobs each, in this process. Each job starts
//! one process (`/bin/true`, plainly or in bubblewrap, with `--process`) and then commits
//! one row. Prints `PEER apalis-postgres (…): N jobs in S s: R jobs/s`, timed on the
//! database's clock from the first push to the last row.

use apalis::prelude::*;
use apalis_postgres::{PgPool, PostgresStorage};
use futures::stream::{self, StreamExt};
use sqlx::postgres::PgPoolOptions;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The database the peer makes, and drops unless `--keep-database`.
const DATABASE: &str = "cairn_peer_apalis";

const BATCH: usize = 50;

/// A fresh namespace of each kind (the network's empty) and the host's root read-only,
/// as the Celery peer does.
const BWRAP: &[&str] = &[
    "bwrap",
    "--die-with-parent",
    "--new-session",
    "--unshare-all",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
];

#[derive(Clone, Copy, PartialEq)]
enum Process {
    None,
    Plain,
    Bwrap,
}

struct Args {
    jobs: i64,
    workers: usize,
    concurrency: usize,
    process: Process,
    postgres: String,
    keep_database: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        jobs: 5000,
        workers: 2,
        concurrency: 4,
        process: Process::None,
        postgres: "postgres://postgres@127.0.0.1:5432".into(),
        keep_database: false,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        if flag == "--keep-database" {
            args.keep_database = true;
            continue;
        }
        if flag == "--help" {
            println!("cairn-peer-apalis [--jobs N] [--workers N] [--concurrency N] [--process none|plain|bwrap] [--postgres URL] [--keep-database]");
            std::process::exit(0);
        }
        let value = given.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag} {value}: not a number"))
        };
        match flag.as_str() {
            "--jobs" => args.jobs = number()? as i64,
            "--workers" => args.workers = number()?,
            "--concurrency" => args.concurrency = number()?,
            "--postgres" => args.postgres = value.trim_end_matches('/').to_string(),
            "--process" => {
                args.process = match value.as_str() {
                    "none" => Process::None,
                    "plain" => Process::Plain,
                    "bwrap" => Process::Bwrap,
                    _ => return Err(format!("--process {value}: none, plain or bwrap")),
                }
            }
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if args.jobs < 1 || args.workers < 1 || args.concurrency < 1 {
        return Err("--jobs, --workers and --concurrency must be positive".into());
    }
    Ok(args)
}

/// One job: the process, then the durable row.
async fn effect(job: i64, pool: Data<PgPool>, process: Data<Process>) -> Result<(), BoxDynError> {
    if *process != Process::None {
        let argv: Vec<&str> = match *process {
            Process::Bwrap => BWRAP.iter().copied().chain(["/bin/true"]).collect(),
            _ => vec!["/bin/true"],
        };
        let status = tokio::process::Command::new(argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .status()
            .await?;
        if !status.success() {
            return Err(format!("{argv:?} exited with {status}").into());
        }
    }
    sqlx::query("INSERT INTO effects (id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(job)
        .execute(&*pool)
        .await?;
    Ok(())
}

/// Pushes the jobs with the workers running, waits for every row; the seconds taken.
async fn measure(args: &Args) -> Result<f64, BoxDynError> {
    let url = format!("{}/{DATABASE}", args.postgres);
    let pool = PgPoolOptions::new()
        .max_connections((args.workers * (args.concurrency + 2) + 2) as u32)
        .connect(&url)
        .await?;
    PostgresStorage::setup(&pool).await?;
    sqlx::query("CREATE TABLE effects (id bigint PRIMARY KEY, done_at timestamptz DEFAULT now())")
        .execute(&pool)
        .await?;
    let mut backend: PostgresStorage<i64> = PostgresStorage::new(&pool);
    let config = backend.config().clone().batch_size(BATCH);
    backend = backend.with_config(config);
    let mut monitor = Monitor::new();
    for i in 0..args.workers {
        let (backend, pool, process) = (backend.clone(), pool.clone(), args.process);
        let concurrency = args.concurrency;
        monitor = monitor.register(move |_| {
            WorkerBuilder::new(format!("cairn-peer-{i}"))
                .backend(backend.clone().with_pubsub())
                .data(pool.clone())
                .data(process)
                .concurrency(concurrency)
                .build(effect)
        });
    }
    let running = tokio::spawn(monitor.run());
    let started: f64 = sqlx::query_scalar("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")
        .fetch_one(&pool)
        .await?;
    let mut jobs = stream::iter(0..args.jobs).map(|job| Task::new(job));
    backend.push_all(&mut jobs).await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        // Marked: cairn-bench leaves its own statements out of a system's count.
        let done: i64 = sqlx::query_scalar("SELECT count(*) /* cairn-bench */ FROM effects")
            .fetch_one(&pool)
            .await?;
        if done >= args.jobs {
            break;
        }
        if running.is_finished() || Instant::now() > deadline {
            return Err(format!("only {done} of {} jobs done", args.jobs).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ended: f64 =
        sqlx::query_scalar("SELECT EXTRACT(EPOCH FROM max(done_at))::float8 FROM effects")
            .fetch_one(&pool)
            .await?;
    running.abort();
    pool.close().await;
    Ok(ended - started)
}

async fn run(args: &Args) -> Result<f64, BoxDynError> {
    let admin = PgPool::connect(&format!("{}/postgres", args.postgres)).await?;
    const DROP: &str = "DROP DATABASE IF EXISTS cairn_peer_apalis WITH (FORCE)";
    sqlx::query(DROP).execute(&admin).await?;
    sqlx::query("CREATE DATABASE cairn_peer_apalis")
        .execute(&admin)
        .await?;
    let result = measure(args).await;
    if result.is_err() || !args.keep_database {
        let _ = sqlx::query(DROP).execute(&admin).await;
    }
    result
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("apalis peer: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args).await {
        Ok(secs) => {
            let started = match args.process {
                Process::None => "",
                Process::Plain => "/bin/true and ",
                Process::Bwrap => "/bin/true in bubblewrap and ",
            };
            println!(
                "PEER apalis-postgres ({} workers of {}, {started}a PostgreSQL insert per job): {} jobs in {secs:.2} s: {} jobs/s",
                args.workers,
                args.concurrency,
                args.jobs,
                (args.jobs as f64 / secs).round()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("apalis peer: error: {e}");
            ExitCode::FAILURE
        }
    }
}
