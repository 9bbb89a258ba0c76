//! A scheduler and workers started from the binaries next to this one, on a fresh
//! database, queue prefix and Redis prefix; torn down (database and queues dropped) at
//! the end.

use anyhow::{bail, Context};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Processes {
    /// SIGTERM to each, then waits for each; the list is empty after.
    fn stop(&mut self) {
        for child in &mut self.0 {
            // SIGTERM via kill(1) keeps this crate free of unsafe code.
            // One stopped already (`stop_worker`) is gone: say nothing about it.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .stderr(Stdio::null())
                .status();
        }
        for child in &mut self.0 {
            let _ = child.wait();
        }
        self.0.clear();
    }
}

fn bin_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(exe.parent().context("binary directory")?.to_path_buf())
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Where a process's log goes: with `CAIRN_BENCH_LOGS=DIR`, to `DIR/<name>.log` (at
/// `RUST_LOG`, or `info`), to explain a figure; otherwise warnings only, and nowhere,
/// since logging would cost the figures.
fn log_to(cmd: &mut Command, name: &str) -> anyhow::Result<()> {
    match std::env::var_os("CAIRN_BENCH_LOGS").map(PathBuf::from) {
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            let file = std::fs::File::create(dir.join(format!("{name}.log")))?;
            let level = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
            cmd.env("RUST_LOG", level).stderr(file);
        }
        None => {
            cmd.env("RUST_LOG", "warn").stderr(Stdio::null());
        }
    }
    Ok(())
}

/// What a stack is made of.
pub struct StackSettings<'a> {
    pub postgres: &'a str,
    pub workers: usize,
    pub concurrency: u32,
    /// Extra environment of every worker.
    pub worker_env: Vec<(String, String)>,
}

pub struct Stack {
    pub base: String,
    /// The workers' ids, in the order of `processes` after the scheduler.
    worker_ids: Vec<String>,
    pub token: String,
    pub http: reqwest::Client,
    pub pool: sqlx::PgPool,
    /// Scratch space: workspaces, artifacts.
    pub work: PathBuf,
    postgres: String,
    database: String,
    prefix: String,
    processes: Processes,
    /// Transactions the bench itself made on the stack's database (waiting for runs),
    /// which a scenario's cost leaves out.
    own_transactions: std::sync::atomic::AtomicU64,
}

impl Stack {
    pub async fn start(settings: StackSettings<'_>) -> anyhow::Result<Stack> {
        let bin = bin_dir()?;
        let stamp = uuid::Uuid::new_v4().simple().to_string();
        let database = format!("cairn_bench_{}", &stamp[..12]);
        let postgres = settings.postgres.trim_end_matches('/').to_string();
        let database_url = format!("{postgres}/{database}");
        let prefix = format!("bench-{}.", &stamp[..12]);
        let work = std::env::temp_dir().join(format!("cairn-bench-{}", &stamp[..12]));
        let token = format!("bench-admin-{stamp}");
        let port = free_port()?;
        let common = |cmd: &mut Command, name: &str| -> anyhow::Result<()> {
            cmd.env("CAIRN_DATABASE_URL", &database_url)
                .env("CAIRN_QUEUE_PREFIX", &prefix)
                .env("CAIRN_REDIS_PREFIX", &prefix)
                .env("CAIRN_LOG_FORMAT", "json")
                .stdout(Stdio::null());
            log_to(cmd, name)
        };
        let mut processes = Processes(Vec::new());
        let mut worker_ids = Vec::new();
        let mut scheduler = Command::new(bin.join("cairn-scheduler"));
        common(&mut scheduler, "cairn-scheduler")?;
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
        let url = format!("{base}/readyz");
        wait_started(&mut processes.0[0], &http, &url, "cairn-scheduler").await?;
        let mut metrics_ports = Vec::new();
        let sandbox_slots = sandbox_slots(&settings.worker_env);
        for i in 0..settings.workers {
            let metrics = free_port()?;
            metrics_ports.push(metrics);
            let mut worker = Command::new(bin.join("cairn-worker"));
            common(&mut worker, &format!("bench-{i}"))?;
            worker
                .env("CAIRN_WORKER_ID", format!("bench-{i}"))
                .env("CAIRN_METRICS_LISTEN", format!("127.0.0.1:{metrics}"))
                .env("CAIRN_WORKER_CONCURRENCY", settings.concurrency.to_string())
                .env(
                    "CAIRN_DATABASE_MAX_CONNECTIONS",
                    (settings.concurrency + sandbox_slots + 4).to_string(),
                )
                .env("CAIRN_WORKSPACES_DIR", work.join(format!("workspaces-{i}")))
                .env("CAIRN_ARTIFACTS_URL", work.join("artifacts"))
                .envs(settings.worker_env.iter().map(|(k, v)| (k, v)));
            processes
                .0
                .push(worker.spawn().context("starting cairn-worker")?);
            worker_ids.push(format!("bench-{i}"));
        }
        // A worker that exits at start (its output is not kept) would leave the bench
        // waiting for runs nobody takes: each must answer before anything is submitted.
        for (i, port) in metrics_ports.into_iter().enumerate() {
            let url = format!("http://127.0.0.1:{port}/readyz");
            wait_started(&mut processes.0[i + 1], &http, &url, &worker_ids[i]).await?;
        }
        let pool = sqlx::PgPool::connect(&database_url).await?;
        Ok(Stack {
            base,
            worker_ids,
            token,
            http,
            pool,
            work,
            postgres,
            database,
            prefix,
            processes,
            own_transactions: Default::default(),
        })
    }

    /// Submits runs in one batch; returns their run ids.
    pub async fn submit(&self, runs: &[serde_json::Value]) -> anyhow::Result<Vec<String>> {
        let response = self
            .http
            .post(format!("{}/api/v1/runs/batch", self.base))
            .bearer_auth(&self.token)
            .json(&serde_json::json!({ "runs": runs }))
            .send()
            .await?;
        if response.status().as_u16() != 201 {
            bail!("batch submission failed: {}", response.text().await?);
        }
        let body: serde_json::Value = response.json().await?;
        Ok(body["run_ids"]
            .as_array()
            .map(|ids| {
                ids.iter()
                    .filter_map(|r| r.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Waits until `count` requests ended (completed or failed), up to `timeout`.
    pub async fn wait_ended(&self, count: usize, timeout: Duration) -> anyhow::Result<()> {
        let started = std::time::Instant::now();
        loop {
            let done: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) {} FROM execution_requests WHERE state IN ('completed', 'failed', 'needs_reconciliation', 'stopped_at_checkpoint', 'cancelled')",
                crate::meter::OWN
            ))
            .fetch_one(&self.pool)
            .await?;
            self.own_transactions
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if done as usize >= count {
                return Ok(());
            }
            if started.elapsed() > timeout {
                bail!("only {done} of {count} runs ended within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops one worker (SIGTERM, then waits for it).
    pub fn stop_worker(&mut self, id: &str) -> anyhow::Result<()> {
        let index = self
            .worker_ids
            .iter()
            .position(|w| w == id)
            .context("no such worker")?;
        let child = &mut self.processes.0[index + 1];
        Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()?;
        child.wait()?;
        Ok(())
    }

    /// The database the stack runs on.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// The transactions the bench made on the stack's database so far.
    pub fn own_transactions(&self) -> u64 {
        self.own_transactions
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The scheduler's process id and the workers'.
    pub fn pids(&self) -> (u32, Vec<u32>) {
        let mut pids = self.processes.0.iter().map(Child::id);
        let scheduler = pids.next().unwrap_or(0);
        (scheduler, pids.collect())
    }

    /// Stops the scheduler and the workers and closes the bench's connections, keeping
    /// the database: their backends exit, and with them flush their statistics.
    /// `reconnect` opens the bench's pool again.
    pub async fn halt(&mut self) {
        self.pool.close().await;
        self.processes.stop();
    }

    pub async fn reconnect(&mut self) -> anyhow::Result<()> {
        self.pool = sqlx::PgPool::connect(&format!("{}/{}", self.postgres, self.database)).await?;
        Ok(())
    }

    /// Stops the processes and drops the database, queues and scratch space.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.pool.close().await;
        drop(self.processes);
        let admin = sqlx::PgPool::connect(&format!("{}/postgres", self.postgres)).await?;
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.database
        ))
        .execute(&admin)
        .await?;
        for queue in [
            "runs",
            "continuations",
            "verifications",
            "sandboxes",
            "dead",
        ] {
            let _ = Command::new("rabbitmqctl")
                .args([
                    "-q",
                    "delete_queue",
                    &format!("{}cairn.{queue}", self.prefix),
                ])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.work);
        Ok(())
    }
}

/// Waits until a process of the stack answers 200 at `url`, failing at once if it exits.
async fn wait_started(
    child: &mut Child,
    http: &reqwest::Client,
    url: &str,
    name: &str,
) -> anyhow::Result<()> {
    for _ in 0..240 {
        if let Some(status) = child.try_wait()? {
            bail!("{name} exited at start ({status}); run it by hand with the same environment to see why");
        }
        if let Ok(response) = http.get(url).send().await {
            if response.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("{name}: {url} never answered 200")
}

/// A worker's sandbox slots as `env` sets them (its default is 4): its pool must hold a
/// connection per job and sandbox slot, and four for its keepers.
fn sandbox_slots(env: &[(String, String)]) -> u32 {
    env.iter()
        .find(|(name, _)| name == "CAIRN_SANDBOX_SLOTS")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(4)
}
