//! What a sandboxed process sees and is allowed: the bubblewrap command line (its mount
//! view and namespaces, the step's variables), its working directory, resolved beneath
//! the workspace, and its rlimits.

use super::descriptors::memory_file;
use super::network;
use super::spawn::{Launch, FILE_FD};
use super::{Settings, Spec, HOME, VOLUMES, WORKSPACE};
use cairn_common::run::StepLimits;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `/etc` entries a step sees, read-only: names, users, DNS, certificates, the dynamic
/// linker's cache and the `alternatives` links many programs are reached through. Not
/// `shadow`, not private keys, not the worker's configuration. They are copied once, at
/// start, into the directory every sandbox sees as `/etc` ([`EtcView`]).
const ETC: &[&str] = &[
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "gai.conf",
    "group",
    "host.conf",
    "hostname",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "passwd",
    "protocols",
    "resolv.conf",
    "services",
    "ssl/certs",
    "ssl/openssl.cnf",
    "timezone",
];

/// Device nodes a step sees.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// Top-level system directories: bound read-only, or recreated as the links they are
/// (`/bin -> usr/bin` on merged-`/usr` systems). Not `/opt`: what is there is the
/// host's to decide (`CAIRN_SANDBOX_READ_ONLY`).
const SYSTEM: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// The bubblewrap arguments that show [`SYSTEM`] as this host has it, found once.
pub(super) fn system_view() -> Vec<std::ffi::OsString> {
    let mut args = Vec::new();
    for name in SYSTEM {
        let host = Path::new("/").join(name);
        match std::fs::read_link(&host) {
            Ok(target) => {
                args.extend(["--symlink".into(), target.into_os_string()]);
                args.push(host.into_os_string());
            }
            Err(_) if host.is_dir() => {
                args.extend(["--ro-bind".into(), host.clone().into_os_string()]);
                args.push(host.into_os_string());
            }
            Err(_) => {}
        }
    }
    args
}

/// The bubblewrap command that runs `argv` with exactly `env` in the sandbox, in `cwd`
/// (relative to the workspace, already resolved beneath it), with the file of arguments
/// it reads at [`FILE_FD`].
///
/// bubblewrap itself runs on the host with the worker's authority, so the step's
/// variables are never its environment: its dynamic loader would honour `LD_PRELOAD`,
/// `LD_LIBRARY_PATH` or `GCONV_PATH` from it, as root, outside every namespace. They
/// reach it as `--setenv` arguments in a memory file, read after the loader has
/// run and set only for the command it starts; not on its command line either, which
/// every process on the host can read.
pub(super) fn bwrap(
    settings: &Settings,
    view: &View,
    argv: &[String],
    env: &BTreeMap<String, String>,
    spec: &Spec,
    cwd: &Path,
) -> io::Result<(Launch, Option<network::Hold>)> {
    let mut cmd = Launch::new(&settings.bwrap);
    if !env.is_empty() {
        cmd.file = Some(setenv_args(env)?);
        cmd.args(["--args", &FILE_FD.to_string()]);
    }
    let (uid, gid) = (settings.uid.to_string(), settings.gid.to_string());
    cmd.args(["--die-with-parent", "--new-session", "--unshare-user"])
        .args(["--uid", &uid, "--gid", &gid])
        .args(["--unshare-pid", "--unshare-ipc"])
        .args(["--cap-drop", "ALL"])
        // Always: the host's network namespace is never a step's (see `network`).
        .arg("--unshare-net");
    let hold = if spec.network.enabled {
        let (hold, fds) = network::hold()?;
        cmd.args(network::hold_args());
        if cmd.file.is_none() {
            // The hold's descriptors follow the argument file's place.
            cmd.file = Some(setenv_args(&BTreeMap::new())?);
        }
        cmd.extra_files = fds;
        Some(hold)
    } else {
        None
    };
    cmd.args(&view.system);
    // One mount for all of /etc: a bind per entry costs a step a few milliseconds.
    cmd.arg("--ro-bind").arg(&view.etc.path).arg("/etc");
    resource_args(&mut cmd, spec)?;
    // The devices a program expects, bound one by one: a whole `--dev` costs a step
    // about a millisecond more.
    for device in DEVICES {
        cmd.args(["--dev-bind", device, device]);
    }
    cmd.args([
        "--tmpfs",
        "/dev/shm",
        "--symlink",
        "/proc/self/fd",
        "/dev/fd",
    ])
    .args(["--symlink", "/proc/self/fd/0", "/dev/stdin"])
    .args(["--symlink", "/proc/self/fd/1", "/dev/stdout"])
    .args(["--symlink", "/proc/self/fd/2", "/dev/stderr"]);
    cmd.args(["--proc", "/proc", "--tmpfs", "/tmp"])
        .arg("--bind")
        .arg(&spec.workspace)
        .arg(WORKSPACE)
        .arg("--bind")
        .arg(&spec.home)
        .arg(HOME);
    // Last, so that no mount above (a `/tmp` of its own) hides them.
    for path in &settings.read_only {
        if path.exists() {
            cmd.arg("--ro-bind").arg(path).arg(path);
        }
    }
    for path in &settings.read_write {
        if path.exists() {
            cmd.arg("--bind").arg(path).arg(path);
        }
    }
    cmd.arg("--chdir")
        .arg(Path::new(WORKSPACE).join(cwd))
        .arg("--")
        .args(argv);
    // bwrap's own working directory (`Launch::new`'s `/`): anything it could be started
    // from.
    Ok((cmd, hold))
}

/// What a sandbox resource has and a run's step has not: its identity and its volumes,
/// each at `/volumes/<name>` (outside every other mount of the view).
fn resource_args(cmd: &mut Launch, spec: &Spec) -> io::Result<()> {
    if let Some(identity) = &spec.identity {
        identity_args(cmd, identity)?;
    }
    for (path, name) in &spec.volumes {
        cmd.arg("--bind")
            .arg(path)
            .arg(Path::new(VOLUMES).join(name));
    }
    Ok(())
}

/// A sandbox resource's own names over the host's: its UTS name, and its identity
/// files bound over the view's placeholders (their mount points).
fn identity_args(cmd: &mut Launch, identity: &Path) -> io::Result<()> {
    let hostname = std::fs::read_to_string(identity.join("hostname"))?;
    cmd.args(["--unshare-uts", "--hostname", hostname.trim()]);
    for name in ["machine-id", "hostname", "ssh"] {
        cmd.arg("--ro-bind")
            .arg(identity.join(name))
            .arg(Path::new("/etc").join(name));
    }
    Ok(())
}

/// `--setenv NAME VALUE` for each variable, NUL-separated, in a memory file read from
/// its start. `run::check_command` refuses an empty name, `=` in a name and NUL
/// anywhere; such a variable is refused here too rather than split.
fn setenv_args(env: &BTreeMap<String, String>) -> io::Result<OwnedFd> {
    let mut data = Vec::new();
    for (name, value) in env {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid variable {name:?}"),
            ));
        }
        for part in ["--setenv", name, value] {
            data.extend_from_slice(part.as_bytes());
            data.push(0);
        }
    }
    memory_file(&data)
}

/// The command without namespaces, with exactly `env`, in the workspace. No boundary
/// lies between the worker and it for the variables to cross: it is the step itself.
pub(super) fn direct(argv: &[String], env: &BTreeMap<String, String>, cwd: &Path) -> Launch {
    let mut cmd = Launch::new(&argv[0]);
    cmd.args(&argv[1..]).envs(env);
    cmd.cwd = cwd.to_path_buf();
    cmd
}

/// A working directory that does not resolve to a directory beneath the workspace.
#[derive(Debug, thiserror::Error)]
#[error("cwd {cwd:?} {why}")]
pub struct CwdRefused {
    pub cwd: String,
    pub why: &'static str,
}

/// Resolves `cwd` beneath `workspace` as the kernel does (`openat2` with
/// `RESOLVE_BENEATH`): no `..`, absolute path or symbolic link may lead out of it. The
/// path is returned as given: the sandbox resolves it again inside its own view, where
/// nothing but the workspace is writable and no process of an earlier step is left to
/// change it.
pub fn resolve_cwd(workspace: &Path, cwd: Option<&str>) -> Result<PathBuf, CwdRefused> {
    let Some(cwd) = cwd.filter(|c| !c.is_empty()) else {
        return Ok(PathBuf::new());
    };
    let refuse = |why| CwdRefused {
        cwd: cwd.to_string(),
        why,
    };
    let root = open_path(workspace).map_err(|_| refuse("has no workspace to resolve in"))?;
    match beneath(&root, cwd) {
        Ok(_) => Ok(PathBuf::from(cwd)),
        Err(e) => Err(refuse(match e.raw_os_error() {
            Some(libc::EXDEV) | Some(libc::ELOOP) => {
                "leaves the workspace (through a symbolic link, '..' or an absolute path)"
            }
            Some(libc::ENOENT) => "does not exist in the workspace",
            Some(libc::ENOTDIR) => "is not a directory",
            _ => "cannot be resolved in the workspace",
        })),
    }
}

fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: open(2) with a NUL-terminated path; the descriptor is owned at once.
    #[allow(unsafe_code)]
    unsafe {
        let fd = libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// `openat2(root, path, O_PATH | O_DIRECTORY, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`.
fn beneath(root: &OwnedFd, path: &str) -> io::Result<OwnedFd> {
    let c = CString::new(path).map_err(io::Error::other)?;
    let mut how: libc::open_how = unsafe_zeroed();
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2(2) with a valid directory descriptor, a NUL-terminated path and
    // an `open_how` of the size passed; the descriptor is owned at once.
    #[allow(unsafe_code)]
    unsafe {
        let fd = libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd as i32))
    }
}

fn unsafe_zeroed() -> libc::open_how {
    // SAFETY: `open_how` is plain integers; all zero is its documented empty value.
    #[allow(unsafe_code)]
    unsafe {
        std::mem::zeroed()
    }
}

/// Per-process limits set at exec: open files and CPU time always; memory and processes
/// only when no cgroup holds them for the whole sandbox.
pub(super) fn rlimits(limits: &StepLimits, cgroup: bool) -> Vec<(libc::__rlimit_resource_t, u64)> {
    let mut set = Vec::new();
    if let Some(n) = limits.open_files {
        set.push((libc::RLIMIT_NOFILE, u64::from(n)));
    }
    if let Some(seconds) = limits.cpu_seconds {
        set.push((libc::RLIMIT_CPU, u64::from(seconds)));
    }
    if !cgroup {
        if let Some(mb) = limits.memory_mb {
            set.push((libc::RLIMIT_AS, mb * 1024 * 1024));
        }
        if let Some(pids) = limits.pids {
            set.push((libc::RLIMIT_NPROC, u64::from(pids)));
        }
    }
    // A limit is only ever lowered: raising one past the worker's own hard limit needs
    // a capability the worker may not have, and would grant the step more than it.
    set.into_iter()
        .map(|(resource, value)| (resource, value.min(hard_limit(resource))))
        .collect()
}

fn hard_limit(resource: libc::__rlimit_resource_t) -> u64 {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: getrlimit(2) fills the stack-owned struct it is given.
    #[allow(unsafe_code)]
    unsafe {
        libc::getrlimit(resource, &mut current);
    }
    current.rlim_max
}

/// The system a sandbox sees, prepared once when the worker starts.
#[derive(Debug)]
pub struct View {
    pub system: Vec<std::ffi::OsString>,
    pub etc: EtcView,
}

/// The `/etc` steps see: the [`ETC`] entries of the host's, copied at start (links kept
/// as links) into the worker's own directory, so that a worker that was killed leaves
/// one copy for its successor to replace, not one per start.
#[derive(Debug)]
pub struct EtcView {
    pub path: PathBuf,
}

impl EtcView {
    /// Copies the [`ETC`] entries, and names the step's uid and gid in `passwd` and
    /// `group` when the host's do not (programs that look their user up then find one).
    pub fn copy(path: &Path, uid: u32, gid: u32) -> io::Result<EtcView> {
        match std::fs::remove_dir_all(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let path = path.to_path_buf();
        std::fs::create_dir_all(&path)?;
        let view = EtcView { path };
        for name in ETC {
            let from = Path::new("/etc").join(name);
            if std::fs::symlink_metadata(&from).is_ok() {
                copy_entry(&from, &view.path.join(name))?;
            }
        }
        name_if_unknown(
            &view.path.join("passwd"),
            uid,
            &format!("cairn:x:{uid}:{gid}:Cairn step:{HOME}:/bin/sh"),
        )?;
        name_if_unknown(&view.path.join("group"), gid, &format!("cairn:x:{gid}:"))?;
        resolve_through_nat(&view.path.join("resolv.conf"))?;
        // Mount points for a sandbox resource's identity: a run's steps see them empty.
        std::fs::write(view.path.join("machine-id"), "")?;
        std::fs::create_dir_all(view.path.join("ssh"))?;
        if !view.path.join("hostname").exists() {
            std::fs::write(view.path.join("hostname"), "")?;
        }
        Ok(view)
    }
}

impl Drop for EtcView {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn copy_entry(from: &Path, to: &Path) -> io::Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let meta = std::fs::symlink_metadata(from)?;
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)
    } else if meta.is_dir() {
        std::fs::create_dir_all(to)?;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            copy_entry(&entry.path(), &to.join(entry.file_name()))?;
        }
        Ok(())
    } else if meta.is_file() {
        std::fs::copy(from, to).map(|_| ())
    } else {
        Ok(())
    }
}

/// The host's resolver settings with one nameserver: the NAT's forwarder, the only
/// resolver the egress filter lets a step reach (the host's own may be on a private
/// or loopback address).
fn resolve_through_nat(file: &Path) -> io::Result<()> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut kept: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("nameserver"))
        .map(|l| format!("{l}\n"))
        .collect();
    kept.push_str(&format!("nameserver {}\n", network::DNS));
    let _ = std::fs::remove_file(file);
    std::fs::write(file, kept)
}

/// Appends `line` to a `passwd`/`group` file that has no entry with id `id`.
fn name_if_unknown(file: &Path, id: u32, line: &str) -> io::Result<()> {
    let mut text = std::fs::read_to_string(file).unwrap_or_default();
    let known = text
        .lines()
        .any(|l| l.split(':').nth(2) == Some(id.to_string().as_str()));
    if !known {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(line);
        text.push('\n');
        // A copied file may be a link to the host's: replace it, never write through.
        let _ = std::fs::remove_file(file);
        std::fs::write(file, text)?;
    }
    Ok(())
}
