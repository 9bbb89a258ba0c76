//! `cairn-bench pipeline`: admission → queue → claim → steps → completion, end to end,
//! in a burst or at a steady rate, over one or more worker counts, with where a run's
//! time goes (from the timestamps the system records).

use crate::meter::{process_ticks, Cost, Meter, Statement};
use crate::stack::{Stack, StackSettings};
use serde_json::json;
use std::time::{Duration, Instant};

pub struct Pipeline<'a> {
    pub runs: usize,
    pub workers: Vec<usize>,
    pub concurrency: u32,
    pub batch: usize,
    /// Step counts to run, one scenario each.
    pub steps: Vec<usize>,
    /// Steady submission at this many runs per second; `None`: one burst.
    pub rate: Option<f64>,
    /// With a rate: the latencies are also given without the runs admitted in this
    /// many first seconds, while the stack is still cold.
    pub warmup: f64,
    pub postgres: &'a str,
}

/// How a scenario's stack differs from the default.
#[derive(Default)]
pub(crate) struct Variant {
    /// Extra environment of every worker.
    pub worker_env: Vec<(String, String)>,
    /// Each step's `network`; absent: the worker's default.
    pub network: Option<bool>,
}

/// A metered scenario's cost per run.
pub(crate) struct Metered {
    pub cost: Cost,
    pub cpu: CpuPerRun,
    /// The statements run about once a run or more, by PostgreSQL's time.
    pub statements: Vec<Statement>,
}

/// Cairn's processes' CPU per run, in ms.
pub(crate) struct CpuPerRun {
    pub scheduler: f64,
    /// The workers' own, without the processes they started.
    pub workers: f64,
    /// The processes the workers started and reaped: the steps and their isolation.
    pub started: f64,
}

/// CPU ticks of a stack's processes.
struct Cpu {
    scheduler: u64,
    workers: u64,
    started: u64,
}

impl Cpu {
    fn of(stack: &Stack) -> anyhow::Result<Cpu> {
        let (scheduler, workers) = stack.pids();
        let mut cpu = Cpu {
            scheduler: process_ticks(scheduler)?.0,
            workers: 0,
            started: 0,
        };
        for pid in workers {
            let (own, reaped) = process_ticks(pid)?;
            cpu.workers += own;
            cpu.started += reaped;
        }
        Ok(cpu)
    }

    fn since(&self, before: &Cpu, runs: usize, ms_per_tick: f64) -> CpuPerRun {
        let per = |a: u64, b: u64| a.saturating_sub(b) as f64 * ms_per_tick / runs as f64;
        CpuPerRun {
            scheduler: per(self.scheduler, before.scheduler),
            workers: per(self.workers, before.workers),
            started: per(self.started, before.started),
        }
    }
}

/// One scenario's figures.
pub(crate) struct Figures {
    label: String,
    workers: usize,
    pub runs: usize,
    pub wall: Duration,
    pub not_completed: i64,
    /// Messages announced per run: above 1, the sweeper announced runs again (taken for
    /// parked on a worker), and each duplicate cost a publish, a delivery and a claim.
    messages_per_run: f64,
    claim_ms: Percentiles,
    done_ms: Percentiles,
    /// With a rate and a warm-up: the runs admitted after it, and their latencies.
    steady: Option<Steady>,
    /// p50 and p99, in ms: admission → claim, claim → first intent, first intent → last
    /// receipt, last receipt → completion; and one step's intent → receipt. The p99s
    /// say which stage a slow run was slow in.
    breakdown: [(f64, f64); 5],
    /// The first step's way from admission to its receipt, p50 and p99 in ms, in the
    /// gaps [`FIRST_STEP`] names.
    first_step: [(f64, f64); 6],
    /// With a rate: the load's first seconds, one by one.
    warming: Vec<Second>,
}

/// The gaps of [`Figures::first_step`], each named by the timestamp it ends at.
const FIRST_STEP: [&str; 6] = [
    "publish",
    "claim",
    "workspace",
    "intent",
    "capture",
    "receipt",
];

/// What each gap of [`FIRST_STEP`] holds.
const FIRST_STEP_LEGEND: &str = "(first step: the gaps between the timestamps a run's first step leaves, each a transaction's start, so each gap holds the commit before it: publish = admission → publish confirmed (outbox commit, NOTIFY, relay); claim = → claim (delivery, the claim's lease); workspace = → workspace row (claim commit, liveness, lineage reads, directory); intent = → first intent (0 when it commits with the workspace row; else workspace, hold, restore record, standings); capture = → capture start (intent commit, sandbox, command, exit); receipt = → receipt (snapshot row, walk, manifest, fsyncs))";

/// The latencies of the runs admitted after the warm-up.
struct Steady {
    claim_ms: Percentiles,
    done_ms: Percentiles,
}

#[derive(sqlx::FromRow, Default)]
struct Percentiles {
    /// The runs measured.
    runs: i64,
    p50: Option<f64>,
    p99: Option<f64>,
    max: Option<f64>,
}

impl Percentiles {
    fn cell(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        format!("{}/{}/{}", ms(self.p50), ms(self.p99), ms(self.max))
    }
}

impl Pipeline<'_> {
    pub async fn run(&self) -> anyhow::Result<()> {
        if !(self.warmup.is_finite() && self.warmup >= 0.0) {
            anyhow::bail!(
                "--warmup {}: give the seconds to leave out, 0 or more",
                self.warmup
            );
        }
        let mode = match self.rate {
            Some(rate) => format!("a steady {rate} runs/s"),
            None => format!("bursts of {} per request", self.batch),
        };
        println!(
            "pipeline: {} runs per scenario, submitted in {mode}; {} concurrent jobs per worker",
            self.runs, self.concurrency
        );
        let admin =
            sqlx::PgPool::connect(&format!("{}/postgres", self.postgres.trim_end_matches('/')))
                .await?;
        let max_connections: String = sqlx::query_scalar("SHOW max_connections")
            .fetch_one(&admin)
            .await?;
        admin.close().await;
        if self.steps.contains(&0) {
            anyhow::bail!("--steps 0: a run needs at least one step (the API refuses `steps: []`)");
        }
        let mut all = Vec::new();
        for &steps in &self.steps {
            for &workers in &self.workers {
                let scenario = match self.scenario(steps, workers, &Variant::default(), None).await {
                    Ok((scenario, _)) => scenario,
                    // Each worker may open concurrency + 4 connections and the scheduler
                    // 20: many workers of many jobs exhaust a default server.
                    Err(e) if out_of_connections(&e) => {
                        return Err(e.context(format!(
                            "{steps} steps × {workers} workers: each worker may open {} PostgreSQL connections and the server allows {max_connections}; try a lower --concurrency",
                            self.concurrency + 4
                        )))
                    }
                    Err(e) => return Err(e),
                };
                all.push(scenario);
            }
        }
        print_table(&all);
        print_latencies(&all, self.warmup);
        for figures in &all {
            let rate = figures.runs as f64 / figures.wall.as_secs_f64();
            println!(
                "SCENARIO {} x{}: {rate:.0} runs/s",
                figures.label, figures.workers
            );
        }
        Ok(())
    }

    /// One scenario: with a meter, also what it cost PostgreSQL and Cairn's processes.
    pub(crate) async fn scenario(
        &self,
        steps: usize,
        workers: usize,
        variant: &Variant,
        meter: Option<&Meter>,
    ) -> anyhow::Result<(Figures, Option<Metered>)> {
        let mut stack = Stack::start(StackSettings {
            postgres: self.postgres,
            workers,
            concurrency: self.concurrency,
            worker_env: variant.worker_env.clone(),
        })
        .await?;
        let before = match meter {
            Some(meter) => {
                // An idle backend may hold its statistics up to 10 s before it flushes
                // them: the start's must be in the reading before, not the one after.
                tokio::time::sleep(Duration::from_secs(11)).await;
                Some((meter.read(stack.database(), false).await?, Cpu::of(&stack)?))
            }
            None => None,
        };
        let plan: Vec<_> = (0..steps)
            .map(|i| {
                let mut step = json!({"key": format!("s{i}"), "argv": ["/bin/true"]});
                if let Some(network) = variant.network {
                    step["network"] = json!(network);
                }
                step
            })
            .collect();
        let spec = json!({
            "agent": "bench",
            "steps": plan,
            "budgets": {"max_commands": steps * 2, "max_wall_seconds": 3600},
        });
        let started = Instant::now();
        self.submit(&stack, &spec).await?;
        stack
            .wait_ended(self.runs, Duration::from_secs(1800))
            .await?;
        let wall = started.elapsed();
        let metered = match (meter, before) {
            (Some(meter), Some((reading, cpu))) => {
                let spent = Cpu::of(&stack)?.since(&cpu, self.runs, meter.ms_per_tick());
                stack.halt().await;
                let after = meter.read(stack.database(), true).await?;
                let statements = meter.statements(stack.database(), self.runs).await?;
                stack.reconnect().await?;
                Some(Metered {
                    cost: meter.cost(reading, after, self.runs, stack.own_transactions()),
                    cpu: spent,
                    statements,
                })
            }
            _ => None,
        };
        let warmup = self.rate.map(|_| self.warmup).filter(|w| *w > 0.0);
        let figures = measure(&stack, steps, workers, self.runs, wall, warmup).await?;
        stack.stop().await?;
        Ok((figures, metered))
    }

    /// Submits every run: in batches as fast as admission takes them, or at the rate.
    async fn submit(&self, stack: &Stack, spec: &serde_json::Value) -> anyhow::Result<()> {
        let batch = self.batch.clamp(1, 1000);
        let mut submitted = 0;
        let Some(rate) = self.rate else {
            while submitted < self.runs {
                let n = batch.min(self.runs - submitted);
                stack.submit(&vec![spec.clone(); n]).await?;
                submitted += n;
            }
            return Ok(());
        };
        // A tick every 10 ms submits what the rate owes by then, so the load is steady.
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while submitted < self.runs {
            tick.tick().await;
            let owed = (started.elapsed().as_secs_f64() * rate) as usize;
            let n = owed.min(self.runs).saturating_sub(submitted);
            if n > 0 {
                stack.submit(&vec![spec.clone(); n]).await?;
                submitted += n;
            }
        }
        Ok(())
    }
}

/// Whether `error` is PostgreSQL (or a pool waiting on it) out of connections.
fn out_of_connections(error: &anyhow::Error) -> bool {
    let text = format!("{error:#}");
    [
        "pool timed out",
        "too many clients",
        "remaining connection slots",
    ]
    .iter()
    .any(|sign| text.contains(sign))
}

/// Each scenario's first-step gaps and, past the warmup, its steady latencies.
fn print_latencies(all: &[Figures], warmup: f64) {
    for figures in all {
        let gaps: Vec<String> = FIRST_STEP
            .iter()
            .zip(figures.first_step)
            .map(|(what, gap)| format!("{what} {}", ms(gap)))
            .collect();
        println!(
            "first step {} x{}, p50/p99 ms: {}",
            figures.label,
            figures.workers,
            gaps.join(", ")
        );
    }
    println!("{FIRST_STEP_LEGEND}");
    for figures in all {
        for figure in &figures.warming {
            let gaps: Vec<String> = FIRST_STEP
                .iter()
                .zip(figure.gaps_p99)
                .map(|(what, p99)| format!("{what} {p99:.0}"))
                .collect();
            println!(
                "warming {} x{}, second {}: {} runs, adm→done p99 {:.0} ms; first step p99 ms: {}",
                figures.label,
                figures.workers,
                figure.second,
                figure.runs,
                figure.done_p99,
                gaps.join(", ")
            );
        }
        if let Some(steady) = &figures.steady {
            println!(
                "steady {} x{}: the {} runs admitted after the first {} s: adm→claim ms p50/99/max {}, adm→done ms p50/99/max {}",
                figures.label,
                figures.workers,
                steady.done_ms.runs,
                warmup,
                steady.claim_ms.cell(),
                steady.done_ms.cell()
            );
        }
    }
}

async fn measure(
    stack: &Stack,
    steps: usize,
    workers: usize,
    runs: usize,
    wall: Duration,
    warmup: Option<f64>,
) -> anyhow::Result<Figures> {
    let (claim_ms, done_ms) = latencies(&stack.pool, 0.0).await?;
    let steady = match warmup {
        Some(after) => {
            let (claim_ms, done_ms) = latencies(&stack.pool, after).await?;
            Some(Steady { claim_ms, done_ms })
        }
        None => None,
    };
    let not_completed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM execution_requests WHERE state <> 'completed'")
            .fetch_one(&stack.pool)
            .await?;
    let messages_per_run: Option<f64> = sqlx::query_scalar(
        "SELECT count(*)::float8 / NULLIF(count(DISTINCT payload->>'request_id'), 0) FROM outbox",
    )
    .fetch_one(&stack.pool)
    .await?;
    let [queue, acquire, all_steps, finish] = gaps(
        &stack.pool,
        "WITH r AS (
           SELECT e.admitted_at, e.claimed_at, e.finished_at,
                  (SELECT min(i.started_at) FROM journal_intents i WHERE i.request_id = e.id) AS first_intent,
                  (SELECT max(x.finished_at) FROM journal_receipts x WHERE x.request_id = e.id) AS last_receipt
             FROM execution_requests e)",
        [
            "claimed_at - admitted_at",
            "first_intent - claimed_at",
            "last_receipt - first_intent",
            "finished_at - COALESCE(last_receipt, claimed_at)",
        ],
    )
    .await?;
    let [per_step] = gaps(
        &stack.pool,
        "WITH r AS (
           SELECT i.started_at, x.finished_at
             FROM journal_intents i JOIN journal_receipts x USING (request_id, step_key))",
        ["finished_at - started_at"],
    )
    .await?;
    let first_step = first_step_gaps(&stack.pool).await?;
    let warming = match warmup {
        Some(_) => warming(&stack.pool).await?,
        None => Vec::new(),
    };
    Ok(Figures {
        label: match steps {
            1 => "1-step".into(),
            n => format!("{n}-steps"),
        },
        workers,
        runs,
        wall,
        not_completed,
        messages_per_run: messages_per_run.unwrap_or(f64::NAN),
        claim_ms,
        done_ms,
        steady,
        breakdown: [queue, acquire, all_steps, finish, per_step],
        first_step,
        warming,
    })
}

/// The first step's way, gap by gap: admission → published → claimed → workspace →
/// intent → captured → receipt.
async fn first_step_gaps(pool: &sqlx::PgPool) -> anyhow::Result<[(f64, f64); 6]> {
    gaps(pool, FIRST_STEP_ROWS, FIRST_STEP_GAPS).await
}

/// Defines `r`: each run's admission, completion and the timestamps its first step left.
const FIRST_STEP_ROWS: &str = "WITH published AS (
           SELECT (payload->>'request_id')::uuid AS id, min(published_at) AS at
             FROM outbox GROUP BY 1),
         workspace AS (SELECT run_id, min(created_at) AS at FROM workspaces GROUP BY 1),
         r AS (
           SELECT e.admitted_at, e.finished_at, p.at AS published, e.claimed_at, w.at AS workspace,
                  f.started_at AS intent, f.captured, f.receipt
             FROM execution_requests e
             LEFT JOIN published p ON p.id = e.id
             LEFT JOIN workspace w ON w.run_id = e.run_id
             LEFT JOIN LATERAL (
                  SELECT i.started_at, s.created_at AS captured, x.finished_at AS receipt
                    FROM journal_intents i
                    JOIN journal_receipts x USING (request_id, step_key)
                    LEFT JOIN project_snapshots s ON s.id = x.snapshot_id
                   WHERE i.request_id = e.id
                   ORDER BY i.started_at LIMIT 1) f ON TRUE)";

/// The intervals of [`FIRST_STEP`], over the rows of [`FIRST_STEP_ROWS`].
const FIRST_STEP_GAPS: [&str; 6] = [
    "published - admitted_at",
    "claimed_at - published",
    "workspace - claimed_at",
    "intent - workspace",
    "captured - intent",
    "receipt - captured",
];

/// One second of a steady load's start: the runs admitted in it, their admission →
/// completion p99 and the p99 of each first-step gap, in ms.
struct Second {
    /// Seconds since the first admission.
    second: i32,
    runs: i64,
    done_p99: f64,
    gaps_p99: [f64; 6],
}

/// The first [`WARMING_SECONDS`] seconds of a steady load, second by second: where a
/// cold start's latency goes, and when it is gone.
async fn warming(pool: &sqlx::PgPool) -> anyhow::Result<Vec<Second>> {
    use sqlx::Row;
    let p99 = |interval: &str| {
        format!(
            "percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM {interval})::float8 * 1000)"
        )
    };
    let columns: Vec<String> = std::iter::once("finished_at - admitted_at")
        .chain(FIRST_STEP_GAPS)
        .map(p99)
        .collect();
    let rows = sqlx::query(&format!(
        "{FIRST_STEP_ROWS}, s AS (
           SELECT r.*, floor(EXTRACT(EPOCH FROM admitted_at - min(admitted_at) OVER ()))::int AS second
             FROM r)
         SELECT second, count(*), {} FROM s WHERE second < $1 GROUP BY second ORDER BY second",
        columns.join(", ")
    ))
    .bind(WARMING_SECONDS)
    .fetch_all(pool)
    .await?;
    let mut seconds = Vec::new();
    for row in rows {
        let mut gaps_p99 = [f64::NAN; 6];
        for (i, gap) in gaps_p99.iter_mut().enumerate() {
            *gap = row.try_get::<Option<f64>, _>(3 + i)?.unwrap_or(f64::NAN);
        }
        seconds.push(Second {
            second: row.try_get(0)?,
            runs: row.try_get(1)?,
            done_p99: row.try_get::<Option<f64>, _>(2)?.unwrap_or(f64::NAN),
            gaps_p99,
        });
    }
    Ok(seconds)
}

/// How many of a steady load's first seconds [`warming`] reports.
const WARMING_SECONDS: i32 = 8;

/// Admission → claim and admission → completion over the runs admitted at least `after`
/// seconds after the first.
async fn latencies(pool: &sqlx::PgPool, after: f64) -> anyhow::Result<(Percentiles, Percentiles)> {
    let percentiles = |to: &str| {
        format!(
            "SELECT count(*) AS runs,
                    percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
                    percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99,
                    max(ms) AS max
               FROM (SELECT EXTRACT(EPOCH FROM {to} - admitted_at)::float8 * 1000 AS ms
                       FROM execution_requests
                      WHERE {to} IS NOT NULL
                        AND admitted_at >= (SELECT min(admitted_at) FROM execution_requests)
                                           + make_interval(secs => $1)) t"
        )
    };
    let claim = sqlx::query_as(&percentiles("claimed_at"))
        .bind(after)
        .fetch_one(pool)
        .await?;
    let done = sqlx::query_as(&percentiles("finished_at"))
        .bind(after)
        .fetch_one(pool)
        .await?;
    Ok((claim, done))
}

/// The p50 and p99, in ms (NaN when there is none), of each interval over the rows of
/// `r`, which `with` defines.
async fn gaps<const N: usize>(
    pool: &sqlx::PgPool,
    with: &str,
    intervals: [&str; N],
) -> anyhow::Result<[(f64, f64); N]> {
    use sqlx::Row;
    let columns: Vec<String> = intervals
        .iter()
        .map(|interval| {
            let ms = format!("EXTRACT(EPOCH FROM {interval})::float8 * 1000");
            format!(
                "percentile_cont(0.5) WITHIN GROUP (ORDER BY {ms}), percentile_cont(0.99) WITHIN GROUP (ORDER BY {ms})"
            )
        })
        .collect();
    let row = sqlx::query(&format!("{with} SELECT {} FROM r", columns.join(", ")))
        .fetch_one(pool)
        .await?;
    let mut figures = [(f64::NAN, f64::NAN); N];
    for (i, figure) in figures.iter_mut().enumerate() {
        let p50: Option<f64> = row.try_get(2 * i)?;
        let p99: Option<f64> = row.try_get(2 * i + 1)?;
        *figure = (p50.unwrap_or(f64::NAN), p99.unwrap_or(f64::NAN));
    }
    Ok(figures)
}

/// A p50/p99 pair in ms, or `-` when there was nothing to measure.
fn ms((p50, p99): (f64, f64)) -> String {
    if p50.is_nan() {
        "-".to_string()
    } else {
        format!("{p50:.1}/{p99:.0}")
    }
}

fn print_table(all: &[Figures]) {
    println!();
    println!(
        "{:<10} {:>7} {:>6} {:>8} {:>8} {:>22} {:>22} {:>6} {:>7} | {:>12} {:>12} {:>12} {:>12} {:>12}",
        "scenario",
        "workers",
        "runs",
        "wall s",
        "runs/s",
        "adm→claim ms p50/99/max",
        "adm→done ms p50/99/max",
        "failed",
        "msgs",
        "queue",
        "acquire",
        "steps",
        "finish",
        "per step"
    );
    for f in all {
        println!(
            "{:<10} {:>7} {:>6} {:>8.2} {:>8.0} {:>22} {:>22} {:>6} {:>7.2} | {:>12} {:>12} {:>12} {:>12} {:>12}",
            f.label,
            f.workers,
            f.runs,
            f.wall.as_secs_f64(),
            f.runs as f64 / f.wall.as_secs_f64(),
            f.claim_ms.cell(),
            f.done_ms.cell(),
            f.not_completed,
            f.messages_per_run,
            ms(f.breakdown[0]),
            ms(f.breakdown[1]),
            ms(f.breakdown[2]),
            ms(f.breakdown[3]),
            ms(f.breakdown[4]),
        );
    }
    println!(
        "(msgs = messages announced per run, 1 when no run was announced twice; after the bar, p50/p99 in ms of each stage: queue = admission → claim, acquire = claim → first intent, steps = first intent → last receipt, finish = last receipt → completion (0 when it commits with the receipt), per step = one step's intent → receipt)"
    );
}
