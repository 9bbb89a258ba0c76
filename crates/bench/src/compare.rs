//! `cairn-bench pipeline --compare`: Cairn's one-step runs with the step's isolation off
//! and on, beside Celery and apalis-postgres whose jobs each start `/bin/true` plainly
//! and in bubblewrap before their durable insert: one run, one table, with what each
//! cost PostgreSQL and its own processes.

use crate::meter::{process_ticks, Cost, Meter, Statement};
use crate::peers::{self, Process, Queue};
use crate::pipeline::{CpuPerRun, Pipeline, Variant};
use anyhow::Context;

/// One line of the table.
struct Row {
    system: String,
    /// A peer's row, not Cairn's.
    peer: bool,
    process: Process,
    jobs_per_second: f64,
    cost: Cost,
    /// The system's own processes' CPU per job, the jobs' processes included.
    cpu_ms: f64,
}

pub async fn run(pipeline: &Pipeline<'_>) -> anyhow::Result<()> {
    let meter = Meter::connect(pipeline.postgres).await?;
    let workers = pipeline.workers.first().copied().unwrap_or(2);
    let mut rows = Vec::new();
    let mut cairn_cpu = Vec::new();
    for (process, sandbox) in [(Process::Plain, "off"), (Process::Bwrap, "required")] {
        // No network, as the peers' bubblewrap gives none.
        let variant = Variant {
            worker_env: vec![("CAIRN_SANDBOX".into(), sandbox.into())],
            network: Some(false),
        };
        let (figures, metered) = pipeline
            .scenario(1, workers, &variant, Some(&meter))
            .await
            .with_context(|| format!("cairn with CAIRN_SANDBOX={sandbox}"))?;
        let metered = metered.context("a metered scenario has its cost")?;
        if figures.not_completed > 0 {
            anyhow::bail!(
                "cairn with CAIRN_SANDBOX={sandbox}: {} of {} runs did not complete",
                figures.not_completed,
                figures.runs
            );
        }
        let cpu = &metered.cpu;
        rows.push(Row {
            system: format!("cairn ({workers} workers × {})", pipeline.concurrency),
            peer: false,
            process,
            jobs_per_second: figures.runs as f64 / figures.wall.as_secs_f64(),
            cost: metered.cost,
            cpu_ms: cpu.scheduler + cpu.workers + cpu.started,
        });
        print_statements(process, &metered.statements);
        cairn_cpu.push((process, metered.cpu));
    }
    for queue in [Queue::Celery, Queue::Apalis] {
        tokio::task::spawn_blocking(move || peers::prepare(queue)).await??;
        for process in [Process::Plain, Process::Bwrap] {
            rows.push(peer(&meter, queue, process, pipeline).await?);
        }
    }
    print(&rows, &cairn_cpu, pipeline.runs, meter.statements_missing());
    meter.close().await;
    Ok(())
}

/// One peer in one mode, metered: its database is new, so its counters start at 0.
async fn peer(
    meter: &Meter,
    queue: Queue,
    process: Process,
    pipeline: &Pipeline<'_>,
) -> anyhow::Result<Row> {
    let database = queue.database();
    // One a crashed run left would be counted from its own start.
    meter.drop_database(database).await?;
    let before = meter.read(database, false).await?;
    let reaped = process_ticks(std::process::id())?.1;
    // Celery: two prefork processes, one per core, as a Celery user would run here;
    // apalis: two workers of four jobs.
    let (concurrency, system) = match queue {
        Queue::Celery => (2, "celery (2 prefork)".to_string()),
        Queue::Apalis => (4, "apalis-postgres (2 × 4)".to_string()),
    };
    let jobs = pipeline.runs;
    let postgres = pipeline.postgres.to_string();
    let outcome = tokio::task::spawn_blocking(move || {
        peers::run(queue, jobs, concurrency, process, true, &postgres)
    })
    .await?;
    let spent = process_ticks(std::process::id())?.1.saturating_sub(reaped);
    let after = meter.read(database, true).await;
    meter.drop_database(database).await?;
    let peer = outcome?;
    println!("{}", peer.line);
    Ok(Row {
        system,
        peer: true,
        process,
        jobs_per_second: peer.jobs_per_second,
        cost: meter.cost(before, after?, jobs, 0),
        cpu_ms: spent as f64 * meter.ms_per_tick() / jobs as f64,
    })
}

/// Cairn's statements in one mode, each with its calls per run and mean time.
fn print_statements(process: Process, statements: &[Statement]) {
    if statements.is_empty() {
        return;
    }
    let mode = process.label();
    println!("cairn, {mode}: its statements called at least once per two runs, by PostgreSQL's time (calls per run and mean µs, since the stack started):");
    for s in statements {
        println!("  {:>5.2} {:>7.0}  {}", s.calls, s.mean_us, s.text);
    }
}

fn print(rows: &[Row], cairn_cpu: &[(Process, CpuPerRun)], jobs: usize, missing: Option<&str>) {
    let best = |process: Process| {
        rows.iter()
            .filter(|r| r.process == process && r.peer)
            .map(|r| r.jobs_per_second)
            .fold(f64::NAN, f64::max)
    };
    println!();
    println!("compare: {jobs} jobs each, one system after another on this machine; each job starts one /bin/true and records its effect durably");
    println!(
        "{:<26} {:<10} {:>8} {:>10} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "system",
        "process",
        "jobs/s",
        "×best peer",
        "xacts/job",
        "stmts/job",
        "WAL/job",
        "PG ms",
        "own ms"
    );
    for row in rows {
        let ratio = if row.peer {
            String::new()
        } else {
            format!("{:.2}×", row.jobs_per_second / best(row.process))
        };
        let statements = row
            .cost
            .statements
            .map_or("-".into(), |s| format!("{s:.1}"));
        println!(
            "{:<26} {:<10} {:>8.0} {:>10} {:>9.2} {:>9} {:>9.2} {:>8.2} {:>8.2}",
            row.system,
            row.process.label(),
            row.jobs_per_second,
            ratio,
            row.cost.transactions,
            statements,
            row.cost.wal_flushes,
            row.cost.postgres_cpu_ms,
            row.cpu_ms
        );
    }
    println!("(×best peer: against the faster peer starting its processes the same way; xacts and stmts: of the system's own database, BEGIN and COMMIT counted as statements, the bench's and the peer drivers' polling left out, a peer's setup (its table, apalis's migrations) in; WAL: the server's WAL flushes; PG ms: the CPU of every PostgreSQL process; own ms: the CPU of the system's processes, its jobs' processes in, a peer's start (Python, Celery's processes, the driver) in, RabbitMQ's and Redis's out; all per job)");
    if let Some(missing) = missing {
        println!("({missing})");
    }
    for (process, cpu) in cairn_cpu {
        println!(
            "cairn, {}: per run, the workers {:.2} ms of CPU without the processes they started (goal 1 ms), those processes {:.2} ms, the scheduler {:.2} ms",
            process.label(),
            cpu.workers,
            cpu.started,
            cpu.scheduler
        );
    }
    for row in rows.iter().filter(|r| !r.peer) {
        println!(
            "COMPARE cairn {}: {:.0} runs/s, {:.2}× the best peer ({:.0} jobs/s)",
            row.process.label(),
            row.jobs_per_second,
            row.jobs_per_second / best(row.process),
            best(row.process)
        );
    }
}
