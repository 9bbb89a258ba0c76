//! `cairn-bench steps`: what a step costs beyond its own command, end to end on the real
//! binaries: from its intent to its receipt on a durable tree (the step's checkpoint
//! included), read from the journal's timestamps.
//!
//! Two trees: an empty one (steps of `/bin/true`), and the generated 1 GiB tree of
//! `cairn-bench snapshot` in which each step changes 1 % of the files. Beside each, the
//! floor: the same work without Cairn around it (starting `/bin/true`; the snapshot
//! engine's capture of the same change).

use crate::snapshot::{change_one_percent, generate_tree};
use crate::stack::{Stack, StackSettings};
use crate::stats::percentile;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub struct Steps<'a> {
    pub steps: usize,
    pub files: usize,
    pub size_mib: u64,
    pub postgres: &'a str,
}

/// One step's timings from the journal, in milliseconds.
#[derive(sqlx::FromRow)]
struct Timing {
    step_index: i32,
    wall_ms: i64,
    /// Intent written → receipt written.
    intent_to_receipt_ms: f64,
    /// Intent written → the next step's intent written.
    cycle_ms: Option<f64>,
}

impl Steps<'_> {
    pub async fn run(&self) -> anyhow::Result<()> {
        let exe = std::env::current_exe()?;
        println!(
            "steps: per-step overhead (intent → receipt on a durable tree, minus the command's own time), one worker, {} measured steps per tree",
            self.steps
        );
        let trues: Vec<Value> = (0..=self.steps)
            .map(|i| json!({"key": format!("s{i}"), "argv": ["/bin/true"]}))
            .collect();
        let floor = spawn_floor().await?;
        self.scenario(
            "empty tree",
            trues,
            0,
            &format!("floor: starting /bin/true alone, p50 {floor:.2} ms"),
            "",
        )
        .await?;

        let tree = std::env::temp_dir().join(format!(
            "cairn-bench-steps-tree-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        generate_tree(&tree, self.files, self.size_mib)?;
        let floor = engine_floor(&tree).await?;
        let mut steps = vec![json!({
            "key": "copy", "argv": ["sh", "-c", format!("cp -a '{}/.' .", tree.display())],
            "timeout_seconds": 3600
        })];
        steps.extend((1..=self.steps).map(|i| {
            json!({"key": format!("change{i}"),
                   "argv": [exe.to_string_lossy(), "change-one-percent", "."],
                   "timeout_seconds": 3600})
        }));
        steps.push(json!({"key": "last", "argv": ["/bin/true"]}));
        let label = format!(
            "{} MiB tree, {} files, 1% changed per step",
            self.size_mib, self.files
        );
        let result = self
            .scenario(
                &label,
                steps,
                1,
                &format!(
                    "floor: the snapshot engine alone capturing the same 1% change, {floor:.1} ms"
                ),
                // The steps read the generated tree and run this program: both
                // read-only in their sandbox.
                &format!("{},{}", tree.display(), exe.display()),
            )
            .await;
        let _ = std::fs::remove_dir_all(&tree);
        result
    }

    /// Runs one run of `steps`; reports the overhead of the steps from index `from` on
    /// (the last step has no next intent and only closes the measurement).
    async fn scenario(
        &self,
        label: &str,
        steps: Vec<Value>,
        from: i32,
        floor: &str,
        read_only: &str,
    ) -> anyhow::Result<()> {
        let stack = Stack::start(StackSettings {
            postgres: self.postgres,
            workers: 1,
            concurrency: 1,
            // An empty value is refused by the worker: set only when there are paths.
            worker_env: if read_only.is_empty() {
                Vec::new()
            } else {
                vec![("CAIRN_SANDBOX_READ_ONLY".into(), read_only.to_string())]
            },
        })
        .await?;
        let spec = json!({"agent": "bench", "steps": steps,
                          "budgets": {"max_commands": 10_000, "max_wall_seconds": 86_400}});
        let started = Instant::now();
        stack.submit(&[spec]).await?;
        stack.wait_ended(1, Duration::from_secs(3600)).await?;
        let state: String = sqlx::query_scalar("SELECT state FROM execution_requests")
            .fetch_one(&stack.pool)
            .await?;
        anyhow::ensure!(state == "completed", "the run ended {state}");
        let timings: Vec<Timing> = sqlx::query_as(
            "SELECT i.step_index, r.wall_ms,
                    EXTRACT(EPOCH FROM r.finished_at - i.started_at)::float8 * 1000 AS intent_to_receipt_ms,
                    EXTRACT(EPOCH FROM lead(i.started_at) OVER (ORDER BY i.step_index) - i.started_at)::float8 * 1000 AS cycle_ms
               FROM journal_intents i JOIN journal_receipts r USING (request_id, step_key)
              ORDER BY i.step_index",
        )
        .fetch_all(&stack.pool)
        .await?;
        let measured: Vec<&Timing> = timings
            .iter()
            .filter(|t| t.step_index >= from && t.cycle_ms.is_some())
            .collect();
        let mut receipt: Vec<f64> = measured
            .iter()
            .map(|t| t.intent_to_receipt_ms - t.wall_ms as f64)
            .collect();
        let mut cycle: Vec<f64> = measured
            .iter()
            .filter_map(|t| t.cycle_ms.map(|c| c - t.wall_ms as f64))
            .collect();
        let mut command: Vec<f64> = measured.iter().map(|t| t.wall_ms as f64).collect();
        for v in [&mut receipt, &mut cycle, &mut command] {
            v.sort_by(f64::total_cmp);
        }
        println!(
            "  {label} ({} steps, run took {:.1} s):",
            measured.len(),
            started.elapsed().as_secs_f64()
        );
        println!(
            "    intent → receipt, minus the command:      p50 {:>8.2} ms  max {:>8.2} ms",
            percentile(&receipt, 0.5),
            percentile(&receipt, 1.0)
        );
        println!(
            "    intent → next intent, minus the command:  p50 {:>8.2} ms  max {:>8.2} ms",
            percentile(&cycle, 0.5),
            percentile(&cycle, 1.0)
        );
        println!(
            "    the command itself:                       p50 {:>8.2} ms",
            percentile(&command, 0.5)
        );
        println!("    {floor}");
        stack.stop().await
    }
}

/// Starting and reaping `/bin/true`, 50 times: the floor of any step.
async fn spawn_floor() -> anyhow::Result<f64> {
    let mut times = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        let status = tokio::process::Command::new("/bin/true").status().await?;
        anyhow::ensure!(status.success(), "/bin/true failed");
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(percentile(&times, 0.5))
}

/// The snapshot engine alone: a full capture of a copy of the tree, then the capture of
/// a 1 % change against it.
async fn engine_floor(tree: &std::path::Path) -> anyhow::Result<f64> {
    use cairn_snapshot::Repository;
    use cairn_snapshot::{self as snapshot, CaptureRules};
    let work = tree.with_extension("floor");
    let copy = work.join("tree");
    std::fs::create_dir_all(&work)?;
    crate::snapshot::run_shell(
        &format!("cp -a '{}' '{}'", tree.display(), copy.display()),
        &[],
    )?;
    let store = Repository::open(&work.join("store").to_string_lossy())?;
    let rules = CaptureRules::default();
    let (full, _) = snapshot::capture(&store, &copy, &rules, None, uuid::Uuid::new_v4()).await?;
    change_one_percent(&copy)?;
    let started = Instant::now();
    snapshot::capture(
        &store,
        &copy,
        &rules,
        Some(std::sync::Arc::new(full)),
        uuid::Uuid::new_v4(),
    )
    .await?;
    let took = started.elapsed().as_secs_f64() * 1000.0;
    let _ = std::fs::remove_dir_all(&work);
    Ok(took)
}
