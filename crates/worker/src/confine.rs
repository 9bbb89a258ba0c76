//! Confinement of verification checks on Linux: a new network namespace in which only
//! loopback exists (and is up), so a check reaches nothing outside its own process tree.
//! The rest of the confinement (private scratch `HOME`/`TMPDIR`, a cleared environment,
//! its own process group, a timeout) is the step runner's.

use std::io;

/// How verification checks are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// A network namespace where the host allows one; otherwise the check runs
    /// unconfined and its result is never reusable.
    Auto,
    /// A check that cannot be confined is not run; the verification fails.
    Required,
    /// Never confine (results are never reusable).
    Off,
}

/// The mode and what this host can do, decided once at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub mode: Mode,
    pub available: bool,
}

impl Policy {
    pub fn resolve(mode: Mode) -> Policy {
        let available = mode != Mode::Off && available();
        if mode != Mode::Off && !available {
            tracing::warn!(
                ?mode,
                "this host cannot create network namespaces: verification checks run unconfined and are never reusable"
            );
        }
        Policy { mode, available }
    }

    /// Whether checks run in a network namespace.
    pub fn confines(self) -> bool {
        self.mode != Mode::Off && self.available
    }
}

/// Runs in the forked child before exec: a new network namespace, then loopback up.
/// Only async-signal-safe system calls, no allocation.
fn enter_network_namespace() -> io::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
    loopback_up()
}

#[allow(unsafe_code)]
fn loopback_up() -> io::Result<()> {
    // SAFETY: plain system calls on a zeroed, stack-owned `ifreq` and a descriptor this
    // function opens and closes; nothing is shared with the parent process.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        request.ifr_name[0] = b'l' as libc::c_char;
        request.ifr_name[1] = b'o' as libc::c_char;
        let mut result = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request);
        if result >= 0 {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            result = libc::ioctl(fd, libc::SIOCSIFFLAGS, &request);
        }
        let error = io::Error::last_os_error();
        libc::close(fd);
        if result < 0 {
            return Err(error);
        }
    }
    Ok(())
}

/// Makes `cmd`'s process start in a new network namespace with only loopback.
#[allow(unsafe_code)]
pub fn isolate_network(cmd: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (see `enter_network_namespace`).
    unsafe {
        cmd.pre_exec(enter_network_namespace);
    }
}

/// Whether this host lets the worker create network namespaces (it needs
/// `CAP_SYS_ADMIN`, or an unprivileged user namespace policy that allows it).
#[allow(unsafe_code)]
pub fn available() -> bool {
    let mut probe = std::process::Command::new("true");
    probe
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: as in `isolate_network`.
    unsafe {
        use std::os::unix::process::CommandExt;
        probe.pre_exec(enter_network_namespace);
    }
    probe.status().is_ok_and(|s| s.success())
}
