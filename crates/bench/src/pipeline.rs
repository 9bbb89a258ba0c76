//! `cairn-bench pipeline`: admission → queue → claim → completion, end to end.

use crate::stack::{Stack, StackSettings};
use serde_json::json;
use std::time::{Duration, Instant};

pub struct Pipeline<'a> {
    pub runs: usize,
    pub workers: usize,
    pub concurrency: u32,
    pub batch: usize,
    pub postgres: &'a str,
}

impl Pipeline<'_> {
    pub async fn run(&self) -> anyhow::Result<()> {
        println!(
            "pipeline: {} runs per scenario, {} workers x {} concurrent jobs, batches of {}",
            self.runs, self.workers, self.concurrency, self.batch
        );
        for (label, steps) in [
            ("no steps", json!([])),
            (
                "one /bin/true step",
                json!([{"key": "true", "argv": ["/bin/true"]}]),
            ),
        ] {
            self.scenario(label, steps).await?;
        }
        Ok(())
    }

    async fn scenario(&self, label: &str, steps: serde_json::Value) -> anyhow::Result<()> {
        let stack = Stack::start(StackSettings {
            postgres: self.postgres,
            workers: self.workers,
            concurrency: self.concurrency,
            worker_env: Vec::new(),
        })
        .await?;
        let runs = self.runs;
        let batch = self.batch.clamp(1, 1000);
        let spec = json!({"agent": "bench", "steps": steps, "budgets": {"max_commands": 10, "max_wall_seconds": 600}});
        let started = Instant::now();
        let mut submitted = 0;
        while submitted < runs {
            let n = batch.min(runs - submitted);
            stack.submit(&vec![spec.clone(); n]).await?;
            submitted += n;
        }
        let admitted_in = started.elapsed();
        stack.wait_ended(runs, Duration::from_secs(600)).await?;
        let wall = started.elapsed();
        let (failed, p50, p99): (i64, f64, f64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state <> 'completed'),
                    percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM claimed_at - admitted_at))::float8,
                    percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM claimed_at - admitted_at))::float8
               FROM execution_requests",
        )
        .fetch_one(&stack.pool)
        .await?;
        println!(
            "{label:>20}: {runs} runs in {:.2}s = {:.0} runs/s end to end (admission alone {:.0} runs/s); admission→claim p50 {:.1} ms, p99 {:.1} ms; {failed} not completed",
            wall.as_secs_f64(),
            runs as f64 / wall.as_secs_f64(),
            runs as f64 / admitted_in.as_secs_f64(),
            p50 * 1000.0,
            p99 * 1000.0,
        );
        stack.stop().await
    }
}
