//! A long-lived sandbox (for a sandbox resource): one namespace set and one cgroup that
//! outlive each command, so that what one exec starts in the background keeps running
//! for the next, a pause freezes all of it in place, and a stop ends all of it.
//!
//! The namespaces are held by a bubblewrap process running `sleep infinity` (its init
//! reaps what is left behind). Each command enters them with `nsenter` (user, mount,
//! PID, IPC, and the network namespace unless it asks for the network), as the
//! sandbox's unprivileged uid (which has no capabilities after `exec`), with
//! `no_new_privs`, in the session's cgroup and under its rlimits.

use super::cgroup::Group;
use super::identity::IdentityDir;
use super::running::Running;
use super::spawn::{Launch, Started};
use super::view;
use super::{network, CommandError, Isolation, Spec, WORKSPACE};
use cairn_common::egress::Layer;
use cairn_common::sandbox::identity::Identity;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How long the namespace's init may take to appear.
const START: Duration = Duration::from_secs(10);

/// The held namespaces of one sandbox.
#[derive(Debug)]
pub struct Session {
    holder: Started,
    running: Arc<Running>,
    /// The namespace's init, as the host sees it: what `nsenter` targets.
    init: i32,
    /// The NAT of the held network namespace, where this worker gives one.
    link: Option<network::Link>,
    /// A network namespace of the sandbox's with only a loopback, for commands that do
    /// not ask for the network while the held one has the NAT, and its pid.
    offline: Option<(Started, i32)>,
    /// Its identity files, shown in its `/etc` (removed when the session ends).
    identity: Option<super::identity::IdentityDir>,
}

impl Session {
    /// Freezes (or thaws) every process of the sandbox in place.
    pub fn freeze(&self, frozen: bool) {
        self.running.freeze(frozen);
    }

    /// A process in each of its network namespaces (the held one first): where a
    /// preview connects from.
    pub fn namespaces(&self) -> Vec<i32> {
        let mut pids = vec![self.init];
        pids.extend(self.offline.as_ref().map(|(_, pid)| *pid));
        pids
    }

    fn group(&self) -> Option<&Group> {
        self.running.group.as_deref()
    }

    /// Ends every process of the sandbox (frozen ones too) and removes its cgroup; what
    /// its egress filter refused is counted.
    pub async fn end(mut self, sandbox: &Isolation) {
        self.running.kill_all();
        self.running.freeze(false);
        let _ = self.holder.wait().await;
        if let Some(link) = self.link.take() {
            sandbox.disconnect(link);
        }
        drop(self.offline.take());
        drop(self.identity.take());
        if let Some(group) = self.running.group.clone() {
            group.remove().await;
        }
    }
}

impl Isolation {
    /// Starts the held namespaces of a sandbox resource, or `None` where processes do
    /// not run in namespaces here (each command then runs on its own).
    pub async fn start_session(
        &self,
        spec: &Spec,
        identity: &Identity,
    ) -> Result<Option<Session>, String> {
        if !self.isolates() {
            return Ok(None);
        }
        let identity = IdentityDir::write(
            &self.settings.etc_dir.with_extension("identities"),
            identity,
        )
        .map_err(|e| format!("cannot write the sandbox's identity: {e}"))?;
        // The held namespace has the NAT where this worker gives one and the sandbox
        // asks for the network (its filter narrowed by the sandbox's allow list); a
        // command that asks for no network enters a second namespace with only a loopback.
        let holder_spec = Spec {
            network: cairn_common::egress::Effective {
                enabled: self.report.egress && spec.network.enabled,
                ..spec.network.clone()
            },
            cwd: None,
            identity: Some(identity.path.clone()),
            ..spec.clone()
        };
        let argv = ["sleep".to_string(), "infinity".to_string()];
        let env = BTreeMap::from([("PATH".to_string(), super::DEFAULT_PATH.to_string())]);
        let (mut cmd, group, hold) = self
            .command(&argv, &env, &holder_spec)
            .map_err(|e| e.to_string())?;
        // `sleep` prints nothing, and what else of the sandbox writes there is lost.
        cmd.quiet = true;
        let holder = match cmd.spawn() {
            Ok(holder) => holder,
            Err(e) => {
                if let Some(group) = group {
                    group.remove().await;
                }
                return Err(format!("cannot start the sandbox's namespaces: {e}"));
            }
        };
        let mut session = self.hold(holder, group, identity);
        if let Some(hold) = hold {
            match self.connect(hold).await {
                Ok(link) => session.link = Some(link),
                Err(why) => {
                    session.end(self).await;
                    let why = format!("the sandbox's network could not be attached: {why}");
                    return Err(why);
                }
            }
        }
        match started_init(session.holder.pid).await {
            Some(init) => session.init = init,
            None => {
                session.end(self).await;
                return Err("the sandbox's namespaces did not start".into());
            }
        }
        if session.link.is_some() {
            match self.start_offline().await {
                Ok(offline) => session.offline = Some(offline),
                Err(why) => {
                    session.end(self).await;
                    return Err(why);
                }
            }
        }
        Ok(Some(session))
    }

    /// The session of a started holder, before its network and init are known.
    fn hold(&self, holder: Started, group: Option<Group>, identity: IdentityDir) -> Session {
        let running = Arc::new(Running {
            pid: holder.pid,
            isolated: true,
            group: group.map(Arc::new),
            cpu_limit_ms: None,
            keeps_leftovers: false,
        });
        Session {
            holder,
            running,
            init: 0,
            link: None,
            offline: None,
            identity: Some(identity),
        }
    }

    /// A process in a network namespace of its own with only a loopback (bubblewrap
    /// brings it up), for commands without the network to enter, and its pid there.
    /// Nothing runs in it but `sleep`; a command entering it has no capability over it.
    async fn start_offline(&self) -> Result<(Started, i32), String> {
        let mut cmd = Launch::new(&self.settings.bwrap);
        cmd.args(["--die-with-parent", "--unshare-net", "--ro-bind", "/", "/"])
            .args(["--", "sleep", "infinity"]);
        cmd.env = vec![("PATH".into(), super::DEFAULT_PATH.into())];
        cmd.quiet = true;
        let offline = cmd
            .spawn()
            .map_err(|e| format!("cannot start the sandbox's offline namespace: {e}"))?;
        let deadline = tokio::time::Instant::now() + START;
        // Ready once bubblewrap's child, in the new namespace, runs `sleep`.
        loop {
            let child = first_child(offline.pid);
            let comm = child.and_then(|c| std::fs::read_to_string(format!("/proc/{c}/comm")).ok());
            if let (Some(child), Some(comm)) = (child, comm) {
                if comm.trim() == "sleep" {
                    return Ok((offline, child));
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err("the sandbox's offline namespace did not start".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The command that runs `argv` with exactly `env` inside the session's namespaces,
    /// in its cgroup: its own process group, so that a timeout ends what it started
    /// and nothing else of the sandbox.
    pub fn enter(
        &self,
        session: &Session,
        argv: &[String],
        env: &BTreeMap<String, String>,
        spec: &Spec,
    ) -> Result<Launch, CommandError> {
        let cwd = view::resolve_cwd(&spec.workspace, spec.cwd.as_deref())?;
        // Found once at start on the worker's own PATH, never on the command's.
        let mut cmd = Launch::new(&self.nsenter);
        cmd.arg(format!("--target={}", session.init))
            .args(["--user", "--mount", "--pid", "--ipc", "--uts"]);
        // Always a namespace of the sandbox's: the held one (with the NAT, if any), or
        // the offline one; never the host's.
        match (&session.offline, spec.network.enabled) {
            (Some((_, offline)), false) => {
                cmd.arg(format!("--net=/proc/{offline}/ns/net"));
            }
            (None, true) => {
                return Err(CommandError::Network(
                    match (&self.egress, spec.network.disabled_by) {
                        (Err(why), _) => why.clone(),
                        (Ok(_), Some(Layer::Tenant)) => {
                            "the tenant's network policy allows no network".into()
                        }
                        (Ok(_), _) => "the sandbox was created with `network: false`".into(),
                    },
                ))
            }
            _ => {
                cmd.arg("--net");
            }
        }
        // The root and working directory of the holder (its view, at the workspace):
        // nsenter resolves a directory it is given in the worker's view, not the
        // sandbox's, so a working directory below the workspace is entered by a shell
        // of the view.
        cmd.args(["--root", "--wd"])
            .arg(format!("--setuid={}", self.settings.uid))
            .arg(format!("--setgid={}", self.settings.gid))
            .arg("--");
        // nsenter runs on the host with the worker's authority: a variable the C library
        // acts on there (its loader would honour `LD_PRELOAD`) is set by `env`, already
        // inside the sandbox, as an argument; every other one stays in the environment,
        // which, unlike a command line, only the process's owner can read.
        let (on_host, kept): (Vec<_>, Vec<_>) =
            env.iter().partition(|(name, _)| acted_on_by_libc(name));
        cmd.envs(kept);
        cmd.args(["/usr/bin/env", "--"]).args(
            on_host
                .iter()
                .map(|(name, value)| format!("{name}={value}")),
        );
        // `env` would read a program whose name holds `=` as one more variable.
        if cwd.as_os_str().is_empty() && argv.first().is_some_and(|p| !p.contains('=')) {
            cmd.args(argv);
        } else {
            cmd.args(["/bin/sh", "-c", "cd -- \"$0\" && exec \"$@\""])
                .arg(Path::new(WORKSPACE).join(&cwd))
                .args(argv);
        }
        cmd.rlimits = view::rlimits(&spec.limits, session.group().is_some());
        cmd.cgroup_procs = session.group().map(|g| g.procs_files()).unwrap_or_default();
        cmd.no_new_privs = true;
        Ok(cmd)
    }
}

/// Whether the C library would act on a variable of this name while it loads or runs a
/// program: glibc's own list of what it ignores for set-user-id programs, and every
/// `LD_`, `MALLOC_` and `GLIBC_` name.
fn acted_on_by_libc(name: &str) -> bool {
    const NAMES: &[&str] = &[
        "GCONV_PATH",
        "GETCONF_DIR",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TMPDIR",
        "TZDIR",
    ];
    ["LD_", "MALLOC_", "GLIBC_"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || NAMES.contains(&name)
}

/// The first child of `pid`, if it has one.
fn first_child(pid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The init of the namespaces under `holder`, once it has started `sleep`: it does so
/// only after it made the view and moved into it. Entered any sooner, `nsenter` would
/// take the root the init had before (a command then finds no `/usr/bin/env`). `None`
/// when that takes longer than the start allows.
async fn started_init(holder: i32) -> Option<i32> {
    let deadline = tokio::time::Instant::now() + START;
    loop {
        if let Some(init) = first_child(holder).filter(|&init| first_child(init).is_some()) {
            return Some(init);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
