//! `cairn-bench confine`: what confinement costs a verification check.

use std::time::{Duration, Instant};

/// Starts `/bin/true` `runs` times per mode through the worker's step runner and prints
/// the start-to-reaped time of each mode.
pub async fn run(runs: usize) -> anyhow::Result<()> {
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
                redact: true,
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
