//! The queues people would pick instead, measured in the same run as Cairn: each peer
//! is a program under `crates/bench/peers/<name>/run` that installs or builds its pinned
//! packages from the package registries on first use (it says so) and prints one line
//! `PEER <name> (<setup>): N jobs in S s: R jobs/s`.

use anyhow::{bail, Context};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// One peer's figure.
pub struct Peer {
    /// The peer's own description line.
    pub line: String,
    pub jobs_per_second: f64,
}

/// A peer queue.
#[derive(Clone, Copy)]
pub enum Queue {
    /// Celery 5 on RabbitMQ: late acks, publisher confirms, prefork workers.
    Celery,
    /// apalis-postgres 1.0: PostgreSQL as the queue, workers in one process.
    Apalis,
}

/// What each peer job starts before its durable insert.
#[derive(Clone, Copy, PartialEq)]
pub enum Process {
    /// `/bin/true`, plainly.
    Plain,
    /// `/bin/true` in bubblewrap, each namespace fresh.
    Bwrap,
}

impl Queue {
    pub fn name(self) -> &'static str {
        match self {
            Queue::Celery => "celery",
            Queue::Apalis => "apalis",
        }
    }

    /// The database the peer makes (and, with `keep_database`, leaves for the caller).
    pub fn database(self) -> &'static str {
        match self {
            Queue::Celery => "cairn_peer_celery",
            Queue::Apalis => "cairn_peer_apalis",
        }
    }
}

impl Process {
    /// How the table names it.
    pub fn label(self) -> &'static str {
        match self {
            Process::Plain => "plain",
            Process::Bwrap => "bubblewrap",
        }
    }

    pub fn flag(self) -> &'static str {
        match self {
            Process::Plain => "plain",
            Process::Bwrap => "bwrap",
        }
    }
}

/// Where the peer programs are: `CAIRN_BENCH_PEERS` or this crate's `peers` directory.
fn peers_dir() -> PathBuf {
    std::env::var_os("CAIRN_BENCH_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/peers")))
}

/// Runs one peer: `jobs` jobs, each starting `process` and then committing one
/// PostgreSQL insert. Celery runs `concurrency` prefork processes; apalis runs 2 workers
/// of `concurrency` jobs. With `keep_database`, the peer's database stays for the
/// caller to read and drop.
pub fn run(
    queue: Queue,
    jobs: usize,
    concurrency: usize,
    process: Process,
    keep_database: bool,
    postgres: &str,
) -> anyhow::Result<Peer> {
    let script = peers_dir().join(queue.name()).join("run");
    let postgres = postgres.trim_end_matches('/');
    let mut cmd = Command::new("bash");
    cmd.arg(&script)
        .args(["--jobs", &jobs.to_string()])
        .args(["--concurrency", &concurrency.to_string()])
        .args(["--process", process.flag()]);
    match queue {
        Queue::Celery => cmd.args(["--postgres", &format!("{postgres}/postgres")]),
        Queue::Apalis => cmd.args(["--workers", "2", "--postgres", postgres]),
    };
    if keep_database {
        cmd.arg("--keep-database");
    }
    let output = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!("{} failed ({}): {stdout}", script.display(), output.status);
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("PEER "))
        .with_context(|| format!("{} printed no PEER line: {stdout}", script.display()))?;
    parse(line)
}

/// Installs or builds a peer (what its script does on first use), outside any
/// measurement: the script with `--help`.
pub fn prepare(queue: Queue) -> anyhow::Result<()> {
    let script = peers_dir().join(queue.name()).join("run");
    let status = Command::new("bash")
        .arg(&script)
        .arg("--help")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    if !status.success() {
        bail!(
            "{} --help failed ({status}): the peer could not be installed or built",
            script.display()
        );
    }
    Ok(())
}

/// The rate from `…: R jobs/s`.
fn parse(line: &str) -> anyhow::Result<Peer> {
    let rate = line
        .strip_suffix(" jobs/s")
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|r| r.parse::<f64>().ok())
        .with_context(|| format!("no rate in the peer's line: {line}"))?;
    Ok(Peer {
        line: line.to_string(),
        jobs_per_second: rate,
    })
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn the_rate_is_read_from_the_peer_line() {
        let peer = parse("PEER celery (RabbitMQ, 2 workers): 2000 jobs in 4.87 s: 410 jobs/s")
            .expect("parsed");
        assert_eq!(peer.jobs_per_second, 410.0);
        assert!(parse("PEER celery: nothing").is_err());
    }
}
