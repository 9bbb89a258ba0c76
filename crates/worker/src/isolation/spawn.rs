//! Starting a sandboxed process without copying the worker.
//!
//! `fork` copies the worker's page tables, and the worker then takes a copy-on-write
//! fault on every page it touches until the child execs, which tears the copy down
//! again: together about a twentieth of the machine's CPU in a burst of one-step runs.
//! Like `posix_spawn`, this clones with `CLONE_VM | CLONE_VFORK`: the child runs in the
//! worker's memory, on a stack of its own, while the calling thread waits for its exec.
//! Unlike `posix_spawn`, the child also does what a step needs before it execs: it dies
//! with the worker, joins its cgroup and takes its rlimits, so that the program and all
//! it starts are held from their first instruction, and it closes every descriptor but
//! its standard ones and the file it was given.
//!
//! The child shares the worker's memory, so it only makes system calls on memory
//! prepared before the clone: no allocation, no lock, no panic. The process is known by
//! a pidfd from the clone on, so that a signal or a reap can never reach another
//! process that later got the same id.

// The child resets signals with the kernel's own `sigaction` layout (an all-zero one:
// handler, flags, restorer, and an 8-byte mask), as these architectures have it.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("spawn's raw rt_sigaction and rt_sigprocmask are written for x86_64 and aarch64");

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;

pub use super::descriptors::FILE_FD;
use super::descriptors::{above_targets, pipe_pair, PLACED_MAX};

/// The child's stack: it makes a few dozen system calls and execs.
const STACK: usize = 64 * 1024;

/// One process to start.
#[derive(Debug)]
pub struct Launch {
    /// A path, or a name looked up in `env`'s `PATH` (else [`super::DEFAULT_PATH`]).
    pub program: OsString,
    pub args: Vec<OsString>,
    /// Its whole environment.
    pub env: Vec<(OsString, OsString)>,
    pub cwd: PathBuf,
    /// A file it finds at [`FILE_FD`].
    pub file: Option<OwnedFd>,
    /// More descriptors it finds after [`FILE_FD`], in order (at most
    /// `PLACED_MAX - FILE_FD`).
    pub extra_files: Vec<OwnedFd>,
    /// `cgroup.procs` files it writes itself into.
    pub cgroup_procs: Vec<CString>,
    /// Soft and hard limits it sets.
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    pub no_new_privs: bool,
    /// Its output and errors go to `/dev/null` rather than to pipes.
    pub quiet: bool,
    /// Its standard input, else `/dev/null`.
    pub stdin: Option<OwnedFd>,
    /// `stdin` is a terminal: it is also the process's output and errors (no pipes).
    /// (The command makes it its controlling terminal itself, in its own namespaces,
    /// with `setsid --ctty`.)
    pub terminal: bool,
}

impl Launch {
    /// `program` with no arguments, no environment, in `/`, its output on pipes.
    pub fn new(program: impl AsRef<OsStr>) -> Launch {
        Launch {
            program: program.as_ref().to_os_string(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: PathBuf::from("/"),
            file: None,
            extra_files: Vec::new(),
            cgroup_procs: Vec::new(),
            rlimits: Vec::new(),
            no_new_privs: false,
            quiet: false,
            stdin: None,
            terminal: false,
        }
    }

    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Launch {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut Launch
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        for arg in args {
            self.arg(arg);
        }
        self
    }

    /// Sets the whole environment to `env`.
    pub fn envs<'a>(
        &mut self,
        env: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> &mut Launch {
        self.env = env
            .into_iter()
            .map(|(name, value)| (name.into(), value.into()))
            .collect();
        self
    }
}

/// A started process: its id, the read ends of its output pipes (closed on exec), and
/// its exit once reaped. Dropped before it was reaped, it is killed and reaped on a
/// thread of its own.
#[derive(Debug)]
pub struct Started {
    pub pid: i32,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pidfd: Arc<OwnedFd>,
    reaped: bool,
}

impl Started {
    /// Waits for the exit and reaps the process.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let pidfd = self.pidfd.clone();
        let status = tokio::task::spawn_blocking(move || reap(&pidfd))
            .await
            .map_err(io::Error::other)??;
        self.reaped = true;
        Ok(status)
    }

    /// [`Started::wait`], on this thread.
    pub fn wait_blocking(&mut self) -> io::Result<ExitStatus> {
        let status = reap(&self.pidfd)?;
        self.reaped = true;
        Ok(status)
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // Through the pidfd: even if a wait that was given up reaped it meanwhile, the
        // signal reaches no other process.
        // SAFETY: pidfd_send_signal(2) with a descriptor we own and no siginfo.
        #[allow(unsafe_code)]
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
        let pidfd = self.pidfd.clone();
        let _ = std::thread::Builder::new()
            .name("cairn-reap".into())
            .spawn(move || reap(&pidfd));
    }
}

/// Waits for the process of `pidfd` to exit and reaps it.
fn reap(pidfd: &OwnedFd) -> io::Result<ExitStatus> {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    loop {
        match waitid(Id::PIDFd(pidfd.as_fd()), WaitPidFlag::WEXITED) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(ExitStatus::from_raw((code & 0xff) << 8)),
            Ok(WaitStatus::Signaled(_, signal, core)) => {
                return Ok(ExitStatus::from_raw(
                    signal as i32 | if core { 0x80 } else { 0 },
                ))
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// What the child reads, all prepared before the clone.
struct Plan {
    program: CString,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    cwd: CString,
    stdio: [RawFd; 3],
    file: Option<RawFd>,
    extra: Vec<RawFd>,
    /// Past [`FILE_FD`], the highest descriptor open before the clone: what the child
    /// closes where `close_range` is not allowed.
    highest_fd: RawFd,
    procs: Vec<CString>,
    rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    no_new_privs: bool,
    /// The child's errno when it could not exec; 0 once it did.
    error: i32,
}

impl Launch {
    /// Starts the process with `/dev/null` (or [`Launch::stdin`]) as its standard input
    /// and its output and errors on pipes (or `/dev/null`, [`Launch::quiet`]; or its
    /// terminal, [`Launch::terminal`]). An error means nothing runs:
    /// a program that cannot be found or executed, or a directory, cgroup or limit the
    /// child could not take.
    pub fn spawn(self) -> io::Result<Started> {
        let program = super::program::resolve(&self.program, &self.env)?;
        let strings = Strings::new(&program, &self.program, &self.args, &self.env)?;
        // Every descriptor the child moves comes from above the ones it moves to, so
        // that placing one never overwrites another still to be placed.
        let null = above_targets(open_null()?)?;
        let stdin = self.stdin.map(above_targets).transpose()?;
        let input = stdin.as_ref().map_or(null.as_raw_fd(), AsRawFd::as_raw_fd);
        let terminal = self.terminal && stdin.is_some();
        let (out, err) = if self.quiet || terminal {
            (None, None)
        } else {
            (Some(pipe_pair()?), Some(pipe_pair()?))
        };
        let quiet = if terminal { input } else { null.as_raw_fd() };
        let write_end = |pipe: &Option<(OwnedFd, OwnedFd)>| {
            pipe.as_ref().map_or(quiet, |(_, write)| write.as_raw_fd())
        };
        let file = self.file.map(above_targets).transpose()?;
        if self.extra_files.len() > (PLACED_MAX - FILE_FD) as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "too many descriptors",
            ));
        }
        let extra = self
            .extra_files
            .into_iter()
            .map(above_targets)
            .collect::<io::Result<Vec<_>>>()?;
        let mut plan = Plan {
            program: strings.program.clone(),
            argv: pointers(&strings.argv),
            envp: pointers(&strings.envp),
            cwd: c_string(self.cwd.as_os_str())?,
            stdio: [input, write_end(&out), write_end(&err)],
            file: file.as_ref().map(AsRawFd::as_raw_fd),
            extra: extra.iter().map(AsRawFd::as_raw_fd).collect(),
            highest_fd: highest_open_fd(),
            procs: self.cgroup_procs,
            rlimits: self.rlimits,
            no_new_privs: self.no_new_privs,
            error: 0,
        };
        let (pid, pidfd) = clone_and_exec(&mut plan)?;
        let mut started = Started {
            pid,
            stdout: out.map(|(read, _)| read),
            stderr: err.map(|(read, _)| read),
            pidfd: Arc::new(pidfd),
            reaped: false,
        };
        // The child exec'd or ended: its copies of the write ends, `/dev/null` and the
        // file are its own now (these are dropped on return).
        // SAFETY: the child wrote it, if at all, before the clone returned.
        #[allow(unsafe_code)]
        let error = unsafe { std::ptr::read_volatile(&plan.error) };
        if error != 0 {
            let _ = started.wait_blocking();
            return Err(io::Error::from_raw_os_error(error));
        }
        Ok(started)
    }
}

/// The C strings the child's pointers point into.
struct Strings {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Strings {
    fn new(
        program: &Path,
        argv0: &OsStr,
        args: &[OsString],
        env: &[(OsString, OsString)],
    ) -> io::Result<Strings> {
        let mut argv = vec![c_string(argv0)?];
        for arg in args {
            argv.push(c_string(arg)?);
        }
        let mut envp = Vec::with_capacity(env.len());
        for (name, value) in env {
            let mut entry = name.clone();
            entry.push("=");
            entry.push(value);
            envp.push(c_string(&entry)?);
        }
        Ok(Strings {
            program: c_string(program.as_os_str())?,
            argv,
            envp,
        })
    }
}

fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn c_string(text: &OsStr) -> io::Result<CString> {
    CString::new(text.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "an argument or variable holds a NUL",
        )
    })
}

fn open_null() -> io::Result<OwnedFd> {
    let file = std::fs::File::open("/dev/null")?;
    Ok(OwnedFd::from(file))
}

/// The highest descriptor open now, for the child's fallback where `close_range` is
/// not allowed (0 where it is); a descriptor opened later by another thread is opened
/// close-on-exec.
fn highest_open_fd() -> RawFd {
    static CLOSE_RANGE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: close_range(2) over descriptors no process can hold closes nothing.
    #[allow(unsafe_code)]
    let allowed = *CLOSE_RANGE.get_or_init(|| unsafe {
        libc::syscall(
            libc::SYS_close_range,
            libc::c_uint::MAX - 1,
            libc::c_uint::MAX,
            0,
        ) == 0
    });
    if allowed {
        return 0;
    }
    std::fs::read_dir("/proc/self/fd")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<RawFd>().ok())
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(1024)
}

/// Clones with every signal blocked (no handler of the worker's may run in the child),
/// and returns once the child exec'd or failed, with its pidfd.
fn clone_and_exec(plan: &mut Plan) -> io::Result<(i32, OwnedFd)> {
    let mut stack = vec![0u8; STACK];
    let mut pidfd: libc::c_int = -1;
    // SAFETY: the stack is ours and outlives the child's use of it (CLONE_VFORK returns
    // only after its exec or exit); the top is 16-byte aligned as the ABI wants. The
    // raw signal masks (all 64 signals, the C library's own included) are restored
    // before returning. The kernel writes the pidfd before the clone returns.
    #[allow(unsafe_code)]
    unsafe {
        let top = stack.as_mut_ptr().add(STACK);
        let top = top.sub(top as usize % 16);
        let all: u64 = !0;
        let mut old: u64 = 0;
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &all as *const u64,
            &mut old as *mut u64,
            8usize,
        );
        let pid = libc::clone(
            child,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            (plan as *mut Plan).cast(),
            &mut pidfd as *mut libc::c_int,
        );
        let error = io::Error::last_os_error();
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &old as *const u64,
            std::ptr::null_mut::<u64>(),
            8usize,
        );
        if pid < 0 {
            return Err(error);
        }
        Ok((pid, OwnedFd::from_raw_fd(pidfd)))
    }
}

/// The child, between the clone and the exec.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `Plan`, alive and untouched while the parent waits
    // (CLONE_VFORK). Only async-signal-safe system calls follow; on failure the errno is
    // left in the plan for the parent and the child exits without unwinding.
    #[allow(unsafe_code)]
    unsafe {
        let plan = &mut *arg.cast::<Plan>();
        match prepare(plan) {
            Ok(()) => {
                libc::execve(
                    plan.program.as_ptr(),
                    plan.argv.as_ptr(),
                    plan.envp.as_ptr(),
                );
                plan.error = errno();
            }
            Err(e) => plan.error = e,
        }
        if plan.error == 0 {
            plan.error = libc::EINVAL;
        }
        libc::_exit(127)
    }
}

#[allow(unsafe_code)]
unsafe fn prepare(plan: &Plan) -> Result<(), i32> {
    let check = |r: libc::c_int| if r < 0 { Err(errno()) } else { Ok(()) };
    // Default dispositions: nothing of the worker's signal handling. The system call
    // itself, since the C library keeps its own signals from `sigaction`; all zero is
    // SIG_DFL, no flags and an empty mask.
    let default = [0u64; 4];
    for signal in 1..=libc::SIGRTMAX() {
        if signal != libc::SIGKILL && signal != libc::SIGSTOP {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                default.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8usize,
            );
        }
    }
    // Its own process group: a signal to the worker's (a terminal's ^C) is not its.
    check(libc::setpgid(0, 0))?;
    check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
    place_descriptors(plan)?;
    check(libc::chdir(plan.cwd.as_ptr()))?;
    for file in &plan.procs {
        let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        check(fd)?;
        let written = libc::write(fd, b"0".as_ptr().cast(), 1);
        let error = errno();
        libc::close(fd);
        if written != 1 {
            return Err(error);
        }
    }
    for &(resource, value) in &plan.rlimits {
        let limit = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        check(libc::setrlimit(resource, &limit))?;
    }
    if plan.no_new_privs {
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    }
    // Last, as `posix_spawn` does: until now a signal to the worker's group (^C, ^Z)
    // could have ended or stopped the child half-prepared.
    let none: u64 = 0;
    libc::syscall(
        libc::SYS_rt_sigprocmask,
        libc::SIG_SETMASK,
        &none as *const u64,
        std::ptr::null_mut::<u64>(),
        8usize,
    );
    Ok(())
}

/// The child's descriptors: its stdio, the file and the extra ones at their places,
/// and nothing else of the worker's. In the child before exec, as [`prepare`].
#[allow(unsafe_code)]
unsafe fn place_descriptors(plan: &Plan) -> Result<(), i32> {
    for (target, &source) in plan.stdio.iter().enumerate() {
        place(source, target as RawFd)?;
    }
    match plan.file {
        Some(file) => place(file, FILE_FD)?,
        // `/dev/null` holds the place: nothing of the worker's may stand there.
        None if !plan.extra.is_empty() => place(plan.stdio[0], FILE_FD)?,
        None => {}
    }
    for (n, &fd) in plan.extra.iter().enumerate() {
        place(fd, FILE_FD + 1 + n as RawFd)?;
    }
    // Nothing else of the worker's: not even a descriptor it inherited without
    // close-on-exec from whatever started it, which bubblewrap would hand on.
    let first = if !plan.extra.is_empty() {
        FILE_FD + 1 + plan.extra.len() as RawFd
    } else if plan.file.is_some() {
        FILE_FD + 1
    } else {
        3
    };
    let closed = libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0);
    if closed < 0 {
        // Older kernels and seccomp profiles: one by one, as far as any was open.
        for fd in first..=plan.highest_fd {
            libc::close(fd);
        }
    }
    Ok(())
}

/// `source` at `target`, kept open across exec.
#[allow(unsafe_code)]
unsafe fn place(source: RawFd, target: RawFd) -> Result<(), i32> {
    let placed = if source == target {
        libc::fcntl(target, libc::F_SETFD, 0)
    } else {
        libc::dup2(source, target)
    };
    if placed < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn output(launch: Launch) -> (ExitStatus, String, String) {
        let mut started = launch.spawn().expect("spawn");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let receiver = |fd: Option<OwnedFd>| {
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd.expect("a pipe")).expect("pipe")
        };
        let mut stdout = receiver(started.stdout.take());
        let mut stderr = receiver(started.stderr.take());
        stdout.read_to_end(&mut out).await.expect("read");
        stderr.read_to_end(&mut err).await.expect("read");
        let status = started.wait().await.expect("wait");
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        (status, text(out), text(err))
    }

    /// The worker ignores SIGPIPE and may block or handle others; none of that reaches
    /// the process. It holds only the descriptors it was given, runs where it was told,
    /// with exactly its environment, and leads its own process group.
    #[tokio::test]
    async fn a_process_starts_clean_with_only_what_it_was_given() {
        let dir = std::env::temp_dir().join(format!("cairn-spawn-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("here"), "").expect("file");
        let path = Pairs::from([("PATH", super::super::DEFAULT_PATH), ("ONLY", "this")]);

        let mut signals = Launch::new("grep");
        signals
            .args(["-E", "^Sig(Blk|Ign):", "/proc/self/status"])
            .envs(&path.0);
        let (status, out, err) = output(signals).await;
        assert!(status.success(), "{err}");
        assert_eq!(
            out,
            "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n"
        );

        let mut descriptors = Launch::new("ls");
        descriptors.arg("/proc/self/fd").envs(&path.0);
        descriptors.file = Some(OwnedFd::from(
            std::fs::File::open(dir.join("here")).expect("open"),
        ));
        let (_, out, err) = output(descriptors).await;
        // 0, 1, 2, the file at 3, and the directory `ls` reads.
        assert_eq!(
            out.split_whitespace().collect::<Vec<_>>(),
            ["0", "1", "2", "3", "4"],
            "{err}"
        );

        let mut shell = Launch::new("sh");
        shell
            .args([
                "-c",
                "ls; echo \"$ONLY-${HOME:-unset}\"; ps -o pgid= -p $$; echo $$",
            ])
            .envs(&path.0);
        shell.cwd = dir.clone();
        let (status, out, err) = output(shell).await;
        assert!(status.success(), "{err}");
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        assert_eq!(lines[..2], ["here", "this-unset"], "{out}");
        assert_eq!(lines[2], lines[3], "its own process group: {out}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn what_cannot_start_is_an_error_and_nothing_runs() {
        let missing = Launch::new("cairn-no-such-program").spawn();
        assert_eq!(
            missing.map(|s| s.pid).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        let mut elsewhere = Launch::new("/bin/true");
        elsewhere.cwd = PathBuf::from("/nonexistent-cairn-directory");
        let error = elsewhere.spawn().map(|s| s.pid).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENOENT), "{error}");
        let mut no_group = Launch::new("/bin/true");
        no_group.cgroup_procs =
            vec![CString::new("/nonexistent-cairn-cgroup/cgroup.procs").expect("c")];
        assert!(no_group.spawn().is_err());
    }

    /// Exit codes and signals come back as they were; a quiet process has no pipes; a
    /// process dropped unreaped is killed and reaped.
    #[tokio::test]
    async fn exits_are_reported_and_a_dropped_process_ends() {
        let path = Pairs::from([("PATH", super::super::DEFAULT_PATH)]);
        let status = |script: &str| {
            let mut launch = Launch::new("sh");
            launch.args(["-c", script]).envs(&path.0);
            launch.quiet = true;
            launch
        };
        let mut exited = status("exit 3").spawn().expect("spawn");
        assert!(exited.stdout.is_none() && exited.stderr.is_none());
        assert_eq!(exited.wait().await.expect("wait").code(), Some(3));
        let mut killed = status("kill -9 $$").spawn().expect("spawn");
        assert_eq!(killed.wait().await.expect("wait").signal(), Some(9));

        let sleeping = status("sleep 30").spawn().expect("spawn");
        let pid = sleeping.pid;
        drop(sleeping);
        let gone = async {
            while std::path::Path::new(&format!("/proc/{pid}")).exists() {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), gone)
            .await
            .expect("killed and reaped");
    }

    /// `(name, value)` pairs as the `String` map `envs` takes.
    struct Pairs(std::collections::BTreeMap<String, String>);

    impl<const N: usize> From<[(&str, &str); N]> for Pairs {
        fn from(pairs: [(&str, &str); N]) -> Pairs {
            Pairs(
                pairs
                    .into_iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
            )
        }
    }
}
