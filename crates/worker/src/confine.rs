//! Confinement of verification checks on Linux: a new network namespace in which only
//! loopback exists (and is up), so a check reaches nothing outside its own process tree
//! over the network, and no capability left to leave it. Unix sockets bound to paths in
//! the filesystem remain reachable: there is no mount namespace.
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

/// Runs in the forked child before exec: a new network namespace, loopback up, then
/// every capability dropped and `no_new_privs` set, so the check cannot re-enter the
/// host's namespace (`setns` needs `CAP_SYS_ADMIN`) nor regain privileges through a
/// set-user-id program. Only async-signal-safe system calls, no allocation.
fn enter_network_namespace() -> io::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
    loopback_up()?;
    drop_privileges()
}

/// `struct __user_cap_header_struct` of capget(2)/capset(2).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`; version 3 takes two of them (64 capabilities).
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// Higher than any capability the kernel knows; unknown ones fail with EINVAL, ignored.
const LAST_CAPABILITY: libc::c_ulong = 63;

#[allow(unsafe_code)]
fn drop_privileges() -> io::Result<()> {
    // SAFETY: prctl(2) and capset(2) with stack-owned, correctly laid out arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        // The bounding set first (it needs CAP_SETPCAP, still held), so that exec of a
        // root-owned process cannot regain what is dropped below.
        for capability in 0..=LAST_CAPABILITY {
            if libc::prctl(libc::PR_CAPBSET_DROP, capability, 0, 0, 0) != 0 {
                let error = io::Error::last_os_error();
                if error.raw_os_error() != Some(libc::EINVAL) {
                    return Err(error);
                }
            }
        }
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ) != 0
        {
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EINVAL) {
                return Err(error);
            }
        }
        let mut header = CapHeader {
            version: CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
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
