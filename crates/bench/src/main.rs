//! `cairn-bench`: measures Cairn on the local services and prints the figures.
//!
//! `cairn-bench pipeline` starts a scheduler and W workers (the binaries next to this
//! one), submits N runs through the batch API, waits until every run completed, and
//! prints end-to-end runs per second and admission→claim latency p50/p99, for runs with
//! no steps (the pipeline's own cost) and runs with one `/bin/true` step.
//!
//! `cairn-bench snapshot` times, on one tree: full capture, capture after 1% of the files
//! changed, and restore — beside `tar | zstd -1 -T0`, `zstd -d | tar -x`, and restic's
//! backup, incremental backup and restore when restic is installed.

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
    /// One reaper sweep over a table of snapshot rows, a tenth of them due.
    Reaper {
        /// Snapshot rows.
        #[arg(long, default_value_t = 1_000_000)]
        rows: i64,
        /// Rows per batch.
        #[arg(long, default_value_t = 1000)]
        batch: i64,
        /// PostgreSQL server (a fresh database is created on it).
        #[arg(
            long,
            env = "CAIRN_BENCH_POSTGRES",
            default_value = "postgres://postgres@127.0.0.1:5432"
        )]
        postgres: String,
    },
    /// What confinement costs a verification check: the same command started in its own
    /// network namespace (loopback up, capabilities dropped) and without.
    Confine {
        /// Commands per mode.
        #[arg(long, default_value_t = 500)]
        runs: usize,
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
        Bench::Reaper {
            rows,
            batch,
            postgres,
        } => reaper_bench(rows, batch, &postgres).await?,
        Bench::Snapshot {
            tree,
            files,
            size_mib,
        } => snapshot_bench(tree, files, size_mib).await?,
        Bench::Confine { runs } => confine_bench(runs).await?,
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

fn run_shell(script: &str, env: &[(&str, &str)]) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let status = Command::new("sh")
        .arg("-c")
        .arg(script)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        bail!("`{script}` failed: {status}");
    }
    Ok(started.elapsed())
}

/// A generated tree: mostly source-like text, some incompressible binaries.
fn generate_tree(root: &std::path::Path, files: usize, size_mib: u64) -> anyhow::Result<()> {
    let total = size_mib * 1024 * 1024;
    let per_file = (total / files.max(1) as u64).max(1);
    let words: Vec<&str> = "fn let match impl struct pub use crate self async await return if else for while loop \
        value error result option some none string vector map config request worker lease epoch journal"
        .split_whitespace()
        .collect();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for i in 0..files {
        let dir = root.join(format!("d{:03}/s{:02}", i % 250, (i / 250) % 20));
        std::fs::create_dir_all(&dir)?;
        let size = (per_file / 2 + next() % per_file.max(1)) as usize;
        let binary = i % 10 < 3;
        let mut data = Vec::with_capacity(size);
        if binary {
            while data.len() < size {
                data.extend_from_slice(&next().to_le_bytes());
            }
        } else {
            while data.len() < size {
                data.extend_from_slice(words[(next() % words.len() as u64) as usize].as_bytes());
                data.push(if next() % 12 == 0 { b'\n' } else { b' ' });
            }
        }
        data.truncate(size);
        std::fs::write(
            dir.join(format!("f{i}.{}", if binary { "bin" } else { "rs" })),
            &data,
        )?;
    }
    Ok(())
}

fn change_one_percent(root: &std::path::Path) -> anyhow::Result<usize> {
    let mut changed = 0;
    for (i, entry) in walkdir_files(root)?.into_iter().enumerate() {
        if i % 100 == 0 {
            let mut bytes = std::fs::read(&entry)?;
            bytes.extend_from_slice(b"\n// changed\n");
            std::fs::write(&entry, bytes)?;
            changed += 1;
        }
    }
    Ok(changed)
}

fn walkdir_files(root: &std::path::Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.path());
        for entry in entries {
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    Ok(out)
}

fn line(label: &str, took: Duration, bytes: u64) {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    println!(
        "{label:>42}: {:>7.2} s  ({:.0} MiB/s)",
        took.as_secs_f64(),
        mib / took.as_secs_f64().max(1e-9)
    );
}

async fn snapshot_bench(tree: Option<PathBuf>, files: usize, size_mib: u64) -> anyhow::Result<()> {
    use cairn_common::snapshot::{self, CaptureRules};
    use cairn_common::store::ArtifactStore;
    let work = std::env::temp_dir().join(format!(
        "cairn-bench-snap-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    std::fs::create_dir_all(&work)?;
    let src = work.join("tree");
    match &tree {
        Some(dir) => {
            run_shell(
                &format!("cp -a '{}' '{}'", dir.display(), src.display()),
                &[],
            )?;
        }
        None => generate_tree(&src, files, size_mib)?,
    }
    let files_in_tree = walkdir_files(&src)?;
    let bytes: u64 = files_in_tree
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let count = files_in_tree.len();
    println!(
        "snapshot: {count} files, {:.0} MiB, {} cores; page cache warm for every tool",
        bytes as f64 / 1048576.0,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    let s = src.display();
    let w = work.display();

    // Every figure includes making its output durable (sync), as a snapshot must be.
    run_shell("sync", &[])?;
    let tar = run_shell(
        &format!("tar -C '{s}' -cf - . | zstd -q -1 -T0 -o '{w}/tree.tar.zst' && sync"),
        &[],
    )?;
    line("tar | zstd -1 -T0 (+ sync)", tar, bytes);
    let store = ArtifactStore::open(&work.join("store").to_string_lossy())?;
    let rules = CaptureRules::default();
    run_shell("sync", &[])?;
    let started = Instant::now();
    let (full, stats) = snapshot::capture(&store, &src, &rules, None, uuid::Uuid::new_v4()).await?;
    // Shared with the next capture, as a worker shares its last manifest.
    let full = std::sync::Arc::new(full);
    line(
        "cairn full capture (durable, syncfs)",
        started.elapsed(),
        bytes,
    );
    println!(
        "{:>42}  {} chunks in {} packs, {:.0} MiB stored",
        "",
        stats.chunks_new,
        stats.packs_new,
        stats.bytes_uploaded as f64 / 1048576.0
    );

    let restic = Command::new("restic")
        .arg("version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let repo = format!("{w}/restic");
    let restic_env = [
        ("RESTIC_PASSWORD", "bench"),
        ("RESTIC_REPOSITORY", repo.as_str()),
    ];
    if restic {
        run_shell("restic init -q", &restic_env)?;
        line(
            "restic backup (+ sync)",
            run_shell(&format!("restic backup -q '{s}' && sync"), &restic_env)?,
            bytes,
        );
    }

    let changed = change_one_percent(&src)?;
    run_shell("sync", &[])?;
    println!("{:>42}  changed {changed} files (1%)", "");
    let started = Instant::now();
    let (_, inc) = snapshot::capture(
        &store,
        &src,
        &rules,
        Some(full.clone()),
        uuid::Uuid::new_v4(),
    )
    .await?;
    let incremental = started.elapsed();
    line("cairn capture after 1% changed", incremental, bytes);
    println!(
        "{:>42}  {} files re-read, {} new chunks",
        "",
        inc.files - inc.files_unchanged,
        inc.chunks_new
    );
    if restic {
        run_shell("sync", &[])?;
        let took = run_shell(&format!("restic backup -q '{s}' && sync"), &restic_env)?;
        line("restic incremental backup (+ sync)", took, bytes);
        println!(
            "{:>42}  cairn is {:.1}x faster",
            "",
            took.as_secs_f64() / incremental.as_secs_f64().max(1e-9)
        );
    }

    // Restores are shown with and without the final sync: the sync (the disk writing a
    // 1 GiB tree back) varies several-fold from run to run on a shared disk.
    run_shell("sync", &[])?;
    let started = Instant::now();
    snapshot::restore(&store, &full, &work.join("restored")).await?;
    let restored = started.elapsed();
    let synced = run_shell("sync", &[])?;
    line("cairn restore (verified, + sync)", restored + synced, bytes);
    println!(
        "{:>42}  {:.2} s restoring, {:.2} s sync",
        "",
        restored.as_secs_f64(),
        synced.as_secs_f64()
    );
    std::fs::create_dir_all(work.join("untarred"))?;
    run_shell("sync", &[])?;
    let untarred = run_shell(
        &format!("zstd -q -d -c '{w}/tree.tar.zst' | tar -C '{w}/untarred' -xf -"),
        &[],
    )?;
    let synced = run_shell("sync", &[])?;
    line("zstd -d | tar -x (+ sync)", untarred + synced, bytes);
    println!(
        "{:>42}  {:.2} s extracting, {:.2} s sync",
        "",
        untarred.as_secs_f64(),
        synced.as_secs_f64()
    );
    if restic {
        line(
            "restic restore (+ sync)",
            run_shell(
                &format!("restic restore -q latest --target '{w}/restic-out' && sync"),
                &restic_env,
            )?,
            bytes,
        );
    } else {
        println!(
            "{:>42}  restic is not installed; its figures are skipped",
            ""
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

async fn reaper_bench(rows: i64, batch: i64, postgres: &str) -> anyhow::Result<()> {
    let stamp = uuid::Uuid::new_v4().simple().to_string();
    let database = format!("cairn_bench_{}", &stamp[..12]);
    let server = postgres.trim_end_matches('/');
    let admin = sqlx::PgPool::connect(&format!("{server}/postgres")).await?;
    sqlx::query(&format!("CREATE DATABASE \"{database}\""))
        .execute(&admin)
        .await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&format!("{server}/{database}"))
        .await?;
    cairn_common::db::migrate(&pool).await?;
    let store = std::env::temp_dir().join(format!("cairn-bench-reaper-{}", &stamp[..12]));
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
    sqlx::query(&format!(
        "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
    ))
    .execute(&admin)
    .await?;
    let _ = std::fs::remove_dir_all(&store);
    Ok(())
}

/// Starts `/bin/true` `runs` times per mode through the worker's step runner and prints
/// the start-to-reaped time of each mode.
async fn confine_bench(runs: usize) -> anyhow::Result<()> {
    use cairn_worker::step::{self, StepCommand};
    let dir = std::env::temp_dir().join(format!(
        "cairn-bench-confine-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir)?;
    if !cairn_worker::confine::available() {
        anyhow::bail!("this host cannot create network namespaces (CAP_SYS_ADMIN is needed)");
    }
    println!("confine: {runs} starts of /bin/true per mode, each waited for");
    for confined in [false, true] {
        let mut times = Vec::with_capacity(runs);
        for i in 0..runs {
            let command = StepCommand {
                argv: vec!["/bin/true".into()],
                env: std::collections::BTreeMap::new(),
                cwd: dir.clone(),
                timeout: Duration::from_secs(30),
                output_base: dir.join(format!("{confined}-{i}")),
                max_output: 1024,
                tail_bytes: 128,
                kill_grace: Duration::from_millis(100),
                isolate_network: confined,
            };
            let started = Instant::now();
            let outcome = step::run(&command, &tokio_util::sync::CancellationToken::new()).await?;
            times.push(started.elapsed());
            anyhow::ensure!(outcome.succeeded(), "/bin/true failed: {outcome:?}");
        }
        times.sort();
        let mean = times.iter().sum::<Duration>() / u32::try_from(runs.max(1)).unwrap_or(1);
        let at = |q: f64| times[((times.len() as f64 - 1.0) * q) as usize];
        println!(
            "  {:<34} mean {:>7.2} ms  p50 {:>7.2} ms  p99 {:>7.2} ms",
            if confined {
                "confined (netns, no capabilities)"
            } else {
                "unconfined"
            },
            mean.as_secs_f64() * 1000.0,
            at(0.5).as_secs_f64() * 1000.0,
            at(0.99).as_secs_f64() * 1000.0
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
