//! `cairn-bench sandbox --lifecycle`: a sandbox resource's lifecycle on the real
//! binaries, on the generated tree (1 GiB, 50,000 files by default) with 1 % of its
//! files changed before each measured operation:
//! - a fork: how long the source takes no operation (its capture), and fork → running;
//!   beside it, the restore of a named snapshot of the same tree → running;
//! - a stop (processes ended, the stop snapshot captured), then a resume on another
//!   worker (the first is stopped) → running.
//!
//! First, on small trees: create → first exec (p50 of 20), 20 forks from one capture →
//! all running, and a preview's wake of a stopped sandbox whose service serves the
//! port → its answer (p50 of 10), each beside its goal and the anchors' published
//! figures.

use crate::snapshot::generate_tree;
use crate::stack::{Stack, StackSettings};
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub struct Lifecycle<'a> {
    pub files: usize,
    pub size_mib: u64,
    pub postgres: &'a str,
}

const LONG: Duration = Duration::from_secs(1800);

impl Lifecycle<'_> {
    pub async fn run(&self) -> anyhow::Result<()> {
        let exe = std::env::current_exe()?;
        let tree = std::env::temp_dir().join(format!(
            "cairn-bench-lifecycle-tree-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        generate_tree(&tree, self.files, self.size_mib)?;
        let read_only = format!(
            "{},{}",
            tree.display(),
            exe.parent().context("bench directory")?.display()
        );
        let stack = Stack::start(StackSettings {
            postgres: self.postgres,
            workers: 2,
            concurrency: 4,
            worker_env: vec![
                ("CAIRN_SANDBOX_READ_ONLY".into(), read_only),
                // Room for a source and its 20 forks at once.
                ("CAIRN_SANDBOX_SLOTS".into(), "16".into()),
            ],
        })
        .await?;
        let mut stack = stack;
        let result = self.measure(&mut stack, &tree, &exe).await;
        stack.stop().await?;
        let _ = std::fs::remove_dir_all(&tree);
        result
    }

    async fn measure(
        &self,
        stack: &mut Stack,
        tree: &std::path::Path,
        exe: &std::path::Path,
    ) -> anyhow::Result<()> {
        println!(
            "sandbox lifecycle: {} MiB tree, {} files, 1% of the files changed before each operation; 2 workers",
            self.size_mib, self.files
        );
        let api = Api {
            base: stack.base.clone(),
            token: stack.token.clone(),
            http: stack.http.clone(),
        };
        starts(&api).await?;
        println!();
        let source = api.create().await?;
        api.exec(&source, &format!("cp -a '{}/.' .", tree.display()))
            .await?;
        let change = format!("'{}' change-one-percent .", exe.display());

        // Fork, beside the restore of a named snapshot of the same tree.
        api.exec(&source, &change).await?;
        let named = api
            .post(&format!("/api/v1/sandboxes/{source}/snapshots"), json!({}))
            .await?;
        let snapshot = named["snapshot_id"]
            .as_str()
            .context("snapshot")?
            .to_string();
        api.exec(&source, &change).await?;
        let started = Instant::now();
        let (frozen_ms, fork) = api.fork(&source).await?;
        api.wait(&fork, "running").await?;
        let fork_to_running = started.elapsed();
        let started = Instant::now();
        let restored = api
            .post(&format!("/api/v1/snapshots/{snapshot}/restore"), json!({}))
            .await?;
        let restored = restored["sandbox_id"]
            .as_str()
            .context("restored")?
            .to_string();
        api.wait(&restored, "running").await?;
        let restore_to_running = started.elapsed();

        // Stop, then resume on the other worker.
        api.exec(&source, &change).await?;
        let started = Instant::now();
        api.post(&format!("/api/v1/sandboxes/{source}/stop"), json!({}))
            .await?;
        api.wait(&source, "stopped").await?;
        let stop = started.elapsed();
        let first = worker_of(&stack.pool, &source).await?;
        // Every sandbox of the first worker is stopped so that only the other can take it.
        for other in [&fork, &restored] {
            api.post(&format!("/api/v1/sandboxes/{other}/stop"), json!({}))
                .await?;
        }
        stack.stop_worker(&first)?;
        let started = Instant::now();
        api.post(&format!("/api/v1/sandboxes/{source}/resume"), json!({}))
            .await?;
        api.wait(&source, "running").await?;
        let resume = started.elapsed();
        let second = worker_of(&stack.pool, &source).await?;
        if second == first {
            bail!("the sandbox resumed on the worker that was stopped");
        }

        print_table(
            frozen_ms,
            [fork_to_running, restore_to_running, stop, resume],
        );
        Ok(())
    }
}

/// The middle of the samples.
fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

/// Create → first exec, 20 forks → all running, and a preview's wake of a stopped
/// sandbox, on small trees.
async fn starts(api: &Api) -> anyhow::Result<()> {
    let mut first_exec = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let id = api.create_only(json!({"agent": "bench"})).await?;
        api.exec(&id, "true").await?;
        first_exec.push(started.elapsed());
        api.destroy(&id).await?;
    }

    let source = api.create().await?;
    api.exec(&source, "seq 1000 > numbers.txt").await?;
    let started = Instant::now();
    let forked = api
        .post(
            &format!("/api/v1/sandboxes/{source}/fork"),
            json!({"count": 20}),
        )
        .await?;
    let forks: Vec<String> = forked["sandboxes"]
        .as_array()
        .context("forks")?
        .iter()
        .filter_map(|s| s["sandbox_id"].as_str().map(String::from))
        .collect();
    for fork in &forks {
        api.wait(fork, "running").await?;
    }
    let all_forks = started.elapsed();
    for id in forks.iter().chain([&source]) {
        api.destroy(id).await?;
    }

    let serve = json!({"argv": ["python3", "-m", "http.server", "8080", "--bind", "127.0.0.1",
                                "--directory", "/workspace"]});
    let body = json!({"agent": "bench", "ports": [8080], "services": {"web": serve}});
    let served = api.create_only(body).await?;
    api.wait(&served, "running").await?;
    api.exec(&served, "echo ok > ok.txt").await?;
    let page = format!("/api/v1/sandboxes/{served}/preview/8080/ok.txt");
    api.preview(&page).await?;
    let mut wakes = Vec::new();
    for _ in 0..10 {
        api.post(&format!("/api/v1/sandboxes/{served}/stop"), json!({}))
            .await?;
        api.wait(&served, "stopped").await?;
        let started = Instant::now();
        api.preview(&page).await?;
        wakes.push(started.elapsed());
    }
    api.destroy(&served).await?;

    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    println!("sandbox starts (small trees, 2 workers):");
    println!("| measure | figure | goal | anchors |");
    println!("|---|---|---|---|");
    println!(
        "| create → first exec, p50 of 20 | {} | ≤ 300 ms | Fly Sprites ~1 s, CodeSandbox fork 0.5 s |",
        ms(p50(first_exec))
    );
    println!(
        "| 20 forks from one capture → all running | {} | ≤ 5 s | |",
        ms(all_forks)
    );
    println!(
        "| preview wake of a stopped sandbox (its service restarted) → answer, p50 of 10 | {} | ≤ 2 s | |",
        ms(p50(wakes))
    );
    Ok(())
}

struct Api {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Api {
    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .timeout(LONG)
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("POST {path}: {status}: {body}");
        }
        Ok(body)
    }

    /// Forks `source`: how long its source was frozen, and the fork's id.
    async fn fork(&self, source: &str) -> anyhow::Result<(i64, String)> {
        let forked = self
            .post(&format!("/api/v1/sandboxes/{source}/fork"), json!({}))
            .await?;
        let frozen_ms = forked["source_frozen_ms"].as_i64().unwrap_or_default();
        let fork = forked["sandboxes"][0]["sandbox_id"]
            .as_str()
            .context("fork")?
            .to_string();
        Ok((frozen_ms, fork))
    }

    async fn create(&self) -> anyhow::Result<String> {
        let id = self
            .create_only(json!({"agent": "bench", "always_on": true}))
            .await?;
        self.wait(&id, "running").await?;
        Ok(id)
    }

    /// Creates a sandbox; its id, at once (it is `creating`).
    async fn create_only(&self, body: Value) -> anyhow::Result<String> {
        let created = self.post("/api/v1/sandboxes", body).await?;
        Ok(created["sandbox_id"].as_str().context("id")?.to_string())
    }

    async fn destroy(&self, id: &str) -> anyhow::Result<()> {
        let response = self
            .http
            .delete(format!("{}/api/v1/sandboxes/{id}", self.base))
            .bearer_auth(&self.token)
            .timeout(LONG)
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("DELETE sandbox {id}: {}", response.status());
        }
        Ok(())
    }

    /// GETs a preview until the sandbox's server answers `200` (a `503` asks again).
    async fn preview(&self, path: &str) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let response = self
                .http
                .get(format!("{}{path}", self.base))
                .bearer_auth(&self.token)
                .timeout(LONG)
                .send()
                .await?;
            let status = response.status().as_u16();
            if status == 200 {
                return Ok(());
            }
            if !matches!(status, 502 | 503) || started.elapsed() > Duration::from_secs(60) {
                bail!("preview {path}: {status}: {}", response.text().await?);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn exec(&self, id: &str, script: &str) -> anyhow::Result<()> {
        let receipt = self
            .post(
                &format!("/api/v1/sandboxes/{id}/exec"),
                json!({"argv": ["sh", "-c", script], "timeout_sec": 3600}),
            )
            .await?;
        if receipt["result"]["exit_code"] != 0 {
            bail!("exec {script}: {receipt}");
        }
        Ok(())
    }

    async fn wait(&self, id: &str, state: &str) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let view: Value = self
                .http
                .get(format!("{}/api/v1/sandboxes/{id}", self.base))
                .bearer_auth(&self.token)
                .send()
                .await?
                .json()
                .await?;
            if view["state"] == state && view.get("pending").is_none() {
                return Ok(());
            }
            if view["state"] == "error" || started.elapsed() > LONG {
                bail!("sandbox {id} did not become {state}: {view}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The worker a sandbox runs on.
async fn worker_of(pool: &sqlx::PgPool, sandbox: &str) -> anyhow::Result<String> {
    let worker = sqlx::query_scalar("SELECT worker_id FROM sandboxes WHERE id = $1::uuid")
        .bind(sandbox)
        .fetch_one(pool)
        .await?;
    Ok(worker)
}

/// The figures beside their goals: how long the fork froze its source, then fork,
/// restore, stop and resume, each until its end state.
fn print_table(frozen_ms: i64, [fork_to_running, restore_to_running, stop, resume]: [Duration; 4]) {
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    println!("| measure | figure | goal |");
    println!("|---|---|---|");
    println!(
        "| source frozen during a fork (its capture of 1% changed) | {frozen_ms} ms | ≤ 300 ms |"
    );
    println!("| fork → running | {} | ≤ 1 s |", ms(fork_to_running));
    println!(
        "| restore of a named snapshot → running (the baseline) | {} | |",
        ms(restore_to_running)
    );
    println!(
        "| stop (processes ended, stop snapshot of 1% changed) | {} | |",
        ms(stop)
    );
    println!("| resume on another worker → running | {} | |", ms(resume));
    println!(
        "fork vs restore: {:.2}x the restore's time",
        fork_to_running.as_secs_f64() / restore_to_running.as_secs_f64().max(1e-9)
    );
}
