//! The worker: consumes jobs, claims each request under a fenced lease, runs its steps
//! in their sandbox and journals every effect.
//!
//! - [`config`]: its settings.
//! - [`context`]: what every job shares (pool, leases, settings, custody, metrics).
//! - [`error`]: why a job gives up without an outcome.
//! - [`consumer`]: RabbitMQ consumption with bounded concurrency; ack after claim.
//! - [`custody`]: workspace acquisition order, checkpoints that commit a step's receipt
//!   with the snapshot holding its effects, release (capture-before-release).
//! - [`directory`]: the workspaces directory, locked by one worker, and its identity.
//! - [`job`]: the [`job::Job`] handle: claim, a run's plan, and how a job ends.
//! - [`hosting`]: sandboxes (the lifecycle seed) this worker holds: placement, exec and
//!   files, stop and destroy.
//! - [`janitor`]: removes this directory's trees once no hold guards them.
//! - [`fault`]: crash points for tests (debug builds only).
//! - [`keeper`]: the lease keeper that renews, self-fences, notices cancellation and
//!   passes pause requests on.
//! - [`pause`]: pausing a job where it is, after a checkpoint.
//! - [`publication`]: a completed run's result delivered as a patch, with its receipt.
//! - [`step`]: running one command: environment, timeout, limits, output, usage.
//! - [`isolation`]: the step's isolation (namespaces, mount view, network, cgroup,
//!   rlimits) every process of a run or sandbox starts in, and what this host allows
//!   of it. ("Sandbox" means only the sandbox resource, [`hosting`].)
//! - [`verification`]: verification handoffs: frozen checks, confined runs, reuse.
//! - [`scope`]: the digests a check's reuse is bound to (source, lock files, env, runner).
//! - [`workspace`]: the working directory of a request.
//! - [`report`]: the typed final report.
//! - [`metrics`]: the worker's metrics.

pub mod config;
pub mod consumer;
pub mod context;
pub mod custody;
pub mod directory;
pub mod disk;
pub mod error;
pub mod fault;
pub mod hosting;
pub mod interactive;
pub mod isolation;
pub mod janitor;
pub mod job;
pub mod keeper;
pub mod live_output;
pub mod metrics;
pub mod pause;
pub mod preview;
pub mod publication;
pub mod report;
pub mod scope;
pub mod signals;
pub mod step;
pub mod step_output;
pub mod verification;
pub mod workspace;

use anyhow::Context;
use backon::Retryable;
use cairn_common::health::{self, AmqpStatus, Readiness};
use cairn_common::lease::Leases;
use cairn_common::queue::{JobQueue, Topology};
use cairn_common::{component, redis_conn};
pub use config::Config;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Runs until `shutdown`, then drains: no new deliveries, and, where other workers can
/// restore its checkpoints, no new steps (each run is handed back at its next step
/// boundary); running jobs get `drain_seconds` to finish, then are stopped and their
/// requests handed back.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let artifacts_dir = config.artifacts_dir().map_err(anyhow::Error::msg)?;
    let (pool, redis) = connect(&config).await?;
    let (directory, disk, artifacts_dir) = local_state(&config, &artifacts_dir).await?;
    let workspaces_dir = directory.path.clone();
    let disk_report = disk.report(config.run_disk_mb);
    let listener = tokio::net::TcpListener::bind(config.metrics_listen)
        .await
        .with_context(|| format!("binding {}", config.metrics_listen))?;
    let isolation = match start_isolation(&config, &workspaces_dir)? {
        Ok(isolation) => isolation,
        Err(why) => return refuse_work(listener, why, shutdown).await,
    };
    let mut registry = cairn_common::metrics::registry();
    let metrics = metrics::WorkerMetrics::register(&mut registry);
    metrics::register_isolation(&mut registry, &isolation);
    let dependency_gauge = health::DependencyGauge::register(&mut registry);
    let details = ready_details(&isolation, disk_report);
    let registry = Arc::new(registry);
    let worker_id = config.worker_id();
    let ttl = Duration::from_secs(config.lease_ttl_seconds);
    let directory_id = directory.id;
    let (placements, placed) = placements(&config);
    let worker = Arc::new(context::Worker {
        pool: pool.clone(),
        leases: Leases::new(pool.clone(), redis.clone(), &config.redis.redis_prefix, ttl),
        custody: custody::Custody {
            pool: pool.clone(),
            settings: custody_settings(&config, &artifacts_dir, &worker_id).await?,
            directory,
            disk,
            run_disk_mb: config.run_disk_mb,
        },
        settings: job_settings(&config, &worker_id, workspaces_dir, artifacts_dir),
        metrics,
        isolation,
        active: Arc::new(janitor::ActiveRequests::default()),
        draining: shutdown.clone(),
        signals: Arc::new(signals::Signals::default()),
        previews: Arc::new(preview::Previews::default()),
        controls: Arc::new(interactive::Controls::default()),
        placements,
    });
    lapse_previous(&worker.leases, &worker_id).await?;
    let (previews, directory) = (&worker.previews, directory_id);
    announce(&pool, &worker_id, &config, (&listener, previews, directory)).await?;
    let starving = consumer::Starving::default();
    let amqp_status = AmqpStatus::default();
    let jobs = TaskTracker::new();
    let drain = CancellationToken::new();
    let leases = worker.leases.clone();
    let readiness = readiness(&pool, redis, &amqp_status, details, dependency_gauge);
    let probes = probes(&worker, readiness, registry);
    let background = Background::start(&worker, &config, listener, probes, directory_id, &starving);
    let consumers = consumers_of(
        worker.clone(),
        &config,
        (amqp_status, starving),
        &jobs,
        placed,
    );
    tracing::info!(worker_id = %worker_id, listen = %config.metrics_listen, "worker started");

    take_work(worker, consumers, &shutdown, &drain).await;

    let (drain_time, grace) = (config.drain_seconds, config.kill_grace_seconds);
    drain_jobs(
        &jobs,
        &drain,
        Duration::from_secs(drain_time),
        Duration::from_secs(grace),
    )
    .await;
    // Liveness keys still being deleted (each bounded, so this is short).
    leases.settle().await;
    background.stop().await;
    pool.close().await;
    tracing::info!("worker stopped");
    Ok(())
}

/// The probes listener's routes: health and metrics, then what the scheduler asks of
/// this worker's sandboxes (previews; a running exec's input, resize and kill).
fn probes(
    worker: &context::Worker,
    readiness: Readiness,
    registry: Arc<prometheus_client::registry::Registry>,
) -> axum::Router {
    let (previews, controls) = (worker.previews.clone(), worker.controls.clone());
    health::router(readiness, registry)
        .merge(preview::router(previews.clone()))
        .merge(interactive::router(previews, controls))
}

/// Takes work until `shutdown`: deliveries of its queues, and the sandboxes whose
/// volumes are on this worker's disk (in the same sandbox slots).
async fn take_work(
    worker: Arc<context::Worker>,
    consumers: Vec<consumer::Consumer>,
    shutdown: &CancellationToken,
    drain: &CancellationToken,
) {
    let local = worker.placements.clone();
    let running = consumers.into_iter();
    let consuming =
        futures::future::join_all(running.map(|c| c.run(shutdown.clone(), drain.clone())));
    let volumes = async {
        if let Some(local) = local {
            hosting::volumes::run(worker, local, shutdown.clone()).await;
        }
    };
    tokio::join!(consuming, volumes);
}

/// What `/readyz` details: the step sandbox and the disk.
fn ready_details(
    isolation: &isolation::Isolation,
    disk: serde_json::Value,
) -> serde_json::Map<String, serde_json::Value> {
    serde_json::Map::from_iter([
        (
            "sandbox".to_string(),
            serde_json::to_value(isolation.report()).unwrap_or_default(),
        ),
        ("disk".to_string(), disk),
    ])
}

/// The first beat of this process, the slots it offers, where it takes previews and
/// the directory it holds.
async fn announce(
    pool: &sqlx::PgPool,
    worker_id: &str,
    config: &Config,
    (listener, previews, directory): (&tokio::net::TcpListener, &preview::Previews, uuid::Uuid),
) -> anyhow::Result<()> {
    let url = preview_url(config, listener)?;
    let preview = url.as_deref().map(|url| (url, previews.key()));
    cairn_common::heartbeat::beat(pool, worker_id, true, None).await?;
    let (jobs, sandboxes) = (config.concurrency, config.sandbox_slots);
    cairn_common::heartbeat::advertise_slots(pool, worker_id, jobs, sandboxes).await?;
    cairn_common::heartbeat::advertise_previews(pool, worker_id, preview).await?;
    cairn_common::heartbeat::advertise_directory(pool, worker_id, directory).await?;
    Ok(())
}

/// Where the scheduler reaches this worker's previews: `CAIRN_PREVIEW_URL`, else the
/// probes' listener when it has one address (not a wildcard, where it cannot be told).
fn preview_url(
    config: &Config,
    listener: &tokio::net::TcpListener,
) -> anyhow::Result<Option<String>> {
    if let Some(url) = &config.preview_url {
        return Ok(Some(url.trim_end_matches('/').to_string()));
    }
    let bound = listener.local_addr()?;
    if bound.ip().is_unspecified() {
        tracing::warn!(listen = %bound, "CAIRN_PREVIEW_URL is not set and the probes listen on every address: this worker takes no previews");
        return Ok(None);
    }
    Ok(Some(format!("http://{bound}")))
}

/// What `/readyz` reports. A worker serves no traffic: it is ready once started, and
/// retries its services within its leases. Were it unready on their outage, one blip
/// would mark the whole fleet unready at once (stalling rollouts and
/// PodDisruptionBudgets).
fn readiness(
    pool: &sqlx::PgPool,
    redis: redis::aio::ConnectionManager,
    amqp: &AmqpStatus,
    details: serde_json::Map<String, serde_json::Value>,
    gauge: health::DependencyGauge,
) -> Readiness {
    Readiness {
        postgres: Some(pool.clone()),
        redis: Some(redis),
        amqp: Some(amqp.clone()),
        needs: health::Needs::default(),
        details,
        gauge,
        refused: None,
    }
}

/// Starts the step isolation this host allows. Inside, `Err(reason)`: this worker must
/// isolate steps (`CAIRN_SANDBOX=required`) and this host cannot.
fn start_isolation(
    config: &Config,
    workspaces_dir: &std::path::Path,
) -> anyhow::Result<Result<isolation::Isolation, String>> {
    match isolation::Isolation::start(config.isolation(workspaces_dir)) {
        Ok(isolation) => {
            let report = serde_json::to_string(isolation.report()).unwrap_or_default();
            tracing::info!(isolation = %report, "step isolation");
            Ok(Ok(isolation))
        }
        Err(why) if config.sandbox == isolation::Mode::Required => Ok(Err(why)),
        Err(why) => Err(anyhow::Error::msg(why)),
    }
}

/// A worker that must isolate steps (`CAIRN_SANDBOX=required`) on a host that cannot:
/// it takes no work until stopped, and its `/readyz` answers 503 with the reason, so a
/// pod never becomes ready and the orchestrator shows why. Exiting instead would only
/// show a crash loop, with the reason in a log that restarts push away.
async fn refuse_work(
    listener: tokio::net::TcpListener,
    why: String,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    tracing::error!(reason = %why, "taking no work: the step sandbox is required and this host cannot give it");
    let mut registry = cairn_common::metrics::registry();
    let readiness = Readiness {
        gauge: health::DependencyGauge::register(&mut registry),
        refused: Some(why),
        ..Default::default()
    };
    health::serve(
        listener,
        health::router(readiness, Arc::new(registry)),
        shutdown,
    )
    .await
    .context("serving the probes")
}

/// PostgreSQL (migrated if asked) and Redis.
async fn connect(config: &Config) -> anyhow::Result<(sqlx::PgPool, redis::aio::ConnectionManager)> {
    // A worker awaits nothing but PostgreSQL inside a transaction: one idle in it for the
    // heartbeat lapse is stalled, and must not keep its request's row locked (that
    // would block the takeover); a worker that was merely slow retries the write.
    let idle_in_transaction = Some(cairn_common::heartbeat::LAPSE);
    let pool = component::database(
        &config.database,
        config.pool_size(),
        idle_in_transaction,
        config.migrate,
    )
    .await?;
    let redis = redis_conn::connect(&config.redis.redis_url)
        .await
        .context("connecting to Redis")?;
    Ok((pool, redis))
}

/// The consumers of this worker's queues: one of the job queues in its job slots (its
/// status and its waiting are what the probes and heartbeats report), and, when it has
/// sandbox slots, one of sandbox placements in them, which also takes the placements
/// found without the queue (`placed`).
fn consumers_of(
    worker: Arc<context::Worker>,
    config: &Config,
    (status, starving): (AmqpStatus, consumer::Starving),
    jobs: &TaskTracker,
    placed: Option<tokio::sync::mpsc::Receiver<(uuid::Uuid, String)>>,
) -> Vec<consumer::Consumer> {
    let consumer = |queues, slots: u32, status, starving| consumer::Consumer {
        worker: worker.clone(),
        amqp_url: config.amqp.amqp_url.clone(),
        topology: Topology::new(&config.amqp.queue_prefix, config.amqp.delivery_limit),
        queues,
        concurrency: usize::try_from(slots).unwrap_or(1),
        local: None,
        prefetch: config.prefetch(),
        heartbeat_seconds: config.amqp_heartbeat_seconds,
        status,
        jobs: jobs.clone(),
        starving,
    };
    let mut consumers = vec![consumer(
        &JobQueue::JOBS[..],
        config.concurrency,
        status,
        starving,
    )];
    if config.sandbox_slots > 0 {
        // A worker waiting for a sandbox is not evidence that a run is parked elsewhere.
        let own = (AmqpStatus::default(), consumer::Starving::default());
        let mut placements = consumer(&JobQueue::SANDBOXES[..], config.sandbox_slots, own.0, own.1);
        placements.local = placed.map(|p| Arc::new(tokio::sync::Mutex::new(p)));
        consumers.push(placements);
    }
    consumers
}

/// Where the sandboxes placed without the queue go to the sandbox consumer (none on a
/// worker without sandbox slots).
type Placements = (
    Option<tokio::sync::mpsc::Sender<(uuid::Uuid, String)>>,
    Option<tokio::sync::mpsc::Receiver<(uuid::Uuid, String)>>,
);

fn placements(config: &Config) -> Placements {
    if config.sandbox_slots == 0 {
        return (None, None);
    }
    let capacity = usize::try_from(config.sandbox_slots).unwrap_or(1);
    let (sender, receiver) = tokio::sync::mpsc::channel(capacity);
    (Some(sender), Some(receiver))
}

/// What every job of this worker shares of its settings.
fn job_settings(
    config: &Config,
    worker_id: &str,
    workspaces_dir: std::path::PathBuf,
    artifacts_dir: std::path::PathBuf,
) -> context::JobSettings {
    context::JobSettings {
        worker_id: worker_id.to_string(),
        workspaces_dir,
        artifacts_dir,
        output_max_bytes: config.output_max_bytes,
        output_tail_bytes: config.output_tail_bytes,
        redact_output: config.redact_output,
        kill_grace: Duration::from_secs(config.kill_grace_seconds),
        pause_limit: Duration::from_secs(config.pause_limit_seconds),
        hand_back_at_step_boundary: config.snapshots_shared(),
        sandbox_slots: config.sandbox_slots,
    }
}

/// A process that just started holds no lease yet: any its id still holds belonged to
/// a process that died (a restarted pod keeps its name). Those lapse now.
async fn lapse_previous(leases: &Leases, worker_id: &str) -> anyhow::Result<()> {
    let lapsed = leases.lapse_held_by(worker_id).await?
        + leases.for_sandboxes().lapse_held_by(worker_id).await?;
    if lapsed > 0 {
        tracing::info!(
            lapsed,
            "leases of a previous process with this worker id lapse now"
        );
    }
    Ok(())
}

/// This worker's directory (claimed: one live worker per directory), its disk volume
/// (mounted over it before anything is made in it) and its artifacts directory.
async fn local_state(
    config: &Config,
    artifacts_dir: &std::path::Path,
) -> anyhow::Result<(directory::Directory, disk::Disk, std::path::PathBuf)> {
    let directory = directory::Directory::claim(&config.workspaces_dir)?;
    let disk = disk::Disk::open(
        &directory.path,
        config.disk_quota,
        config.workspaces_disk_mb,
    )?;
    tokio::fs::create_dir_all(artifacts_dir)
        .await
        .with_context(|| format!("creating {}", artifacts_dir.display()))?;
    let artifacts_dir =
        std::fs::canonicalize(artifacts_dir).context("resolving the artifacts directory")?;
    Ok((directory, disk, artifacts_dir))
}

/// Where and how custody keeps trees: the snapshot store (opened, its identity read)
/// and the capture settings.
async fn custody_settings(
    config: &Config,
    artifacts_dir: &std::path::Path,
    worker_id: &str,
) -> anyhow::Result<custody::CustodySettings> {
    let snapshot_store = config.snapshot_store(artifacts_dir);
    let store = cairn_snapshot::Repository::open(&snapshot_store)
        .with_context(|| format!("opening the snapshot store {snapshot_store}"))?;
    // An object store started with the worker (the chart's bundled one) may not answer
    // yet: a start waits for it a while, saying so, rather than crash-looping.
    let waiting = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(5))
        .with_max_times(30);
    let store_id = (|| store.identity())
        .retry(waiting)
        .notify(|e, wait| tracing::warn!(error = %e, ?wait, store = %snapshot_store, "the snapshot store did not answer; retrying"))
        .await
        .with_context(|| format!("reading the identity of the snapshot store {snapshot_store}"))?;
    Ok(custody::CustodySettings {
        store,
        store_id,
        backend: config.workspace_backend.clone(),
        persistent: config.workspace_persistent,
        base_image: config.base_image.clone(),
        rules: cairn_snapshot::CaptureRules {
            extra_patterns: config
                .capture_exclude
                .iter()
                .filter(|p| !p.is_empty())
                .cloned()
                .collect(),
        },
        hold_limits: cairn_common::hold::HoldLimits::default(),
        capture_retry: Duration::from_secs(config.capture_retry_seconds),
        write_retry: Duration::from_secs(config.lease_ttl_seconds),
        worker_id: worker_id.to_string(),
        node: cairn_common::component::node_name(config.node_name.as_deref()),
    })
}

/// Drain: running steps get the drain time, minus what stopping them takes; then they
/// are stopped (`drain`) and their requests handed back.
async fn drain_jobs(
    jobs: &TaskTracker,
    drain: &CancellationToken,
    drain_time: Duration,
    grace: Duration,
) {
    jobs.close();
    let let_finish = drain_time.saturating_sub(grace + Duration::from_secs(1));
    if !jobs.is_empty() {
        tracing::info!(
            running = jobs.len(),
            ?let_finish,
            "draining: letting running steps finish"
        );
    }
    if tokio::time::timeout(let_finish, jobs.wait()).await.is_ok() {
        return;
    }
    tracing::info!(
        running = jobs.len(),
        "drain time is up: stopping steps and handing their requests back"
    );
    drain.cancel();
    if tokio::time::timeout(grace + Duration::from_secs(1), jobs.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            running = jobs.len(),
            "jobs did not stop within the drain time"
        );
    }
}

/// The worker's tasks beside its jobs (heartbeat, signals, janitor, probes), each with
/// its own stop; stopped in the reverse order of their start.
#[derive(Default)]
struct Background {
    tasks: Vec<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl Background {
    /// The probes first (stopped last), then the heartbeat, the signals and the janitor.
    fn start(
        worker: &context::Worker,
        config: &Config,
        listener: tokio::net::TcpListener,
        probes: axum::Router,
        directory_id: uuid::Uuid,
        starving: &consumer::Starving,
    ) -> Background {
        let mut background = Background::default();
        background.spawn(|stop| async move {
            let _ = health::serve(listener, probes, stop).await;
        });
        let (pool, id) = (worker.pool.clone(), worker.settings.worker_id.clone());
        let starving = starving.clone();
        background.spawn(|stop| beat(pool, id, starving, stop));
        let (signals, pool) = (worker.signals.clone(), worker.pool.clone());
        background.spawn(|stop| signals.listen(pool, stop));
        let janitor = janitor::Janitor {
            directory_id,
            workspaces_dir: worker.settings.workspaces_dir.clone(),
            grace: Duration::from_secs(config.janitor_grace_seconds),
        };
        let (active, pool) = (worker.active.clone(), worker.pool.clone());
        let every = Duration::from_secs(config.janitor_interval_seconds);
        background.spawn(move |stop| janitor.run(pool, active, every, stop));
        background
    }

    fn spawn<F, Fut>(&mut self, task: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(task(stop.clone()));
        self.tasks.push((stop, handle));
    }

    async fn stop(mut self) {
        while let Some((stop, handle)) = self.tasks.pop() {
            stop.cancel();
            let _ = handle.await;
        }
    }
}

/// Beats every [`cairn_common::heartbeat::INTERVAL`] until stopped; a beat that fails (a
/// database blip) is logged and the next one tried.
async fn beat(
    pool: sqlx::PgPool,
    worker_id: String,
    starving: consumer::Starving,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(cairn_common::heartbeat::INTERVAL);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => return,
        }
        if let Err(e) =
            cairn_common::heartbeat::beat(&pool, &worker_id, false, starving.waited()).await
        {
            tracing::warn!(error = %e, "heartbeat not recorded; trying again");
        }
    }
}
