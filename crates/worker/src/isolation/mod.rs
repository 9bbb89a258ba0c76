//! The step sandbox (invariant 10): every process Cairn starts for a run, steps and
//! verification checks alike, runs with no more authority than its workspace.
//!
//! Where the host allows it, the process runs under bubblewrap (`bwrap`, the sandbox
//! Flatpak uses) in its own user, PID, mount and IPC namespaces, and its own network
//! namespace, with a NAT and an egress filter when the step asks for the network
//! ([`network`]) (no UTS or cgroup namespace: a step
//! can change neither the host name nor a cgroup, and each would cost a start time):
//! - as an unprivileged uid/gid of its user namespace, with no capabilities and
//!   `no_new_privs`;
//! - seeing a read-only system (`/usr`, the `/bin` and `/lib` links, chosen `/etc`
//!   entries), its workspace read-write at [`WORKSPACE`], a private [`HOME`] and `/tmp`,
//!   and a fresh `/proc` that shows only its own processes;
//! - as the child of its namespace's init, so that when the step ends or is stopped
//!   every process it started ends with it, `setsid` ones included.
//!
//! Limits (memory, processes, CPU time, open files) come from a cgroup where the host
//! delegates one ([`cgroup`]), rlimits otherwise. [`probe`] finds out at start what the
//! host allows; [`Mode`] decides what to do when it allows less. A sandbox resource
//! keeps one [`Session`] of namespaces that its commands enter.

pub mod cgroup;
mod descriptors;
pub mod identity;
pub mod network;
pub mod probe;
pub mod program;
mod running;
mod session;
pub mod spawn;
mod view;

pub use probe::Report;
pub use running::{Limit, Live, Running};
pub use session::Session;
pub use spawn::{Launch, Started};
pub use view::{resolve_cwd, CwdRefused};

use cairn_common::egress::Effective;
use cairn_common::run::StepLimits;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a sandboxed process finds its workspace.
pub const WORKSPACE: &str = "/workspace";
/// Its private home (also its `TMPDIR` for checks).
pub const HOME: &str = "/home/cairn";
/// Where a sandbox resource sees its volumes, each under its name.
pub const VOLUMES: &str = "/volumes";
/// A PATH for steps that set none: the environment is cleared, not empty-handed.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What the worker does when the host allows less than the full sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The full sandbox where the host allows it; otherwise processes run in their own
    /// process group under rlimits (and a cgroup where there is one), each receipt says
    /// so, and verification results are never reusable.
    Auto,
    /// Unless the host allows the full sandbox, the worker takes no work and its
    /// `/readyz` answers 503 with the reason.
    Required,
    /// No namespaces: process groups, rlimits and cgroups only.
    Off,
}

/// The sandbox's settings, from the worker's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub mode: Mode,
    /// The bubblewrap program.
    pub bwrap: PathBuf,
    /// The uid and gid a step has inside its user namespace.
    pub uid: u32,
    pub gid: u32,
    /// Whether a step that does not say reaches the network.
    pub network_default: bool,
    /// Limits of a step that sets none.
    pub defaults: StepLimits,
    /// More host paths a step sees, read-only at the same place (a toolchain).
    pub read_only: Vec<PathBuf>,
    /// Host paths a step sees read-write at the same place (a shared cache).
    pub read_write: Vec<PathBuf>,
    /// Whether steps get a cgroup where the host delegates one.
    pub cgroups: bool,
    /// Destinations the operator allows steps with the network to reach beyond the
    /// public internet (`CAIRN_STEP_EGRESS_ALLOW`).
    pub egress_allow: Vec<network::Allowed>,
    /// Where the `/etc` steps see is kept: a directory of this worker's own (it is
    /// replaced at start).
    pub etc_dir: PathBuf,
}

/// One process to start in the sandbox.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The workspace on the host; the process sees it at [`WORKSPACE`].
    pub workspace: PathBuf,
    /// The working directory, relative to the workspace; it must resolve beneath it.
    pub cwd: Option<String>,
    /// The private home on the host; the process sees it at [`HOME`].
    pub home: PathBuf,
    /// Whether it has the network, and the tenant's and its own lists that narrow the
    /// worker's policy (host names resolved when it starts).
    pub network: Effective,
    pub limits: StepLimits,
    /// A sandbox resource's identity files ([`identity::IdentityDir`]), shown in its
    /// `/etc` with its own host name; a run's steps have none.
    pub identity: Option<PathBuf>,
    /// A sandbox resource's volumes: each directory on the host, and the name it is
    /// seen under at `/volumes/<name>`; a run's steps have none.
    pub volumes: Vec<(PathBuf, String)>,
}

/// The sandbox of this worker process: its settings and what the host allows.
#[derive(Debug)]
pub struct Isolation {
    /// With `bwrap` found on the worker's PATH, never on a step's.
    settings: Settings,
    /// `nsenter`, found the same way (sandbox resources enter their held namespaces).
    nsenter: PathBuf,
    report: Report,
    /// The NAT and filter of steps with the network, or why there is none.
    egress: Result<network::Egress, String>,
    cgroups: Option<cgroup::Hierarchy>,
    view: view::View,
    started: AtomicU64,
    /// Packets the steps' egress filters refused.
    refused: prometheus_client::metrics::counter::Counter,
}

impl Isolation {
    /// Probes the host. With [`Mode::Required`] a host that cannot give the full
    /// sandbox is an error that names what is missing.
    pub fn start(mut settings: Settings) -> Result<Isolation, String> {
        // The host's programs are found once, on the worker's own PATH.
        let path = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
        if let Some(bwrap) = program::find(settings.bwrap.as_os_str(), &path) {
            settings.bwrap = bwrap;
        }
        let nsenter =
            program::find("nsenter".as_ref(), &path).unwrap_or_else(|| "/usr/bin/nsenter".into());
        let egress = network::Egress::find(&path, nsenter.clone(), &settings.egress_allow);
        let cgroups = settings
            .cgroups
            .then(cgroup::Hierarchy::delegated)
            .flatten();
        // Identity files a worker that died left behind.
        let _ = std::fs::remove_dir_all(settings.etc_dir.with_extension("identities"));
        let view = view::View {
            system: view::system_view(),
            etc: view::EtcView::copy(&settings.etc_dir, settings.uid, settings.gid)
                .map_err(|e| format!("cannot copy /etc for steps: {e}"))?,
        };
        let mut report = probe::probe(&settings, &view, cgroups.as_ref());
        report.pause.memory_checkpoint = probe::memory_checkpoints(&path);
        if let Err(why) = &egress {
            if report.isolated {
                report.missing.push(format!(
                    "steps that ask for the network fail: no NAT for their namespace: {why}"
                ));
            }
        }
        report.egress = report.isolated && egress.is_ok();
        if settings.mode == Mode::Required && !report.isolated {
            return Err(format!(
                "CAIRN_SANDBOX=required, but this host cannot give steps their sandbox: {}",
                report.missing.join("; ")
            ));
        }
        if settings.mode == Mode::Auto && !report.isolated {
            tracing::warn!(
                missing = %report.missing.join("; "),
                "steps run without the namespace sandbox: in their own process group, under rlimits, \
                 and every receipt says so; verification results are never reusable"
            );
        }
        Ok(Isolation {
            settings,
            nsenter,
            report,
            egress,
            cgroups,
            view,
            started: AtomicU64::new(0),
            refused: Default::default(),
        })
    }

    /// What the host allows and what is in use, for `/readyz` and the metric.
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// Whether processes run in the namespace sandbox.
    pub fn isolates(&self) -> bool {
        self.report.isolated
    }

    /// Whether a step that does not say reaches the network.
    pub fn network_default(&self) -> bool {
        self.settings.network_default
    }

    /// A step's limits: its own, else the worker's defaults.
    pub fn limits(&self, own: Option<StepLimits>) -> StepLimits {
        own.unwrap_or_default().or(self.settings.defaults)
    }

    /// The path a sandboxed process sees for its home.
    pub fn home_path(&self, host: &Path) -> PathBuf {
        if self.isolates() {
            PathBuf::from(HOME)
        } else {
            host.to_path_buf()
        }
    }

    /// What a receipt records of the sandbox a process ran in.
    pub fn describe(&self, spec: &Spec) -> serde_json::Value {
        let limits = json!({
            "memory_mb": spec.limits.memory_mb,
            "pids": spec.limits.pids,
            "cpu_seconds": spec.limits.cpu_seconds,
            "open_files": spec.limits.open_files,
            "enforced_by": self.report.limits_by(),
        });
        if self.isolates() {
            let namespaces = ["user", "pid", "mount", "ipc", "network"];
            json!({
                "mechanism": self.report.mechanism,
                "isolated": true,
                "uid": self.settings.uid,
                "gid": self.settings.gid,
                "namespaces": namespaces,
                "network": spec.network.enabled,
                "egress": if spec.network.enabled {
                    json!({
                        "nat": "slirp4netns",
                        "refused": "loopback, link-local, private (RFC 1918, RFC 4193), CGNAT and the worker's own addresses",
                        "allowed": self.settings.egress_allow.iter().map(|a| match a.port {
                            Some(port) => format!("{}:{port}", a.net),
                            None => a.net.clone(),
                        }).collect::<Vec<_>>(),
                        "narrowed_by": spec.network.narrowed_by,
                    })
                } else {
                    match spec.network.disabled_by {
                        Some(by) => json!({"none": true, "disabled_by": by}),
                        None => json!("none"),
                    }
                },
                "limits": limits,
            })
        } else {
            json!({
                "mechanism": "none",
                "isolated": false,
                "missing": self.report.missing,
                "network": true,
                "limits": limits,
            })
        }
    }

    /// The process that runs `argv` with exactly `env` in the sandbox, and the cgroup it
    /// starts in (created now). The caller spawns it and wraps it in a [`Running`].
    pub fn command(
        &self,
        argv: &[String],
        env: &BTreeMap<String, String>,
        spec: &Spec,
    ) -> Result<(Launch, Option<cgroup::Group>, Option<network::Hold>), CommandError> {
        let cwd = resolve_cwd(&spec.workspace, spec.cwd.as_deref())?;
        let (mut cmd, hold) = if self.isolates() {
            let mut narrowed = None;
            if spec.network.enabled {
                let egress = self
                    .egress
                    .as_ref()
                    .map_err(|why| CommandError::Network(why.clone()))?;
                if !spec.network.narrowed_by.is_empty() {
                    let layers = spec
                        .network
                        .narrowed_by
                        .iter()
                        .map(|n| Ok((n.by, resolve(&n.allow)?)))
                        .collect::<Result<Vec<_>, CommandError>>()?;
                    narrowed = Some(egress.narrowed_rules(&layers));
                }
            }
            let (cmd, hold) = view::bwrap(&self.settings, &self.view, argv, env, spec, &cwd)
                .map_err(CommandError::Variables)?;
            match narrowed {
                Some(rules) => (cmd, hold.map(|h| h.with_rules(rules))),
                None => (cmd, hold),
            }
        } else {
            (view::direct(argv, env, &spec.workspace.join(&cwd)), None)
        };
        let group = self.cgroups.as_ref().and_then(|h| {
            let n = self.started.fetch_add(1, Ordering::Relaxed);
            match h.create(&format!("step-{n}"), &spec.limits) {
                Ok(group) => Some(group),
                Err(e) => {
                    tracing::warn!(error = %e, "no cgroup for this step: rlimits only");
                    None
                }
            }
        });
        cmd.rlimits = view::rlimits(&spec.limits, group.is_some());
        cmd.cgroup_procs = group.as_ref().map(|g| g.procs_files()).unwrap_or_default();
        Ok((cmd, group, hold))
    }

    /// Attaches the NAT and egress filter to a started sandbox that holds for them.
    pub async fn connect(&self, hold: network::Hold) -> Result<network::Link, String> {
        match &self.egress {
            Ok(egress) => egress.connect(hold).await,
            Err(why) => Err(why.clone()),
        }
    }

    /// Ends a step's network once its filter's refusals are counted.
    pub fn disconnect(&self, link: network::Link) {
        if let Ok(egress) = &self.egress {
            egress.tally(link, self.refused.clone());
        }
    }

    /// Packets the steps' egress filters refused, for `/metrics`.
    pub fn refused(&self) -> prometheus_client::metrics::counter::Counter {
        self.refused.clone()
    }
}

/// Why a command could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Cwd(#[from] CwdRefused),
    #[error("cannot hand the command its variables: {0}")]
    Variables(std::io::Error),
    #[error("the step asks for the network, and this worker cannot give a sandbox one of its own ({0}); it never runs on the host's network")]
    Network(String),
    #[error("the step's network allow list cannot be applied: {0}")]
    Allow(String),
}

/// A layer's destinations, each host name resolved now; one that does not resolve fails
/// the step before it starts.
fn resolve(list: &[String]) -> Result<Vec<network::Allowed>, CommandError> {
    let mut all = Vec::new();
    for entry in list {
        all.extend(network::Allowed::parse(entry).map_err(CommandError::Allow)?);
    }
    Ok(all)
}
