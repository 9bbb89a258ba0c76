//! The queues people would pick instead, measured in the same run as Cairn: each peer
//! is a script under `crates/bench/peers/<name>/run` that installs its pinned packages
//! from the package registries on first use (it says so) and prints one line
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

/// Where the peer scripts are: `CAIRN_BENCH_PEERS` or this crate's `peers` directory.
fn peers_dir() -> PathBuf {
    std::env::var_os("CAIRN_BENCH_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/peers")))
}

/// Runs the Celery peer: `jobs` jobs, each one durable PostgreSQL insert, through
/// RabbitMQ with late acks and publisher confirms, on `concurrency` prefork workers.
pub fn celery(jobs: usize, concurrency: usize, postgres: &str) -> anyhow::Result<Peer> {
    let script = peers_dir().join("celery/run");
    let output = Command::new("bash")
        .arg(&script)
        .args(["--jobs", &jobs.to_string()])
        .args(["--concurrency", &concurrency.to_string()])
        .args([
            "--postgres",
            &format!("{}/postgres", postgres.trim_end_matches('/')),
        ])
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
