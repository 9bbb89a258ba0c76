//! A started sandbox: signalling, freezing and ending every process in it, and the
//! limits it passed.

use super::cgroup::Group;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use std::sync::{Arc, Mutex};

/// A limit whose breach ended a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Memory,
    Pids,
    Cpu,
    /// Its tree or home is at its quota (found after it failed).
    Disk,
}

impl Limit {
    /// The name a receipt records.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Memory => "memory_limit",
            Limit::Pids => "pids_limit",
            Limit::Cpu => "cpu_limit",
            Limit::Disk => "disk_quota",
        }
    }
}

/// The processes of one started command.
#[derive(Debug)]
pub struct Running {
    /// The process the worker started: bubblewrap, or the command itself.
    pub pid: i32,
    /// Whether it runs in the namespace sandbox (else it leads its process group).
    pub isolated: bool,
    pub group: Option<Arc<Group>>,
    /// The CPU limit, in ms, checked against the cgroup's measure.
    pub cpu_limit_ms: Option<i64>,
    /// A command of a sandbox resource: what it leaves running in the background stays
    /// (its session ends it).
    pub keeps_leftovers: bool,
}

impl Running {
    /// Sends `signal` to every process of the sandbox.
    pub fn signal_all(&self, signal: Signal) {
        let members = match &self.group {
            Some(group) => group.processes(),
            None if self.isolated => namespace_members(self.pid),
            // A command in a terminal leads a session of its own (`setsid --ctty`, below
            // `nsenter`): the session gets the signal, and `nsenter` waits for it, so a
            // command that ignores it is still there for the `SIGKILL` after the grace.
            None => match session_members(self.pid) {
                Some(session) => session,
                None => {
                    let _ = killpg(Pid::from_raw(self.pid), signal);
                    return;
                }
            },
        };
        // Not bubblewrap itself: its end would end the namespace at once, with no grace.
        for pid in members.into_iter().filter(|p| *p != self.pid) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    /// Ends every process at once. In the namespace sandbox, the end of bubblewrap ends
    /// its namespace's init, and the kernel then kills everything left in it.
    pub fn kill_all(&self) {
        if !self.isolated {
            for pid in session_members(self.pid).unwrap_or_default() {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
        if !self.isolated {
            let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
        }
        if let Some(group) = &self.group {
            group.kill();
        }
    }

    /// Ends what a step left once the process the worker started is reaped (its id may
    /// be another process's by now, so it is not signalled): the rest of its process
    /// group without namespaces, and whatever its cgroup still holds. In the namespace
    /// sandbox nothing is left: the namespace ended with bubblewrap.
    pub fn end_leftovers(&self) {
        if self.keeps_leftovers {
            return;
        }
        if !self.isolated {
            let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
        }
        if let Some(group) = &self.group {
            group.kill();
        }
    }

    /// Freezes (or thaws) every process: the cgroup freezer where there is one, else
    /// `SIGSTOP`/`SIGCONT` to each.
    pub fn freeze(&self, frozen: bool) {
        if self.group.as_ref().is_some_and(|g| g.freeze(frozen)) {
            return;
        }
        self.signal_all(if frozen {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        });
    }

    /// The limit passed so far, if any.
    pub fn breach(&self) -> Option<Limit> {
        let group = self.group.as_ref()?;
        if group.memory_breached() {
            return Some(Limit::Memory);
        }
        if group.pids_breached() {
            return Some(Limit::Pids);
        }
        match (self.cpu_limit_ms, group.cpu_ms()) {
            (Some(limit), Some(used)) if used >= limit => Some(Limit::Cpu),
            _ => None,
        }
    }

    /// CPU time of every process, where a cgroup measured it.
    pub fn cpu_ms(&self) -> Option<i64> {
        self.group.as_ref().and_then(|g| g.cpu_ms())
    }
}

/// The processes of the session `pid`'s first child leads, if it leads one (a command
/// in a terminal, under `nsenter`); `None` when it leads none.
fn session_members(pid: i32) -> Option<Vec<i32>> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let leader: i32 = children.split_whitespace().next()?.parse().ok()?;
    if session_of(leader)? != leader {
        return None;
    }
    let entries = std::fs::read_dir("/proc").ok()?;
    Some(
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|p| session_of(*p) == Some(leader))
            .collect(),
    )
}

/// The session id of `pid` (`/proc/PID/stat`'s sixth field; its name, the second,
/// may hold spaces and parentheses, so the fields are counted from its end).
fn session_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after) = stat.rsplit_once(')')?;
    after.split_whitespace().nth(3)?.parse().ok()
}

/// Every process in the PID namespace of `pid`'s first child (bubblewrap's init).
fn namespace_members(pid: i32) -> Vec<i32> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let Some(init) = children.split_whitespace().next() else {
        return Vec::new();
    };
    let Ok(namespace) = std::fs::read_link(format!("/proc/{init}/ns/pid")) else {
        return Vec::new();
    };
    // Never the worker's own namespace: that would be every process on the host.
    if std::fs::read_link("/proc/self/ns/pid").is_ok_and(|own| own == namespace) {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| std::fs::read_link(format!("/proc/{p}/ns/pid")).is_ok_and(|n| n == namespace))
        .collect()
}

/// The sandbox a job is running now, if any, for a pause to freeze and thaw.
#[derive(Debug, Default)]
pub struct Live(Mutex<Option<Arc<Running>>>);

impl Live {
    pub fn set(&self, running: Option<Arc<Running>>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = running;
    }

    fn get(&self) -> Option<Arc<Running>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Freezes or thaws the running sandbox; whether one was running.
    pub fn freeze(&self, frozen: bool) -> bool {
        match self.get() {
            Some(running) => {
                running.freeze(frozen);
                true
            }
            None => false,
        }
    }
}
