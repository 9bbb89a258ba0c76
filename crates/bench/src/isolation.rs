//! `cairn-bench sandbox`: what the step sandbox costs a step. `/bin/true` is started
//! through the worker's step runner, waited for and its output captured, in each mode:
//! the baseline (a process group, no namespaces), then the sandbox with and without the
//! network, each with the worker's default limits (a cgroup where the host has one).

use cairn_common::run::StepLimits;
use cairn_worker::isolation::{self, Isolation, Mode};
use cairn_worker::step::{self, StepCommand};
use std::time::{Duration, Instant};

pub async fn run(runs: usize) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!(
        "cairn-bench-sandbox-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let (workspace, home) = (dir.join("workspace"), dir.join("home"));
    std::fs::create_dir_all(&workspace)?;
    std::fs::create_dir_all(&home)?;
    let baseline = Isolation::start(settings(Mode::Off, &dir)).map_err(anyhow::Error::msg)?;
    let full = Isolation::start(settings(Mode::Required, &dir)).map_err(anyhow::Error::msg)?;
    println!(
        "sandbox: {runs} starts of /bin/true per mode, each waited for; limits by {}",
        full.report().limits_by()
    );
    let modes: [(&str, &Isolation, bool); 3] = [
        ("baseline: process group, no namespaces", &baseline, true),
        ("sandbox, network: true", &full, true),
        ("sandbox, network: false (checks)", &full, false),
    ];
    // Interleaved, so that whatever else the machine does weighs on every mode alike.
    let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(runs); modes.len()];
    for i in 0..runs {
        for (m, (_, sandbox, network)) in modes.iter().enumerate() {
            let (out, network) = (dir.join(format!("out-{m}-{i}")), *network);
            let command = true_command(sandbox, &workspace, &home, network, out);
            let started = Instant::now();
            let outcome = step::run(
                &command,
                sandbox,
                &tokio_util::sync::CancellationToken::new(),
            )
            .await?;
            times[m].push(started.elapsed());
            anyhow::ensure!(outcome.succeeded(), "/bin/true failed: {outcome:?}");
        }
    }
    let mut p50s = Vec::new();
    for ((name, _, _), times) in modes.iter().zip(times.iter_mut()) {
        times.sort();
        let at = |q: f64| times[((times.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1000.0;
        p50s.push(at(0.5));
        println!(
            "  {name:<40} p50 {:>7.2} ms  p99 {:>7.2} ms",
            at(0.5),
            at(0.99)
        );
    }
    println!(
        "SANDBOX_OVERHEAD: {:.2} ms p50 (network: true), {:.2} ms p50 (network: false); goal under 5 ms",
        p50s[1] - p50s[0],
        p50s[2] - p50s[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The isolation settings of a mode, with everything a step could need allowed.
fn settings(mode: Mode, dir: &std::path::Path) -> isolation::Settings {
    isolation::Settings {
        mode,
        bwrap: "bwrap".into(),
        uid: 1000,
        gid: 1000,
        network_default: true,
        defaults: StepLimits {
            memory_mb: Some(8192),
            pids: Some(4096),
            cpu_seconds: None,
            open_files: Some(65_536),
        },
        read_only: Vec::new(),
        read_write: Vec::new(),
        cgroups: true,
        egress_allow: Vec::new(),
        etc_dir: dir.join(format!("etc-{mode:?}")),
    }
}

/// `/bin/true` in the workspace, with or without the network.
fn true_command(
    sandbox: &Isolation,
    workspace: &std::path::Path,
    home: &std::path::Path,
    network: bool,
    output_base: std::path::PathBuf,
) -> StepCommand {
    StepCommand {
        argv: vec!["/bin/true".into()],
        env: std::collections::BTreeMap::new(),
        place: isolation::Spec {
            workspace: workspace.to_path_buf(),
            cwd: None,
            home: home.to_path_buf(),
            network: cairn_common::egress::Effective::flag(network),
            limits: sandbox.limits(None),
            identity: None,
            volumes: Vec::new(),
        },
        timeout: Duration::from_secs(30),
        output_base,
        live: None,
        max_output: 1024,
        tail_bytes: 128,
        redact: true,
        kill_grace: Duration::from_millis(100),
        input: None,
    }
}
