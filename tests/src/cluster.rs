//! A scheduler and workers started as real processes, with an admin token and helpers to
//! submit runs and read their state.

use crate::{free_addr, request, wait_for_status, Isolation, Process};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The directory, in the test's scratch space, that steps see (read-write).
const SHARED: &str = "shared";
pub const ADMIN: &str = "e2e-cluster-admin-token";

/// Knobs of a test cluster.
#[derive(Debug, Clone)]
pub struct Settings {
    pub lease_ttl_seconds: u64,
    pub drain_seconds: u64,
    pub kill_grace_seconds: u64,
    pub sweep_interval_seconds: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lease_ttl_seconds: 2,
            drain_seconds: 10,
            kill_grace_seconds: 1,
            sweep_interval_seconds: 0.3,
        }
    }
}

pub struct Worker {
    pub id: String,
    pub process: Process,
    pub addr: SocketAddr,
}

pub struct Cluster {
    pub isolation: Isolation,
    pub settings: Settings,
    pub scheduler: Process,
    pub api: SocketAddr,
    pub workers: Vec<Worker>,
    /// Scratch space of this test: workspaces, artifacts, files steps write.
    pub dir: PathBuf,
    pub pool: sqlx::PgPool,
    /// Extra environment of workers started from now on (it overrides the defaults).
    pub worker_env: Vec<(String, String)>,
}

impl Cluster {
    pub async fn start(label: &str, workers: usize, settings: Settings) -> Cluster {
        Cluster::start_on(Isolation::new(label), label, workers, settings).await
    }

    /// The same, on a database the test prepared first (`Isolation::new`): rows seeded
    /// or settings altered before any binary connects.
    pub async fn start_on(
        isolation: Isolation,
        label: &str,
        workers: usize,
        settings: Settings,
    ) -> Cluster {
        let dir = std::env::temp_dir().join(format!(
            "cairn-e2e-{label}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(dir.join(SHARED)).expect("test dir");
        let api = free_addr();
        let mut env = isolation.env();
        env.push(("CAIRN_LISTEN".into(), api.to_string()));
        env.push(("CAIRN_BOOTSTRAP_ADMIN_TOKEN".into(), ADMIN.into()));
        env.push((
            "CAIRN_SWEEP_INTERVAL_SECONDS".into(),
            settings.sweep_interval_seconds.to_string(),
        ));
        // The overview's samples every second, so a test sees them soon.
        env.push(("CAIRN_OVERVIEW_INTERVAL_SECONDS".into(), "1".into()));
        let mut scheduler = Process::start("cairn-scheduler", &env);
        wait_for_status(&mut scheduler, api, "/readyz", 200, Duration::from_secs(60));
        let pool = sqlx::PgPool::connect(&isolation.database_url)
            .await
            .expect("database");
        let mut cluster = Cluster {
            isolation,
            settings,
            scheduler,
            api,
            workers: Vec::new(),
            dir,
            pool,
            worker_env: Vec::new(),
        };
        for _ in 0..workers {
            cluster.add_worker();
        }
        cluster
    }

    /// Starts one more worker (`w1`, `w2`, … in start order) and waits until it is ready.
    pub fn add_worker(&mut self) -> usize {
        let id = format!("w{}", self.workers.len() + 1);
        self.add_worker_named(&id)
    }

    /// Starts a worker with a given id (a restarted worker keeps its name).
    pub fn add_worker_named(&mut self, id: &str) -> usize {
        self.start_worker(id, true)
    }

    /// Starts a worker `id` armed with the fault points `points` (`CAIRN_FAULT_POINTS`,
    /// as `name[@n],…`), without waiting for it to be ready: it may reach a point and kill
    /// itself first. Workers started later are not armed.
    pub fn add_faulty_worker(&mut self, id: &str, points: &str) -> usize {
        self.worker_env
            .push(("CAIRN_FAULT_POINTS".into(), points.into()));
        let index = self.start_worker(id, false);
        self.worker_env.pop();
        index
    }

    /// Starts a worker without waiting for it to be ready (it may die first, as a
    /// worker meant to reach a crash point does).
    pub fn add_worker_unready(&mut self, id: &str) -> usize {
        self.start_worker(id, false)
    }

    fn start_worker(&mut self, id: &str, wait_ready: bool) -> usize {
        let index = self.workers.len();
        let id = id.to_string();
        let addr = free_addr();
        let mut env = self.isolation.env();
        env.extend([
            ("CAIRN_WORKER_ID".to_string(), id.clone()),
            ("CAIRN_METRICS_LISTEN".to_string(), addr.to_string()),
            (
                "CAIRN_LEASE_TTL_SECONDS".to_string(),
                self.settings.lease_ttl_seconds.to_string(),
            ),
            (
                "CAIRN_DRAIN_SECONDS".to_string(),
                self.settings.drain_seconds.to_string(),
            ),
            (
                "CAIRN_KILL_GRACE_SECONDS".to_string(),
                self.settings.kill_grace_seconds.to_string(),
            ),
            // One directory per worker id (a restarted worker keeps its directory).
            (
                "CAIRN_WORKSPACES_DIR".to_string(),
                self.workspaces(&id).to_string_lossy().into_owned(),
            ),
            (
                "CAIRN_ARTIFACTS_URL".to_string(),
                self.dir.join("artifacts").to_string_lossy().into_owned(),
            ),
            ("CAIRN_WORKER_CONCURRENCY".to_string(), "4".to_string()),
            // Every worker of a cluster writes its snapshots to the one artifacts
            // directory, so each can continue the others' runs.
            ("CAIRN_SNAPSHOTS_SHARED".to_string(), "true".to_string()),
            // Steps and the test meet in one directory; the rest of the test's scratch
            // space (workspaces, artifacts, stores) stays out of the sandbox's view.
            (
                "CAIRN_SANDBOX_READ_WRITE".to_string(),
                self.dir.join(SHARED).to_string_lossy().into_owned(),
            ),
        ]);
        env.extend(self.worker_env.iter().cloned());
        let mut process = Process::start("cairn-worker", &env);
        if wait_ready {
            wait_for_status(&mut process, addr, "/readyz", 200, Duration::from_secs(60));
        }
        self.workers.push(Worker { id, process, addr });
        index
    }

    /// One sweep of a reaper on this cluster's database, with `env` beside its own;
    /// it must end well.
    pub fn reap_once(&self, env: &[(&str, &str)]) {
        let mut all = self.isolation.env();
        all.push(("CAIRN_METRICS_LISTEN".into(), free_addr().to_string()));
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut reaper = Process::start_with_args("cairn-reaper", &all, &["--once"]);
        let done = reaper
            .wait_exit(Duration::from_secs(60))
            .expect("one sweep");
        assert!(done.success(), "{}", reaper.log());
    }

    /// The workspaces directory of the worker `id`.
    pub fn workspaces(&self, id: &str) -> PathBuf {
        self.dir.join(format!("workspaces-{id}"))
    }

    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let response = request(self.api, method, path, Some(ADMIN), body).expect("API call");
        let value = serde_json::from_str(&response.body).unwrap_or(Value::Null);
        (response.status, value)
    }

    /// A step's output as the API serves it (`GET …/steps/{key}/output`): the status and
    /// the body's bytes, exactly.
    pub fn output(&self, run_id: &str, step: &str, stream: &str) -> (u16, Vec<u8>) {
        let path = format!("/api/v1/runs/{run_id}/steps/{step}/output?stream={stream}");
        let token = format!("Authorization: Bearer {ADMIN}");
        let raw = crate::exchange(self.api, "GET", &path, &[token], None, &[]).expect("API call");
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an HTTP head");
        let head = String::from_utf8_lossy(&raw[..split]);
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, raw[split + 4..].to_vec())
    }

    /// `cairnctl`, pointed at this cluster's scheduler, as its admin.
    pub fn cairnctl(&self) -> std::process::Command {
        let mut command = std::process::Command::new(crate::binary("cairnctl"));
        command
            .env("CAIRN_SERVER", format!("http://{}", self.api))
            .env("CAIRN_TOKEN", ADMIN);
        command
    }

    /// Submits a run; returns `(run_id, request_id)`.
    pub fn submit(&self, spec: &Value) -> (String, String) {
        let (status, run) = self.call("POST", "/api/v1/runs", Some(spec));
        assert_eq!(status, 201, "submit failed: {run}");
        (
            run["run_id"].as_str().expect("run id").to_string(),
            run["request_id"].as_str().expect("request id").to_string(),
        )
    }

    /// Admits a checkpoint continuation on `base` (its requests/{request} route), open
    /// for `valid_for` seconds, from the READY candidate; returns its action id.
    pub fn admit_checkpoint(&self, base: &str, valid_for: u64) -> String {
        let (_, candidate) = self.call("GET", &format!("{base}/candidate"), None);
        assert_eq!(candidate["admission"], "READY", "{candidate}");
        let body = json!({
            "version": 1, "candidate_digest": candidate["candidate_digest"], "valid_for_seconds": valid_for,
            "acknowledge_retained_response_consumed_once": true, "acknowledge_no_completed_effect_replay": true,
            "acknowledge_same_request_attempt_and_budgets": true, "acknowledge_finite_ownership_lease": true
        });
        let action = uuid::Uuid::new_v4().simple().to_string();
        let (status, receipt) = self.call("POST", &format!("{base}/actions/{action}"), Some(&body));
        assert_eq!(status, 201, "{receipt}");
        action
    }

    fn read_run(&self, run_id: &str) -> (u16, Value) {
        self.call("GET", &format!("/api/v1/runs/{run_id}"), None)
    }

    pub fn run(&self, run_id: &str) -> Value {
        let (status, run) = self.read_run(run_id);
        assert_eq!(status, 200, "{run}\n{}", self.scheduler.log());
        run
    }

    /// Waits until the run reaches one of `states`, or panics with the logs. A read the
    /// API answers `503 unavailable` ("try again") is polled again, as a client would,
    /// and the scheduler's logged cause goes to the test's output; any other failed read
    /// ends the wait.
    pub fn wait_for_state(&self, run_id: &str, states: &[&str], timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let (status, run) = self.read_run(run_id);
            if status == 503 && run["error"]["code"] == "unavailable" {
                let log = self.scheduler.log();
                let cause = log.lines().rev().find(|l| l.contains("database error"));
                eprintln!("run {run_id}: a read was unavailable, polled again: {cause:?}");
            } else {
                assert_eq!(status, 200, "{run}\n{}", self.scheduler.log());
                if states.iter().any(|s| run["state"] == *s) {
                    return run;
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "run {run_id} never reached {states:?}; it is {run}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `check` holds, or panics with the logs.
    pub fn wait_until(&self, what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        while !check() {
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn journal(&self, run_id: &str) -> Value {
        self.call("GET", &format!("/api/v1/runs/{run_id}/journal"), None)
            .1
    }

    /// Why a request stopped, and the step it waits on: `(stop_reason, reconciliation_step)`.
    pub async fn stop_reason(&self, request_id: &str) -> (Option<String>, Option<String>) {
        sqlx::query_as(
            "SELECT stop_reason, reconciliation_step FROM execution_requests WHERE id = $1::uuid",
        )
        .bind(request_id)
        .fetch_one(&self.pool)
        .await
        .expect("request")
    }

    /// The worker holding a request's lease, per PostgreSQL.
    pub async fn holder(&self, request_id: &str) -> Option<String> {
        sqlx::query_scalar("SELECT lease_owner FROM execution_requests WHERE id = $1::uuid")
            .bind(request_id)
            .fetch_one(&self.pool)
            .await
            .expect("holder")
    }

    /// Waits until a worker other than `other` holds the request; returns it and how
    /// long that took.
    pub async fn wait_for_holder(
        &self,
        request_id: &str,
        other: Option<&str>,
        limit: Duration,
    ) -> (String, Duration) {
        let since = std::time::Instant::now();
        loop {
            match self.holder(request_id).await {
                Some(holder) if Some(holder.as_str()) != other => return (holder, since.elapsed()),
                _ => {}
            }
            assert!(
                since.elapsed() < limit,
                "no new holder of {request_id} in {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn worker_index(&self, id: &str) -> usize {
        self.workers
            .iter()
            .position(|w| w.id == id)
            .expect("known worker")
    }

    /// A counter from a worker's `/metrics`.
    pub fn metric(&self, worker: usize, name: &str) -> f64 {
        let response = crate::http(self.workers[worker].addr, "GET", "/metrics").expect("metrics");
        response
            .body
            .lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Lines of a file steps append to.
    pub fn lines(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.path(name))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    /// A file in the directory steps share with the test.
    pub fn path(&self, name: &str) -> String {
        self.dir
            .join(SHARED)
            .join(name)
            .to_string_lossy()
            .into_owned()
    }

    pub fn logs(&self) -> String {
        let mut out = format!("--- scheduler ---\n{}", tail(&self.scheduler.log()));
        for worker in &self.workers {
            out.push_str(&format!(
                "\n--- {} ---\n{}",
                worker.id,
                tail(&worker.process.log())
            ));
        }
        out
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Every test on a cluster also checks what its binaries logged: ids as 32 hex
/// characters, as the API and the CLI print them.
impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        if std::thread::panicking() {
            return;
        }
        let logs = std::iter::once(&self.scheduler)
            .chain(self.workers.iter().map(|w| &w.process))
            .map(|p| (p.name.clone(), p.log()));
        for (name, log) in logs {
            if let Some(line) = log.lines().find(|l| crate::hyphenated_uuid(l).is_some()) {
                panic!("{name} logged an id as a hyphenated UUID: {line}");
            }
        }
    }
}

/// A step that appends `line` to `file` after sleeping `seconds`.
pub fn append_step(key: &str, file: &str, line: &str, seconds: f64, idempotent: bool) -> Value {
    json!({
        "key": key,
        "argv": ["sh", "-c", format!("sleep {seconds}; echo {line} >> {file}")],
        "idempotent": idempotent,
        "timeout_seconds": 120
    })
}

/// A run spec with the given steps and generous budgets.
pub fn run_spec(steps: Vec<Value>, max_attempts: u32) -> Value {
    json!({
        "agent": "e2e",
        "steps": steps,
        "budgets": {"max_commands": 50, "max_wall_seconds": 3600},
        "max_attempts": max_attempts
    })
}
