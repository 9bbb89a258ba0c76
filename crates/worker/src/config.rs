//! The worker's settings: flags and `CAIRN_*` environment variables.

use cairn_common::component::Settings;
use cairn_common::config::{AmqpArgs, ArtifactsArgs, DatabaseArgs, LogArgs, LogFormat, RedisArgs};
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Cairn's worker: claims jobs under fenced leases and runs their steps.
#[derive(Debug, Clone, Parser)]
#[command(name = "cairn-worker", version, about)]
pub struct Config {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub amqp: AmqpArgs,
    #[command(flatten)]
    pub artifacts: ArtifactsArgs,
    #[command(flatten)]
    pub log: LogArgs,
    /// Address of the probes (`/healthz`, `/readyz`) and `/metrics`.
    #[arg(long, env = "CAIRN_METRICS_LISTEN", default_value = "127.0.0.1:9091")]
    pub metrics_listen: SocketAddr,
    /// Where the scheduler reaches this worker's previews, at the probes' listener
    /// (`http://POD_IP:9091`). Default: that listener's address unless it is a wildcard.
    #[arg(long, env = "CAIRN_PREVIEW_URL")]
    pub preview_url: Option<String>,
    /// The node this worker runs on (the chart: the pod's node), recorded on its
    /// snapshots: one counts as off-host once a reaper on another node read it back.
    /// Unset: its snapshots stay `local_only`.
    #[arg(long, env = "CAIRN_NODE_NAME")]
    pub node_name: Option<String>,
    /// Apply pending migrations at start (they serialize on an advisory lock).
    #[arg(long, env = "CAIRN_MIGRATE", default_value_t = true, action = clap::ArgAction::Set)]
    pub migrate: bool,
    /// This worker's identity as a lease owner (default: host name and process id).
    #[arg(long, env = "CAIRN_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Jobs (runs, continuations, verifications) run at once.
    #[arg(long, env = "CAIRN_WORKER_CONCURRENCY", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,
    /// Sandboxes hosted at once, apart from the job slots (0: this worker hosts none).
    #[arg(long, env = "CAIRN_SANDBOX_SLOTS", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub sandbox_slots: u32,
    /// The AMQP heartbeat of the worker's consumer connection, unless the URL sets one.
    /// RabbitMQ drops a worker that stops answering (a stalled process) after about this
    /// long and gives the deliveries it held to others: shorter than the heartbeat lapse
    /// (5 s), so a stalled worker is gone from the queues before its requests are taken
    /// over.
    #[arg(long, env = "CAIRN_AMQP_HEARTBEAT_SECONDS", default_value_t = 3,
          value_parser = clap::value_parser!(u16).range(1..=600))]
    pub amqp_heartbeat_seconds: u16,
    /// Deliveries RabbitMQ may push ahead to each of the worker's consumers (one per
    /// queue; 0: 1). They wait only while a slot is free: with every slot taken the
    /// consumers pause and hand back what they held, so no work waits on a busy worker.
    #[arg(long, env = "CAIRN_PREFETCH", default_value_t = 1)]
    pub prefetch: u16,
    /// Lease time to live; renewed every third of it.
    #[arg(long, env = "CAIRN_LEASE_TTL_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub lease_ttl_seconds: u64,
    /// After SIGTERM: time running steps get to finish before they are stopped and their
    /// requests handed back.
    #[arg(long, env = "CAIRN_DRAIN_SECONDS", default_value_t = 30)]
    pub drain_seconds: u64,
    /// Time between SIGTERM and SIGKILL when a step is stopped.
    #[arg(long, env = "CAIRN_KILL_GRACE_SECONDS", default_value_t = 5)]
    pub kill_grace_seconds: u64,
    /// Where workspaces are created.
    #[arg(
        long,
        env = "CAIRN_WORKSPACES_DIR",
        default_value = "./.cairn/workspaces"
    )]
    pub workspaces_dir: PathBuf,
    /// Where workspace snapshots (packs and manifests) are stored: a local directory, or
    /// an object store URL (`s3://bucket/prefix`, `gs://…`, `az://…`, credentials from
    /// the usual `AWS_*`, `GOOGLE_*`, `AZURE_*` variables). Empty: the artifacts
    /// directory. Workers that may continue each other's work, and the reaper, must all
    /// reach it.
    #[arg(
        long,
        env = "CAIRN_SNAPSHOT_STORE_URL",
        default_value = "",
        hide_env_values = true
    )]
    pub snapshot_store_url: String,
    /// Whether every other worker can restore this worker's snapshots (default: when the
    /// snapshot store is an object store; set it for a directory they all mount). A
    /// draining worker then hands each run back at its next step boundary, for another
    /// to continue from that checkpoint; otherwise it lets its runs go on within the
    /// drain time, since no other worker could continue them where they are.
    #[arg(long, env = "CAIRN_SNAPSHOTS_SHARED", action = clap::ArgAction::Set)]
    pub snapshots_shared: Option<bool>,
    /// Name of this workspace backend, part of every baseline's key.
    #[arg(long, env = "CAIRN_WORKSPACE_BACKEND", default_value = "local")]
    pub workspace_backend: String,
    /// Whether workspaces here survive the worker (14-day holds) or not (1-hour handoff).
    #[arg(long, env = "CAIRN_WORKSPACE_PERSISTENT", default_value_t = false, action = clap::ArgAction::Set)]
    pub workspace_persistent: bool,
    /// The image steps run on, part of every baseline's key.
    #[arg(long, env = "CAIRN_BASE_IMAGE")]
    pub base_image: Option<String>,
    /// Extra names (or `*.suffix` patterns), comma-separated, never captured in a
    /// snapshot; credential files are always left out.
    #[arg(long, env = "CAIRN_CAPTURE_EXCLUDE", value_delimiter = ',')]
    pub capture_exclude: Vec<String>,
    /// Largest captured output of one stream of one step, kept as an artifact.
    #[arg(long, env = "CAIRN_OUTPUT_MAX_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub output_max_bytes: u64,
    /// Seconds between two passes of the workspace janitor, which removes this worker's
    /// trees once no hold guards them.
    #[arg(long, env = "CAIRN_JANITOR_INTERVAL_SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub janitor_interval_seconds: u64,
    /// Seconds a tree is left alone after its hold expired, so an adoption that saw the
    /// hold alive finishes first.
    #[arg(long, env = "CAIRN_JANITOR_GRACE_SECONDS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(60..))]
    pub janitor_grace_seconds: u64,
    /// The step sandbox: `auto` (the full sandbox where the host allows it; otherwise
    /// process groups and rlimits, and every receipt says so), `required` (the worker
    /// takes no work without the full sandbox, and its `/readyz` says why) or `off`.
    #[arg(long, env = "CAIRN_SANDBOX", value_enum, default_value_t = crate::isolation::Mode::Auto)]
    pub sandbox: crate::isolation::Mode,
    /// The bubblewrap program the sandbox runs steps with.
    #[arg(long, env = "CAIRN_SANDBOX_BWRAP", default_value = "bwrap")]
    pub sandbox_bwrap: PathBuf,
    /// The uid a step has inside its user namespace.
    #[arg(long, env = "CAIRN_SANDBOX_UID", default_value_t = 1000)]
    pub sandbox_uid: u32,
    /// The gid a step has inside its user namespace.
    #[arg(long, env = "CAIRN_SANDBOX_GID", default_value_t = 1000)]
    pub sandbox_gid: u32,
    /// More host paths steps see, read-only, comma-separated (a toolchain outside
    /// `/usr` and `/opt`).
    #[arg(long, env = "CAIRN_SANDBOX_READ_ONLY", value_delimiter = ',')]
    pub sandbox_read_only: Vec<PathBuf>,
    /// Host paths steps see read-write at the same place, comma-separated (a cache
    /// shared by runs, a directory a test meets its steps in). Whatever is there, every
    /// step of every run may change.
    #[arg(long, env = "CAIRN_SANDBOX_READ_WRITE", value_delimiter = ',')]
    pub sandbox_read_write: Vec<PathBuf>,
    /// Whether steps get a cgroup of their own where the host delegates one (their
    /// memory and process limits for all their processes together, a breach named in
    /// the receipt); `false`: rlimits only.
    #[arg(long, env = "CAIRN_SANDBOX_CGROUPS", default_value_t = true, action = clap::ArgAction::Set)]
    pub sandbox_cgroups: bool,
    /// Whether a step that does not say (`network`) reaches the network.
    #[arg(long, env = "CAIRN_STEP_NETWORK", default_value_t = true, action = clap::ArgAction::Set)]
    pub step_network: bool,
    /// Destinations beyond the public internet that steps with the network may reach,
    /// comma-separated: `HOST:PORT`, `CIDR`, `CIDR:PORT` or `[IPV6/PREFIX]:PORT` (a host
    /// name is resolved at start). Loopback, link-local, private and CGNAT ranges and
    /// the worker's own addresses are refused unless named here.
    #[arg(long, env = "CAIRN_STEP_EGRESS_ALLOW", value_delimiter = ',',
          value_parser = parse_allowed)]
    pub step_egress_allow: Vec<Vec<crate::isolation::network::Allowed>>,
    /// Disk quotas of trees: `auto` where the worker can make its volume (root, loop
    /// devices and btrfs, or a workspaces directory on btrfs), `required` (no start
    /// without them) or `off`.
    #[arg(long, env = "CAIRN_DISK_QUOTA", value_enum, default_value_t = crate::disk::Mode::Auto)]
    pub disk_quota: crate::disk::Mode,
    /// Size of the volume the worker makes for its trees, in MiB; 0: four fifths of
    /// what the host has free when it is made. Read once: the image keeps its size.
    #[arg(long, env = "CAIRN_WORKSPACES_DISK_MB", default_value_t = 0)]
    pub workspaces_disk_mb: u64,
    /// Room of each run's tree, and of its home, in MiB.
    #[arg(long, env = "CAIRN_RUN_DISK_MB", default_value_t = 10_240,
          value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub run_disk_mb: u64,
    /// Memory of a step that sets no `limits.memory_mb`, in MiB.
    #[arg(long, env = "CAIRN_STEP_MEMORY_MB", default_value_t = 8192,
          value_parser = clap::value_parser!(u64).range(16..=1_048_576))]
    pub step_memory_mb: u64,
    /// Processes at once of a step that sets no `limits.pids`.
    #[arg(long, env = "CAIRN_STEP_PIDS", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(8..=1_000_000))]
    pub step_pids: u32,
    /// CPU seconds of a step that sets no `limits.cpu_seconds`; 0: no limit.
    #[arg(long, env = "CAIRN_STEP_CPU_SECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=604_800))]
    pub step_cpu_seconds: u32,
    /// Open files per process of a step that sets no `limits.open_files`.
    #[arg(long, env = "CAIRN_STEP_OPEN_FILES", default_value_t = 65_536,
          value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub step_open_files: u32,
    /// Seconds a paused job stays paused before it behaves like a stop (its processes
    /// end and it stops at its checkpoint).
    #[arg(long, env = "CAIRN_PAUSE_LIMIT_SECONDS", default_value_t = 1800,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub pause_limit_seconds: u64,
    /// Seconds a step's failing checkpoint (store down, disk full) is retried before its
    /// attempt ends with no receipt: the request gets another attempt, or stops at its
    /// last checkpoint.
    #[arg(long, env = "CAIRN_CAPTURE_RETRY_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub capture_retry_seconds: u64,
    /// Bytes of the end of each stream kept with the receipt in the database.
    #[arg(long, env = "CAIRN_OUTPUT_TAIL_BYTES", default_value_t = 4096)]
    pub output_tail_bytes: usize,
    /// Replace the secrets a step prints (private key blocks, known token formats) with
    /// `[redacted]` in its stored output and tails.
    #[arg(long, env = "CAIRN_REDACT_OUTPUT", default_value_t = true, action = clap::ArgAction::Set)]
    pub redact_output: bool,
}

impl Config {
    /// The sandbox's settings; it keeps its files in the worker's (claimed) workspaces
    /// directory.
    pub fn isolation(&self, workspaces_dir: &std::path::Path) -> crate::isolation::Settings {
        crate::isolation::Settings {
            mode: self.sandbox,
            bwrap: self.sandbox_bwrap.clone(),
            uid: self.sandbox_uid,
            gid: self.sandbox_gid,
            network_default: self.step_network,
            defaults: cairn_common::run::StepLimits {
                memory_mb: Some(self.step_memory_mb),
                pids: Some(self.step_pids),
                cpu_seconds: (self.step_cpu_seconds > 0).then_some(self.step_cpu_seconds),
                open_files: Some(self.step_open_files),
            },
            read_only: non_empty(&self.sandbox_read_only),
            read_write: non_empty(&self.sandbox_read_write),
            cgroups: self.sandbox_cgroups,
            egress_allow: self.step_egress_allow.iter().flatten().cloned().collect(),
            etc_dir: workspaces_dir.join(".cairn-sandbox-etc"),
        }
    }

    /// The snapshot store's URL: the artifacts directory unless one is configured.
    pub fn snapshot_store(&self, artifacts_dir: &std::path::Path) -> String {
        if self.snapshot_store_url.is_empty() {
            artifacts_dir.to_string_lossy().into_owned()
        } else {
            self.snapshot_store_url.clone()
        }
    }

    /// The `snapshots_shared` setting, or its default.
    pub fn snapshots_shared(&self) -> bool {
        self.snapshots_shared.unwrap_or_else(|| {
            let url = &self.snapshot_store_url;
            url.contains("://") && !url.starts_with("file://")
        })
    }

    /// The local artifact directory (output artifacts are files here).
    pub fn artifacts_dir(&self) -> Result<PathBuf, String> {
        let url = self.artifacts.artifacts_url.as_str();
        if let Some(path) = url.strip_prefix("file://") {
            return Ok(PathBuf::from(path));
        }
        if url.contains("://") {
            return Err(format!(
                "CAIRN_ARTIFACTS_URL: this worker keeps step output in a local directory; {url:?} is not one (put snapshots in an object store with CAIRN_SNAPSHOT_STORE_URL)"
            ));
        }
        Ok(PathBuf::from(url))
    }

    pub fn worker_id(&self) -> String {
        self.worker_id.clone().unwrap_or_else(|| {
            let host = nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "worker".into());
            format!("{host}-{}", std::process::id())
        })
    }

    /// Every slot: jobs and sandboxes each hold one while they run.
    fn slots(&self) -> u32 {
        self.concurrency.saturating_add(self.sandbox_slots)
    }

    /// The smallest pool that never starves a job: one connection per running job or
    /// hosted sandbox for its writes, and four that the lease keepers' short renewals,
    /// the consumers, the janitor and the probes share.
    fn pool_needs(&self) -> u32 {
        self.slots().saturating_add(4)
    }

    /// The pool: the one configured, else twice the slots plus 4, so that a job never
    /// waits on another's connection for its own writes.
    pub fn pool_size(&self) -> u32 {
        self.database
            .pool_size(self.slots().saturating_mul(2).saturating_add(4))
    }

    pub fn prefetch(&self) -> u16 {
        self.prefetch.max(1)
    }
}

impl Settings for Config {
    /// Checks what clap cannot.
    fn validate(&self) -> Result<(), String> {
        cairn_common::component::validate_urls(
            Some(&self.database),
            Some(&self.redis),
            Some(&self.amqp),
        )?;
        self.artifacts_dir()?;
        if let Some(size) = self.database.database_max_connections {
            if size < self.pool_needs() {
                return Err(format!(
                    "CAIRN_DATABASE_MAX_CONNECTIONS: {size} is too small for CAIRN_WORKER_CONCURRENCY {} \
                     and CAIRN_SANDBOX_SLOTS {}: every running job and hosted sandbox needs a \
                     connection for its writes, and its lease keeper must renew beside it; set \
                     at least {} (or leave it unset for {})",
                    self.concurrency,
                    self.sandbox_slots,
                    self.pool_needs(),
                    self.slots().saturating_mul(2).saturating_add(4)
                ));
            }
        }
        if !self.snapshot_store_url.is_empty() && self.snapshot_store_url.contains("://") {
            let scheme = self.snapshot_store_url.split("://").next().unwrap_or("");
            if !["file", "s3", "gs", "az", "azure", "abfs", "abfss", "https"].contains(&scheme) {
                return Err(format!(
                    "CAIRN_SNAPSHOT_STORE_URL: {:?} is not a directory or an s3://, gs:// or az:// URL",
                    self.snapshot_store_url
                ));
            }
        }
        Ok(())
    }

    fn log_format(&self) -> LogFormat {
        self.log.log_format
    }
}

fn parse_allowed(text: &str) -> Result<Vec<crate::isolation::network::Allowed>, String> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    crate::isolation::network::Allowed::parse(text.trim())
}

fn non_empty(paths: &[PathBuf]) -> Vec<PathBuf> {
    paths
        .iter()
        .filter(|p| !p.as_os_str().is_empty())
        .cloned()
        .collect()
}
