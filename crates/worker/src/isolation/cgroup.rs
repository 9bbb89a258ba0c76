//! Cgroups for steps, where the host delegates them: v2 first, v1 where that is what is
//! mounted. A step's cgroup holds every process of its sandbox, so its memory and
//! process limits hold for all of them together, a breach is counted by the kernel, its
//! CPU time is measured whole, and it freezes and ends as one.

use cairn_common::run::StepLimits;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// v1 controllers a step uses (each its own hierarchy).
const V1_CONTROLLERS: [&str; 4] = ["memory", "pids", "freezer", "cpuacct"];
/// v2 controllers enabled for steps' cgroups.
const V2_CONTROLLERS: &str = "+memory +pids +cpu";

/// Where this worker makes its steps' cgroups.
#[derive(Debug)]
pub enum Hierarchy {
    /// The unified hierarchy: one directory holds all of a step's controllers.
    V2 { base: PathBuf },
    /// One directory per controller that could be made.
    V1 { bases: Vec<(&'static str, PathBuf)> },
}

impl Hierarchy {
    /// The hierarchy this process may make cgroups in, if any.
    pub fn delegated() -> Option<Hierarchy> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        // One base per hierarchy value, so that two in one process never share one.
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("cairn-{}-{n}", std::process::id());
        if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
            let own = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
            remove_stale(&own);
            return v2(&own, &name);
        }
        let mut bases = Vec::new();
        for controller in V1_CONTROLLERS {
            let Some(dir) = v1_directory(&own, &mounts, controller) else {
                continue;
            };
            remove_stale(&dir);
            let base = dir.join(&name);
            if std::fs::create_dir_all(&base).is_ok() {
                bases.push((controller, base));
            }
        }
        let limits = bases.iter().any(|(c, _)| *c == "memory" || *c == "pids");
        limits.then_some(Hierarchy::V1 { bases })
    }

    pub fn version(&self) -> &'static str {
        match self {
            Hierarchy::V2 { .. } => "v2",
            Hierarchy::V1 { .. } => "v1",
        }
    }

    /// The controllers a step's cgroup has.
    pub fn controllers(&self) -> Vec<&'static str> {
        match self {
            Hierarchy::V2 { .. } => vec!["memory", "pids", "cpu", "freezer"],
            Hierarchy::V1 { bases } => bases.iter().map(|(c, _)| *c).collect(),
        }
    }

    pub fn has(&self, controller: &str) -> bool {
        self.controllers().contains(&controller)
    }

    /// Makes a step's cgroup with its limits.
    pub fn create(&self, name: &str, limits: &StepLimits) -> io::Result<Group> {
        let dirs: Vec<(&'static str, PathBuf)> = match self {
            Hierarchy::V2 { base } => vec![("unified", base.join(name))],
            Hierarchy::V1 { bases } => bases.iter().map(|(c, b)| (*c, b.join(name))).collect(),
        };
        let group = Group {
            v2: matches!(self, Hierarchy::V2 { .. }),
            dirs,
        };
        // A group made in part is removed: no step runs in it.
        group
            .limited(limits)
            .inspect_err(|_| group.remove_empty())?;
        Ok(group)
    }
}

impl Group {
    /// Makes the group's directories and writes its limits.
    fn limited(&self, limits: &StepLimits) -> io::Result<()> {
        for (_, dir) in &self.dirs {
            std::fs::create_dir(dir).or_else(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })?;
        }
        let group = self;
        if let Some(mb) = limits.memory_mb {
            let bytes = (mb * 1024 * 1024).to_string();
            match group.dir("memory") {
                Some(dir) if group.v2 => write(&dir.join("memory.max"), &bytes)?,
                Some(dir) => {
                    write(&dir.join("memory.limit_in_bytes"), &bytes)?;
                    // Swap counts too where the kernel accounts it.
                    let _ = write(&dir.join("memory.memsw.limit_in_bytes"), &bytes);
                }
                None => {}
            }
        }
        if let (Some(pids), Some(dir)) = (limits.pids, group.dir("pids")) {
            write(&dir.join("pids.max"), &pids.to_string())?;
        }
        Ok(())
    }

    /// Removes the group's directories that exist (they hold no process).
    fn remove_empty(&self) {
        for (_, dir) in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Drop for Hierarchy {
    fn drop(&mut self) {
        let bases: Vec<&PathBuf> = match self {
            Hierarchy::V2 { base } => vec![base],
            Hierarchy::V1 { bases } => bases.iter().map(|(_, b)| b).collect(),
        };
        for base in bases {
            let _ = std::fs::remove_dir(base);
        }
    }
}

/// A v2 hierarchy under this process's own cgroup. Controllers can be enabled for
/// children only in a cgroup with no processes of its own, so the worker first moves
/// itself into a leaf beside its steps' parent when it must.
fn v2(own: &Path, name: &str) -> Option<Hierarchy> {
    let wanted = ["memory", "pids"];
    let available = std::fs::read_to_string(own.join("cgroup.controllers")).ok()?;
    if !wanted
        .iter()
        .all(|c| available.split_whitespace().any(|a| a == *c))
    {
        return None;
    }
    let enable = |dir: &Path| write(&dir.join("cgroup.subtree_control"), V2_CONTROLLERS);
    if enable(own).is_err() {
        let leaf = own.join(format!("{name}-worker"));
        std::fs::create_dir_all(&leaf).ok()?;
        write(&leaf.join("cgroup.procs"), &std::process::id().to_string()).ok()?;
        enable(own).ok()?;
    }
    let base = own.join(name);
    std::fs::create_dir_all(&base).ok()?;
    enable(&base).ok()?;
    Some(Hierarchy::V2 { base })
}

/// The directory of this process's v1 cgroup of `controller`, if that hierarchy is
/// mounted and this process may write in it.
fn v1_directory(own: &str, mountinfo: &str, controller: &str) -> Option<PathBuf> {
    let path = own.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then_some(path)
    })?;
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let mut after = after.split_whitespace();
        let (fstype, _, options) = (after.next()?, after.next()?, after.next()?);
        if fstype != "cgroup" || !options.split(',').any(|o| o == controller) {
            return None;
        }
        let fields: Vec<&str> = before.split_whitespace().collect();
        let (root, mount_point) = (fields.get(3)?, fields.get(4)?);
        let relative = Path::new(path).strip_prefix(root).ok()?;
        Some(Path::new(mount_point).join(relative))
    })
}

/// Removes the step cgroups that workers which died without cleaning up (killed, or
/// crashed) left under `parent`: `cairn-<pid>-…` of a process that no longer exists.
/// What such a group still holds (a process a frozen pause kept from dying with its
/// worker) is thawed and killed first; a group whose processes have not left yet stays
/// for the next start.
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("cairn-"))
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(steps) = std::fs::read_dir(entry.path()) {
            for step in steps.flatten().filter(|s| s.path().is_dir()) {
                end_processes(&step.path());
                let _ = std::fs::remove_dir(step.path());
            }
        }
        let _ = std::fs::remove_dir(entry.path());
    }
}

/// Kills every process of a left-over group and thaws it (a frozen process dies only
/// once thawed), in whichever version's files the group has.
fn end_processes(dir: &Path) {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = write(&dir.join("cgroup.kill"), "1");
    let _ = write(&dir.join("freezer.state"), "THAWED");
    let _ = write(&dir.join("cgroup.freeze"), "0");
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
}

/// One step's cgroup.
#[derive(Debug)]
pub struct Group {
    v2: bool,
    /// (controller, directory); v2 has one directory for all.
    dirs: Vec<(&'static str, PathBuf)>,
}

impl Group {
    fn dir(&self, controller: &str) -> Option<&Path> {
        if self.v2 {
            return self.dirs.first().map(|(_, d)| d.as_path());
        }
        self.dirs
            .iter()
            .find(|(c, _)| *c == controller)
            .map(|(_, d)| d.as_path())
    }

    /// The files a process writes `0` to, before it executes, to join the group.
    pub fn procs_files(&self) -> Vec<CString> {
        self.dirs
            .iter()
            .filter_map(|(_, d)| CString::new(d.join("cgroup.procs").as_os_str().as_bytes()).ok())
            .collect()
    }

    /// The processes in the group.
    pub fn processes(&self) -> Vec<i32> {
        let Some((_, dir)) = self.dirs.first() else {
            return Vec::new();
        };
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// A counted event of a `flat keyed` file (`oom_kill 1`).
    fn event(&self, controller: &str, file: &str, key: &str) -> u64 {
        let Some(dir) = self.dir(controller) else {
            return 0;
        };
        std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    (k == key).then(|| v.trim().parse().ok()).flatten()
                })
            })
            .unwrap_or(0)
    }

    /// Whether the kernel killed a process for passing the memory limit.
    pub fn memory_breached(&self) -> bool {
        if self.v2 {
            self.event("memory", "memory.events", "oom_kill") > 0
        } else {
            self.event("memory", "memory.oom_control", "oom_kill") > 0
        }
    }

    /// Whether a fork was refused for passing the process limit.
    pub fn pids_breached(&self) -> bool {
        self.event("pids", "pids.events", "max") > 0
    }

    /// CPU time of every process the group held, in ms.
    pub fn cpu_ms(&self) -> Option<i64> {
        if self.v2 {
            let usec = self.event("cpu", "cpu.stat", "usage_usec");
            return Some(i64::try_from(usec / 1000).unwrap_or(i64::MAX));
        }
        let dir = self.dir("cpuacct")?;
        let ns: u64 = std::fs::read_to_string(dir.join("cpuacct.usage"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Some(i64::try_from(ns / 1_000_000).unwrap_or(i64::MAX))
    }

    /// Freezes or thaws every process in the group; false when it has no freezer.
    pub fn freeze(&self, frozen: bool) -> bool {
        if self.v2 {
            let dir = &self.dirs[0].1;
            return write(&dir.join("cgroup.freeze"), if frozen { "1" } else { "0" }).is_ok();
        }
        match self.dir("freezer") {
            Some(dir) => write(
                &dir.join("freezer.state"),
                if frozen { "FROZEN" } else { "THAWED" },
            )
            .is_ok(),
            None => false,
        }
    }

    /// Kills every process in the group.
    pub fn kill(&self) {
        if self.v2 && write(&self.dirs[0].1.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        // Only the worker puts a process in a group (a step's, or a session's command),
        // never one already in it, so an empty group has nothing to end: no freeze and
        // thaw (the usual case, once a sandbox has ended).
        if self.processes().is_empty() {
            return;
        }
        // Frozen, nothing in the group can fork while it is emptied.
        let frozen = self.freeze(true);
        for pid in self.processes() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if frozen {
            self.freeze(false);
        }
    }

    /// Removes the group once its processes are gone (a killed process may take a moment
    /// to leave it).
    pub async fn remove(&self) {
        for _ in 0..50 {
            if self.processes().is_empty() {
                break;
            }
            self.kill();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        for (_, dir) in &self.dirs {
            if let Err(e) = std::fs::remove_dir(dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "a step's cgroup was not removed");
            }
        }
    }
}
