//! The faults of a chaos run, on a seeded schedule, and what each one did: for a worker
//! that dies or stalls, the requests it held and how long until another worker held
//! each of them (the takeover time).

use crate::fleet::Fleet;
use crate::services::{Postgres, Rabbit, Redis};
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use sqlx::PgPool;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL of a worker; it is started again under its name after `restart`.
    WorkerKill,
    /// SIGSTOP of a worker for the given time, then SIGCONT.
    WorkerStop(u64),
    /// `rabbitmqctl stop_app` for the given time, then `start_app`.
    BrokerStop(u64),
    RedisFlush,
    RedisRestart,
    PostgresRestart,
    /// SIGTERM of a worker (a drain), started again once it exited.
    WorkerTerm,
    /// SIGKILL of the scheduler (API, relay, sweeper), started again at once.
    SchedulerKill,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::WorkerKill => "worker SIGKILL",
            Fault::WorkerStop(_) => "worker SIGSTOP",
            Fault::BrokerStop(_) => "RabbitMQ stop_app",
            Fault::RedisFlush => "Redis FLUSHALL",
            Fault::RedisRestart => "Redis restart",
            Fault::PostgresRestart => "PostgreSQL restart",
            Fault::WorkerTerm => "worker SIGTERM",
            Fault::SchedulerKill => "scheduler SIGKILL",
        }
    }
}

/// The faults of one run, in a seeded order: `rounds` of each kind (worker kills
/// `kills` times per round), `stall` seconds for SIGSTOP and `broker` for RabbitMQ.
pub fn schedule(
    rng: &mut StdRng,
    rounds: usize,
    kills: usize,
    stall: u64,
    broker: u64,
) -> Vec<Fault> {
    let mut faults = Vec::new();
    for _ in 0..rounds {
        faults.extend(std::iter::repeat_n(Fault::WorkerKill, kills));
        faults.extend([
            Fault::WorkerStop(stall),
            Fault::BrokerStop(broker),
            Fault::RedisFlush,
            Fault::RedisRestart,
            Fault::PostgresRestart,
            Fault::WorkerTerm,
            Fault::SchedulerKill,
        ]);
    }
    faults.shuffle(rng);
    faults
}

/// A worker that died or stalled, and the requests it held then.
pub struct Victim {
    pub fault: Fault,
    pub worker: String,
    pub held: Vec<Uuid>,
    /// Seconds from the fault until another worker held each request (or it ended).
    pub takeovers: Vec<f64>,
    /// Requests not taken over within the watch.
    pub untaken: usize,
}

/// What was injected.
#[derive(Default)]
pub struct Record {
    pub injected: Vec<Fault>,
    pub victims: Vec<Victim>,
    pub errors: Vec<String>,
    /// Every request a killed, stalled or drained worker held: an unknown outcome there
    /// is the fault's, not a defect.
    pub touched: BTreeSet<Uuid>,
}

pub struct Services {
    pub postgres: Postgres,
    pub redis: Redis,
    pub rabbit: Rabbit,
}

/// Runs the schedule, one fault every `spacing`, on this thread (it blocks); database
/// reads go through `runtime`.
pub fn inject(
    faults: &[Fault],
    spacing: Duration,
    fleet: &mut Fleet,
    services: &mut Services,
    pool: &PgPool,
    runtime: &tokio::runtime::Handle,
    rng: &mut StdRng,
) -> Record {
    let mut record = Record::default();
    for fault in faults {
        std::thread::sleep(spacing);
        println!("fault: {}", fault.name());
        let result = one(*fault, fleet, services, pool, runtime, rng, &mut record);
        if let Err(e) = result {
            record.errors.push(format!("{}: {e:#}", fault.name()));
        }
        record.injected.push(*fault);
    }
    record
}

fn one(
    fault: Fault,
    fleet: &mut Fleet,
    services: &mut Services,
    pool: &PgPool,
    runtime: &tokio::runtime::Handle,
    rng: &mut StdRng,
    record: &mut Record,
) -> anyhow::Result<()> {
    match fault {
        Fault::WorkerKill | Fault::WorkerStop(_) | Fault::WorkerTerm => {
            let index = busiest(fleet, pool, runtime, rng);
            let name = fleet.workers[index].name.clone();
            let held = runtime.block_on(held_by(pool, &name))?;
            record.touched.extend(held.iter().copied());
            let at = Instant::now();
            let (signal, watch_for) = match fault {
                Fault::WorkerKill => (Signal::SIGKILL, Duration::from_secs(30)),
                Fault::WorkerStop(seconds) => (Signal::SIGSTOP, Duration::from_secs(seconds)),
                _ => (Signal::SIGTERM, Duration::ZERO),
            };
            let worker = &mut fleet.workers[index];
            worker.signal(signal)?;
            if fault == Fault::WorkerTerm {
                if !worker.wait_exit(Duration::from_secs(60)) {
                    anyhow::bail!("{name} did not exit within 60 s of SIGTERM");
                }
                return worker.spawn();
            }
            let (takeovers, untaken) = runtime.block_on(watch(pool, &name, &held, at, watch_for));
            record.victims.push(Victim {
                fault,
                worker: name,
                held,
                takeovers,
                untaken,
            });
            if fault == Fault::WorkerKill {
                worker.wait_exit(Duration::from_secs(10));
                worker.spawn()?;
            } else {
                std::thread::sleep(watch_for.saturating_sub(at.elapsed()));
                worker.signal(Signal::SIGCONT)?;
            }
        }
        Fault::BrokerStop(seconds) => {
            services.rabbit.app("stop_app")?;
            std::thread::sleep(Duration::from_secs(seconds));
            services.rabbit.app("start_app")?;
        }
        Fault::RedisFlush => services.redis.flushall()?,
        Fault::RedisRestart => services.redis.restart()?,
        Fault::PostgresRestart => services.postgres.restart()?,
        Fault::SchedulerKill => {
            fleet.scheduler.signal(Signal::SIGKILL)?;
            fleet.scheduler.wait_exit(Duration::from_secs(10));
            fleet.scheduler.spawn()?;
        }
    }
    Ok(())
}

/// The worker holding the most requests now (ties broken by the seed), so that a fault
/// finds work to interrupt.
fn busiest(
    fleet: &Fleet,
    pool: &PgPool,
    runtime: &tokio::runtime::Handle,
    rng: &mut StdRng,
) -> usize {
    let mut best = (rng.random_range(0..fleet.workers.len()), 0usize);
    for (index, worker) in fleet.workers.iter().enumerate() {
        let held = runtime
            .block_on(held_by(pool, &worker.name))
            .map(|h| h.len())
            .unwrap_or(0);
        if held > best.1 {
            best = (index, held);
        }
    }
    best.0
}

async fn held_by(pool: &PgPool, worker: &str) -> anyhow::Result<Vec<Uuid>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM execution_requests WHERE lease_owner = $1 AND state = 'executing'",
    )
    .bind(worker)
    .fetch_all(pool)
    .await?)
}

/// Polls until each held request is held by another worker or no longer executing;
/// returns the seconds each took from `at`, and how many did not within `limit`.
async fn watch(
    pool: &PgPool,
    victim: &str,
    held: &[Uuid],
    at: Instant,
    limit: Duration,
) -> (Vec<f64>, usize) {
    let mut waiting: BTreeSet<Uuid> = held.iter().copied().collect();
    let mut took = Vec::new();
    while !waiting.is_empty() && at.elapsed() < limit {
        let moved: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM execution_requests
              WHERE id = ANY($1)
                AND ((lease_owner IS NOT NULL AND lease_owner <> $2) OR state NOT IN ('executing', 'queued'))",
        )
        .bind(waiting.iter().copied().collect::<Vec<_>>())
        .bind(victim)
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        for id in moved {
            if waiting.remove(&id) {
                took.push(at.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (took, waiting.len())
}
