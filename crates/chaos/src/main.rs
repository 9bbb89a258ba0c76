//! `cairn-chaos`: a seeded chaos run of Cairn on PostgreSQL, Redis and RabbitMQ of its
//! own. It starts a scheduler and workers, submits runs of three steps (the middle one
//! not idempotent) while it kills, stalls, drains and restarts processes and services on
//! a schedule, waits for every run to end, then audits the database against the steps'
//! own side effects. It prints a table and exits non-zero on any violation.

mod audit;
mod faults;
mod fleet;
mod load;
mod services;

use anyhow::Context;
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(name = "cairn-chaos", version, about)]
struct Args {
    /// `bounded` (about 100 runs, one fault of each kind: minutes, for CI) or `full`
    /// (1,000 runs, 9 worker kills, a 45 s stall, a 15 s broker stop, …).
    #[arg(long, default_value = "bounded")]
    profile: String,
    /// Overrides the profile's number of runs.
    #[arg(long)]
    runs: Option<usize>,
    #[arg(long, default_value_t = 3)]
    workers: usize,
    #[arg(long, default_value_t = 8)]
    concurrency: u32,
    /// The seed of the schedule and the load (printed; the same seed replays them).
    #[arg(long, env = "CAIRN_CHAOS_SEED")]
    seed: Option<u64>,
    /// A takeover slower than this is a violation.
    #[arg(long, default_value_t = 10.0)]
    takeover_bound_seconds: f64,
    /// Keep the scratch directory (logs, data) after the run.
    #[arg(long)]
    keep: bool,
}

struct Profile {
    runs: usize,
    rounds: usize,
    kills: usize,
    stall: u64,
    broker: u64,
    spacing: Duration,
}

fn profile(name: &str) -> anyhow::Result<Profile> {
    match name {
        "bounded" => Ok(Profile {
            runs: 100,
            rounds: 1,
            kills: 1,
            stall: 12,
            broker: 10,
            spacing: Duration::from_secs(6),
        }),
        "full" => Ok(Profile {
            runs: 1000,
            rounds: 1,
            kills: 9,
            stall: 45,
            broker: 15,
            spacing: Duration::from_secs(10),
        }),
        other => anyhow::bail!("unknown profile {other:?}: bounded or full"),
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let profile = profile(&args.profile)?;
    let runs = args.runs.unwrap_or(profile.runs);
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    println!("cairn-chaos: profile {}, {runs} runs, {} workers × {}, seed {seed} (CAIRN_CHAOS_SEED={seed} replays it)", args.profile, args.workers, args.concurrency);
    let dir = std::env::temp_dir().join(format!("cairn-chaos-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = chaos(&args, &profile, runs, seed, &dir, &runtime);
    if args.keep || result.is_err() {
        println!("logs and data kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    match result {
        Ok(true) => Ok(()),
        Ok(false) => std::process::exit(1),
        Err(e) => Err(e),
    }
}

/// The whole run; `Ok(false)` when the audit found a violation.
fn chaos(
    args: &Args,
    profile: &Profile,
    runs: usize,
    seed: u64,
    dir: &std::path::Path,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    let mut services = start_services(dir)?;
    let env = fleet::Env {
        database: services.postgres.url(),
        redis: services.redis.url(),
        amqp: services.rabbit.url(),
        dir: dir.to_path_buf(),
    };
    let mut fleet = fleet::Fleet::start(&env, args.workers, args.concurrency)?;
    let pool = runtime.block_on(
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&services.postgres.url()),
    )?;

    let mut rng = StdRng::seed_from_u64(seed);
    let schedule = faults::schedule(
        &mut rng,
        profile.rounds,
        profile.kills,
        profile.stall,
        profile.broker,
    );
    // The load spans the faults: the schedule's time plus the stalls it waits out.
    let fault_time = profile.spacing.as_secs_f64() * (schedule.len() + 1) as f64
        + (profile.stall + profile.broker) as f64;
    let interval = Duration::from_secs_f64(fault_time / runs as f64);
    // Steps see no host path but their workspace and this shared directory.
    std::fs::create_dir_all(dir.join(fleet::SHARED))?;
    let effects = dir.join(fleet::SHARED).join("effects");
    let admissions = Arc::new(Mutex::new(load::Admissions::default()));
    let load = runtime.spawn(submit_load(
        fleet.base.clone(),
        effects.clone(),
        (runs, seed, interval),
        admissions.clone(),
    ));

    let record = faults::inject(
        &schedule,
        profile.spacing,
        &mut fleet,
        &mut services,
        &pool,
        runtime.handle(),
        &mut rng,
    );
    runtime.block_on(load)?;
    println!("load submitted; waiting for every run to end");
    let ended = runtime.block_on(wait_ended(&pool, runs, Duration::from_secs(300)));
    if let Err(e) = ended {
        println!("{e}");
    }
    let admissions =
        std::mem::take(&mut *admissions.lock().unwrap_or_else(PoisonError::into_inner));
    let findings = runtime.block_on(audit::audit(
        &pool,
        &admissions,
        &effects,
        &record,
        args.takeover_bound_seconds,
    ))?;
    Ok(report(&findings, &record, dir, seed, started))
}

/// Prints what each victim held and how it was taken over, then the findings;
/// whether there was no violation.
fn report(
    findings: &audit::Findings,
    record: &faults::Record,
    dir: &std::path::Path,
    seed: u64,
    started: Instant,
) -> bool {
    for victim in &record.victims {
        let slowest = victim.takeovers.iter().copied().fold(0.0, f64::max);
        println!(
            "{} of {}: held {} requests; {} taken over, the slowest after {slowest:.1} s; {} not within the watch",
            victim.fault.name(),
            victim.worker,
            victim.held.len(),
            victim.takeovers.len(),
            victim.untaken
        );
    }
    let stale_refused = count_in_logs(dir, "no longer owns the request");
    println!();
    println!("| check | value |\n|---|---|");
    findings.print();
    println!("| stale writes refused (worker logs) | {stale_refused} |");
    println!("| wall time | {:.0} s |", started.elapsed().as_secs_f64());
    if findings.violations.is_empty() {
        println!("\nno violation (seed {seed})");
        true
    } else {
        println!("\nVIOLATIONS (seed {seed}):");
        for v in &findings.violations {
            println!("- {v}");
        }
        false
    }
}

/// PostgreSQL, Redis and RabbitMQ of the run's own, on other ports than the machine's.
fn start_services(dir: &std::path::Path) -> anyhow::Result<faults::Services> {
    let started = Instant::now();
    let services = faults::Services {
        postgres: services::Postgres::start(dir).context("PostgreSQL of its own")?,
        redis: services::Redis::start().context("Redis of its own")?,
        rabbit: services::Rabbit::start(dir).context("RabbitMQ node of its own")?,
    };
    println!(
        "services: PostgreSQL :{}, Redis :{}, RabbitMQ :{} (started in {:.1} s)",
        services.postgres.port,
        services.redis.port,
        services.rabbit.port,
        started.elapsed().as_secs_f64()
    );
    Ok(services)
}

/// Submits `runs` runs, one every `interval` (one in ten again later, as a client
/// retrying would), recording each answer.
async fn submit_load(
    base: String,
    effects: std::path::PathBuf,
    (runs, seed, interval): (usize, u64, Duration),
    admissions: Arc<Mutex<load::Admissions>>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let http = reqwest::Client::new();
    let mut submissions = tokio::task::JoinSet::new();
    for n in 0..runs {
        let key = format!("chaos-{seed}-{n}");
        let spec = load::spec(&key, &effects, &mut rng);
        // One run in ten is sent again later, as a client retrying would.
        let again = rng.random_bool(0.1);
        let (http, base, admissions) = (http.clone(), base.clone(), admissions.clone());
        submissions.spawn(async move {
            let limit = Duration::from_secs(120);
            for _ in 0..if again { 2 } else { 1 } {
                let answer = load::submit(&http, &base, &key, &spec, limit).await;
                {
                    let mut admissions = admissions.lock().unwrap_or_else(PoisonError::into_inner);
                    match answer {
                        Some(id) => admissions.answers.entry(key.clone()).or_default().push(id),
                        None => admissions.unanswered.push(key.clone()),
                    }
                }
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        });
        tokio::time::sleep(interval).await;
    }
    while submissions.join_next().await.is_some() {}
}

/// Waits until every admitted run ended or waits for a person, up to `limit`.
async fn wait_ended(pool: &sqlx::PgPool, runs: usize, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM execution_requests WHERE state IN ('queued', 'executing')",
        )
        .fetch_one(pool)
        .await
        .unwrap_or(i64::MAX);
        if open == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("{open} of {runs} runs still open after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn count_in_logs(dir: &std::path::Path, needle: &str) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| {
            std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .matches(needle)
                .count()
        })
        .sum()
}
