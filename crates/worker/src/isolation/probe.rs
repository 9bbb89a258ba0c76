//! What this host allows, found out once at start by trying it: bubblewrap, each
//! namespace the sandbox uses, and the cgroup hierarchy.

use super::cgroup::Hierarchy;
use super::view::{self, View};
use super::{Settings, Spec};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::Stdio;

/// The result of the probe: shown in `/readyz`, the metric and every receipt.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub mode: super::Mode,
    /// `bubblewrap <version>`, or `none`.
    pub mechanism: String,
    pub user_namespace: bool,
    pub pid_namespace: bool,
    pub mount_namespace: bool,
    pub network_namespace: bool,
    /// `v2`, `v1` or `none`.
    pub cgroup: &'static str,
    /// Controllers a step's cgroup has.
    pub cgroup_controllers: Vec<&'static str>,
    /// Whether processes run in the namespace sandbox.
    pub isolated: bool,
    /// Whether steps that ask for the network get a NAT and egress filter.
    pub egress: bool,
    /// What keeps the sandbox from being whole, in words.
    pub missing: Vec<String>,
    /// How a sandbox's pause keeps its processes.
    pub pause: Pause,
}

/// A pause here: its processes frozen in place, resident, for at most the pause limit
/// (then it behaves like a stop). A pause that writes memory to the disk (a CRIU
/// checkpoint, which would outlive the worker) is not made: `memory_checkpoint` says why.
#[derive(Debug, Clone, Serialize)]
pub struct Pause {
    /// `in_place`.
    pub keeps_processes: &'static str,
    /// Why there are no memory checkpoints on this worker.
    pub memory_checkpoint: String,
}

/// Whether CRIU could checkpoint here (`criu check`, at most 10 s); in either case the
/// reason this worker makes no memory checkpoints.
pub fn memory_checkpoints(path: &std::ffi::OsStr) -> String {
    let Some(criu) = super::program::find("criu".as_ref(), path) else {
        return "criu is not installed".into();
    };
    let child = std::process::Command::new(&criu)
        .arg("check")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => return format!("criu does not start: {e}"),
    };
    // Drained beside the wait, so that a long report never blocks it.
    let reader = child.stderr.take().map(|mut stderr| {
        std::thread::spawn(move || {
            let mut said = String::new();
            let _ = stderr.read_to_string(&mut said);
            said
        })
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => {
                return "criu check passes here, but Cairn does not make memory checkpoints yet"
                    .into()
            }
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return "criu check did not answer within 10 s".into();
            }
            Err(e) => return format!("criu check could not be waited for: {e}"),
        }
    }
    let said = reader.and_then(|r| r.join().ok()).unwrap_or_default();
    let last = said
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    format!("criu check fails on this kernel: {}", last.trim())
}

impl Report {
    /// What enforces memory and process limits.
    pub fn limits_by(&self) -> &'static str {
        match self.cgroup {
            "v2" => "cgroup v2",
            "v1" => "cgroup v1",
            _ => "rlimit",
        }
    }

    /// Each capability as (name, present), for the metric.
    pub fn capabilities(&self) -> [(&'static str, bool); 7] {
        [
            ("bubblewrap", self.mechanism != "none"),
            ("user_namespace", self.user_namespace),
            ("pid_namespace", self.pid_namespace),
            ("mount_namespace", self.mount_namespace),
            ("network_namespace", self.network_namespace),
            ("cgroup", self.cgroup != "none"),
            ("isolated", self.isolated),
        ]
    }
}

/// Tries each part of the sandbox.
pub fn probe(settings: &Settings, view: &View, cgroups: Option<&Hierarchy>) -> Report {
    let mut report = Report {
        mode: settings.mode,
        mechanism: "none".into(),
        user_namespace: false,
        pid_namespace: false,
        mount_namespace: false,
        network_namespace: false,
        cgroup: cgroups.map_or("none", Hierarchy::version),
        cgroup_controllers: cgroups.map(Hierarchy::controllers).unwrap_or_default(),
        isolated: false,
        egress: false,
        missing: Vec::new(),
        pause: Pause {
            keeps_processes: "in_place",
            memory_checkpoint: String::new(),
        },
    };
    if !settings.cgroups {
        report.missing.push(
            "CAIRN_SANDBOX_CGROUPS=false: memory and process limits are rlimits, per process"
                .into(),
        );
    } else if cgroups.is_none() {
        report
            .missing
            .push("no delegated cgroup: memory and process limits are rlimits, per process".into());
    }
    if settings.mode == super::Mode::Off {
        report.missing.insert(0, "CAIRN_SANDBOX=off".into());
        return report;
    }
    match bwrap_version(settings) {
        Ok(version) => report.mechanism = version,
        Err(missing) => {
            report.missing.insert(0, missing);
            return report;
        }
    }
    namespaces(settings, &mut report);
    if report.mount_namespace
        && report.user_namespace
        && report.pid_namespace
        && report.network_namespace
    {
        report.isolated = whole(settings, view).map_or_else(
            |e| {
                report
                    .missing
                    .insert(0, format!("the sandbox does not start: {e}"));
                false
            },
            |()| true,
        );
    }
    report
}

/// Which namespaces bubblewrap can make here, each tried alone; what it cannot make
/// is said first in `missing`.
fn namespaces(settings: &Settings, report: &mut Report) {
    let base = ["--ro-bind", "/", "/", "--dev", "/dev"];
    let tries = |extra: &[&str]| -> Result<(), String> {
        let out = std::process::Command::new(&settings.bwrap)
            .args(base)
            .args(extra)
            .args(["--", "true"])
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    };
    let mut note = |what: &str, result: Result<(), String>| match result {
        Ok(()) => true,
        Err(e) => {
            report.missing.insert(0, format!("no {what}: {e}"));
            false
        }
    };
    report.mount_namespace = note("mount namespace", tries(&[]));
    report.user_namespace = note("user namespace", tries(&["--unshare-user"]));
    report.pid_namespace = note(
        "PID namespace",
        tries(&["--unshare-pid", "--proc", "/proc"]),
    );
    report.network_namespace = note("network namespace", tries(&["--unshare-net"]));
}

/// bubblewrap's version, or what to say when it is not there.
fn bwrap_version(settings: &Settings) -> Result<String, String> {
    let version = std::process::Command::new(&settings.bwrap)
        .arg("--version")
        .stdin(Stdio::null())
        .output();
    match version {
        Ok(out) if out.status.success() => {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        }
        _ => Err(format!(
            "bubblewrap ({}) is not installed (Debian: apt-get install bubblewrap)",
            settings.bwrap.display()
        )),
    }
}

/// Starts `true` in the sandbox as a step starts, in a scratch workspace.
fn whole(settings: &Settings, view: &View) -> Result<(), String> {
    let scratch = std::env::temp_dir().join(format!(
        "cairn-sandbox-probe-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let (workspace, home) = (scratch.join("workspace"), scratch.join("home"));
    let made = std::fs::create_dir_all(&workspace).and_then(|()| std::fs::create_dir_all(&home));
    let result = made.map_err(|e| e.to_string()).and_then(|()| {
        let spec = Spec {
            workspace: workspace.clone(),
            cwd: None,
            home,
            network: cairn_common::egress::Effective::flag(false),
            limits: Default::default(),
            identity: None,
            volumes: Vec::new(),
        };
        // Started as a step is (its variables through bubblewrap's `--args`, the
        // spawn's descriptors and death signal), but in no cgroup: the probe asks what
        // the namespaces allow.
        let argv = ["true".to_string()];
        let env = BTreeMap::from([("PATH".to_string(), super::DEFAULT_PATH.to_string())]);
        let (launch, _) = view::bwrap(settings, view, &argv, &env, &spec, Path::new(""))
            .map_err(|e| e.to_string())?;
        let mut started = launch.spawn().map_err(|e| e.to_string())?;
        drop(started.stdout.take());
        let mut errors = String::new();
        if let Some(stderr) = started.stderr.take() {
            let _ = std::fs::File::from(stderr).read_to_string(&mut errors);
        }
        let status = started.wait_blocking().map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            Err(errors.trim().to_string())
        }
    });
    let _ = std::fs::remove_dir_all(&scratch);
    result
}
