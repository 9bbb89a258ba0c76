//! The Cairn processes of a chaos run: one scheduler and its workers, started from the
//! binaries next to this one, against the run's own services. Each keeps its log file,
//! so a process can be killed, stopped, continued and started again under its name.

use crate::services::free_port;
use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory of the run (under its scratch directory) that steps may write: where
/// they leave their effects.
pub const SHARED: &str = "shared";
pub const TOKEN: &str = "cairn-chaos-admin-token";

/// The settings every process shares.
pub struct Env {
    pub database: String,
    pub redis: String,
    pub amqp: String,
    pub dir: PathBuf,
}

impl Env {
    fn command(&self, binary: &str, log: &Path) -> anyhow::Result<Command> {
        let exe = std::env::current_exe()?;
        let bin = exe.parent().context("binary directory")?;
        let mut command = Command::new(bin.join(binary));
        let log = File::options().create(true).append(true).open(log)?;
        command
            .env("CAIRN_DATABASE_URL", &self.database)
            .env("CAIRN_REDIS_URL", &self.redis)
            .env("CAIRN_AMQP_URL", &self.amqp)
            .env("CAIRN_ARTIFACTS_URL", self.dir.join("artifacts"))
            .env("CAIRN_LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        Ok(command)
    }
}

/// One process, restartable under the same name.
pub struct Process {
    pub name: String,
    child: Option<Child>,
    command: Box<dyn Fn() -> anyhow::Result<Command> + Send + Sync>,
    ready: Option<String>,
}

impl Process {
    fn start(
        name: String,
        command: Box<dyn Fn() -> anyhow::Result<Command> + Send + Sync>,
        ready: Option<String>,
    ) -> anyhow::Result<Process> {
        let mut process = Process {
            name,
            child: None,
            command,
            ready,
        };
        process.spawn()?;
        Ok(process)
    }

    pub fn spawn(&mut self) -> anyhow::Result<()> {
        let child = (self.command)()?
            .spawn()
            .with_context(|| format!("starting {}", self.name))?;
        self.child = Some(child);
        if let Some(url) = &self.ready {
            wait_ready(url, Duration::from_secs(60))?;
        }
        Ok(())
    }

    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let child = self.child.as_ref().context("not running")?;
        let pid = i32::try_from(child.id()).context("pid")?;
        kill(Pid::from_raw(pid), signal)?;
        Ok(())
    }

    /// Waits for the process to exit (after a signal), up to `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while let Some(child) = self.child.as_mut() {
            if let Ok(Some(_)) = child.try_wait() {
                self.child = None;
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn wait_ready(url: &str, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let ok = Command::new("curl")
            .args(["-fsS", "-o", "/dev/null", "--max-time", "2", url])
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{url} never answered within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub struct Fleet {
    pub base: String,
    pub scheduler: Process,
    pub workers: Vec<Process>,
}

impl Fleet {
    pub fn start(env: &Env, workers: usize, concurrency: u32) -> anyhow::Result<Fleet> {
        let env = std::sync::Arc::new(Env {
            database: env.database.clone(),
            redis: env.redis.clone(),
            amqp: env.amqp.clone(),
            dir: env.dir.clone(),
        });
        let port = free_port()?;
        let base = format!("http://127.0.0.1:{port}");
        let scheduler = {
            let env = env.clone();
            Process::start(
                "scheduler".into(),
                Box::new(move || {
                    let mut command =
                        env.command("cairn-scheduler", &env.dir.join("scheduler.log"))?;
                    command
                        .env("CAIRN_LISTEN", format!("127.0.0.1:{port}"))
                        .env("CAIRN_BOOTSTRAP_ADMIN_TOKEN", TOKEN);
                    Ok(command)
                }),
                Some(format!("{base}/healthz")),
            )?
        };
        let mut fleet = Fleet {
            base,
            scheduler,
            workers: Vec::new(),
        };
        for i in 0..workers {
            let name = format!("w{}", i + 1);
            let metrics = free_port()?;
            let env = env.clone();
            let id = name.clone();
            let worker = Process::start(
                name,
                Box::new(move || {
                    let log = env.dir.join(format!("{id}.log"));
                    let mut command = env.command("cairn-worker", &log)?;
                    command
                        .env("CAIRN_WORKER_ID", &id)
                        .env("CAIRN_METRICS_LISTEN", format!("127.0.0.1:{metrics}"))
                        .env("CAIRN_WORKER_CONCURRENCY", concurrency.to_string())
                        .env(
                            "CAIRN_WORKSPACES_DIR",
                            env.dir.join(format!("workspaces-{id}")),
                        )
                        .env("CAIRN_SANDBOX_READ_WRITE", env.dir.join(SHARED))
                        .env("CAIRN_DRAIN_SECONDS", "10")
                        .env("CAIRN_KILL_GRACE_SECONDS", "2");
                    Ok(command)
                }),
                Some(format!("http://127.0.0.1:{metrics}/healthz")),
            )?;
            fleet.workers.push(worker);
        }
        Ok(fleet)
    }
}
