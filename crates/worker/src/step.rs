//! Running one step in its sandbox ([`crate::isolation`]): a cleared environment plus
//! the step's own, a timeout, its limits, bounded captured output, and the CPU time it
//! used.
//!
//! The step gets `SIGKILL` if the worker dies (parent-death signal), and every process
//! left in its sandbox is killed when it ends, so nothing a step started outlives it.
//! The worker never waits on a pipe a leftover process could hold: after the step ends,
//! its output is read for at most the kill grace.

use crate::isolation::{self, Isolation, Limit, Live, Running, Started};
use crate::live_output::LiveOutput;
use crate::step_output::{Bounds, Output, Pipe};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitid, Id as WaitId, WaitPidFlag};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// What to run.
#[derive(Debug, Clone)]
pub struct StepCommand {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Its workspace, working directory, home, network and limits.
    pub place: isolation::Spec,
    pub timeout: Duration,
    /// Full output goes here (`.stdout` / `.stderr` appended), bounded by `max_output`;
    /// a stream that printed nothing has no file.
    pub output_base: PathBuf,
    /// The same bytes, as they are printed, to the artifact store (a run's steps).
    pub live: Option<LiveOutput>,
    pub max_output: u64,
    pub tail_bytes: usize,
    /// Redact secrets from the stored output and tails.
    pub redact: bool,
    pub kill_grace: Duration,
    /// Its standard input or terminal, if it has one (a sandbox's exec); else it reads
    /// `/dev/null`.
    pub input: Option<Arc<crate::interactive::Input>>,
}

/// Why a step stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interruption {
    TimedOut,
    /// The job was cancelled (run cancelled, drain, or the lease was lost).
    Stopped,
    /// It passed a limit of its sandbox.
    Limit(Limit),
}

/// How a step ended and what it cost.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub interrupted: Option<Interruption>,
    pub wall_ms: i64,
    pub cpu_ms: i64,
    /// SHA-256 over stdout then stderr as captured.
    pub output_digest: String,
    pub stdout_tail: String,
    pub stderr_tail: String,
    pub stdout_path: PathBuf,
    pub truncated: bool,
    /// The sandbox it ran in, as its receipt records it.
    pub sandbox: serde_json::Value,
    /// The limit it passed, if any.
    pub limit: Option<Limit>,
}

impl StepOutcome {
    /// What its receipt records.
    pub fn journal(&self) -> cairn_common::journal::Outcome {
        cairn_common::journal::Outcome {
            exit_code: self.exit_code,
            signal: self.signal,
            timed_out: self.interrupted == Some(Interruption::TimedOut),
            wall_ms: self.wall_ms,
            cpu_ms: self.cpu_ms,
            output_digest: self.output_digest.clone(),
            stdout_tail: self.stdout_tail.clone(),
            stderr_tail: self.stderr_tail.clone(),
            output_artifact: self
                .stdout_path
                .with_extension("")
                .to_string_lossy()
                .into_owned(),
            sandbox: self.sandbox.clone(),
            limit: self.limit.map(|l| l.as_str().to_string()),
            cancelled: false,
        }
    }

    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && self.interrupted.is_none() && self.limit.is_none()
    }

    pub fn describe(&self) -> String {
        if self.limit == Some(Limit::Disk) {
            return format!("disk quota exceeded ({})", Limit::Disk.as_str());
        }
        if let Some(limit) = self.limit {
            return format!("passed its limit ({})", limit.as_str());
        }
        match (self.interrupted, self.exit_code, self.signal) {
            (Some(Interruption::TimedOut), _, _) => "timed out".into(),
            (Some(Interruption::Limit(limit)), _, _) => {
                format!("passed its limit ({})", limit.as_str())
            }
            (Some(Interruption::Stopped), _, _) => "stopped".into(),
            (None, Some(code), _) => format!("exited with status {code}"),
            (None, None, Some(signal)) => format!("killed by signal {signal}"),
            (None, None, None) => "ended".into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("cannot start {program:?}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot start: {0}")]
    Cwd(#[from] isolation::CwdRefused),
    #[error("cannot start: {0}")]
    Network(String),
    #[error("step I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

impl From<isolation::CommandError> for StepError {
    fn from(e: isolation::CommandError) -> StepError {
        match e {
            isolation::CommandError::Cwd(e) => StepError::Cwd(e),
            isolation::CommandError::Variables(e) => StepError::Io(e),
            e @ (isolation::CommandError::Network(_) | isolation::CommandError::Allow(_)) => {
                StepError::Network(e.to_string())
            }
        }
    }
}

/// Runs a step to its end, its timeout, a limit, or `stop`.
pub async fn run(
    command: &StepCommand,
    sandbox: &Isolation,
    stop: &CancellationToken,
) -> Result<StepOutcome, StepError> {
    run_published(command, sandbox, stop, &Live::default()).await
}

/// [`run`], publishing the running sandbox in `live` while it runs, so a pause can
/// freeze and thaw it.
pub async fn run_published(
    command: &StepCommand,
    sandbox: &Isolation,
    stop: &CancellationToken,
    live: &Live,
) -> Result<StepOutcome, StepError> {
    run_spawned(command, sandbox, stop, live, None).await
}

/// [`run`] inside a sandbox resource's held namespaces: what the command leaves running
/// in the background stays, for the session to end; a timeout or a stop ends the
/// command's own process group.
pub async fn run_in(
    command: &StepCommand,
    session: &isolation::Session,
    sandbox: &Isolation,
    stop: &CancellationToken,
) -> Result<StepOutcome, StepError> {
    run_spawned(command, sandbox, stop, &Live::default(), Some(session)).await
}

/// How many times a sandbox whose network could not be attached is started again:
/// its command had not begun (bubblewrap held it), so nothing of it ran twice.
const ATTACH_TRIES: usize = 3;

/// Starts the command: in the session, or in a sandbox of its own with its network
/// attached before it begins.
async fn start(
    command: &StepCommand,
    env: &BTreeMap<String, String>,
    sandbox: &Isolation,
    session: Option<&isolation::Session>,
    program: String,
) -> Result<
    (
        Started,
        Option<isolation::cgroup::Group>,
        Option<isolation::network::Link>,
    ),
    StepError,
> {
    let mut tries = 0;
    loop {
        tries += 1;
        let (cmd, group, hold) = match session {
            Some(session) => (
                sandbox.enter(session, &command.argv, env, &command.place)?,
                None,
                None,
            ),
            None => sandbox.command(&command.argv, env, &command.place)?,
        };
        let mut cmd = cmd;
        if let Some(input) = &command.input {
            cmd.stdin = Some(input.for_child().map_err(StepError::Io)?);
            cmd.terminal = input.is_terminal();
        }
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(source) => {
                if let Some(group) = group {
                    group.remove().await;
                }
                return Err(StepError::Spawn { program, source });
            }
        };
        let Some(hold) = hold else {
            return Ok((child, group, None));
        };
        // The NAT and egress filter, attached while bubblewrap holds the command;
        // kept up until the step's end.
        match sandbox.connect(hold).await {
            Ok(link) => return Ok((child, group, Some(link))),
            Err(why) => {
                drop(child);
                if let Some(group) = group {
                    group.remove().await;
                }
                if tries >= ATTACH_TRIES {
                    return Err(StepError::Network(format!(
                        "the step's network could not be attached: {why}"
                    )));
                }
                tracing::warn!(error = %why, tries, "the step's network could not be attached; starting its sandbox again");
            }
        }
    }
}

/// A step's NAT, ended (after its filter's counters are read) when dropped.
struct Network<'a> {
    sandbox: &'a Isolation,
    link: Option<isolation::network::Link>,
}

impl Drop for Network<'_> {
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            self.sandbox.disconnect(link);
        }
    }
}

async fn run_spawned(
    command: &StepCommand,
    sandbox: &Isolation,
    stop: &CancellationToken,
    live: &Live,
    session: Option<&isolation::Session>,
) -> Result<StepOutcome, StepError> {
    let program = program_of(command)?;
    let mut env = command.env.clone();
    env.entry("PATH".into())
        .or_insert_with(|| isolation::DEFAULT_PATH.into());
    let started = Instant::now();
    let (mut child, group, link) = start(command, &env, sandbox, session, program).await?;
    // However the step ends, its network goes once its refusals are counted.
    let _network = Network { sandbox, link };
    let (stdout, stderr) =
        match input_started(command, &mut child).and_then(|()| pipes_of(&mut child)) {
            Ok(pipes) => pipes,
            Err(e) => {
                drop(child);
                if let Some(group) = group {
                    group.remove().await;
                }
                return Err(StepError::Io(e));
            }
        };
    let pid = child.pid;
    let running = Arc::new(Running {
        pid,
        // A command entering a session leads its own process group there: a signal
        // to that group reaches what it started and nothing else of the sandbox.
        isolated: sandbox.isolates() && session.is_none(),
        keeps_leftovers: session.is_some(),
        group: group.map(Arc::new),
        cpu_limit_ms: (command.place.limits.cpu_seconds).map(|s| i64::from(s) * 1000),
    });
    live.set(Some(running.clone()));
    let mut output = start_output(command, stdout, stderr);

    let interrupted = wait_for_end(command, &running, stop).await;
    let cpu_ms = running.cpu_ms().unwrap_or_else(|| cpu_ms_of_zombie(pid));
    let limit = match interrupted {
        Some(Interruption::Limit(limit)) => Some(limit),
        _ => running.breach(),
    };
    live.set(None);
    let status = child.wait().await?;
    let wall_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let limit = match limit {
        None => quota_reached(command, &status, interrupted).await,
        breached => breached,
    };
    end_leftovers(&running);
    let (output_digest, (stdout_tail, stderr_tail), truncated) =
        output.finish(command.kill_grace, pid).await?;
    use std::os::unix::process::ExitStatusExt;
    Ok(StepOutcome {
        exit_code: status.code(),
        signal: status.signal(),
        interrupted,
        wall_ms,
        cpu_ms,
        output_digest,
        stdout_tail,
        stderr_tail,
        stdout_path: output.stdout_path,
        truncated,
        sandbox: sandbox.describe(&command.place),
        limit,
    })
}

/// Reads the step's streams into its output files, within its bounds, and to its live
/// followers.
fn start_output(command: &StepCommand, stdout: Pipe, stderr: Pipe) -> Output {
    let bounds = Bounds {
        max: command.max_output,
        tail: command.tail_bytes,
        redact: command.redact,
    };
    let live = command.live.as_ref();
    Output::start(&command.output_base, bounds, live, stdout, stderr)
}

/// Whatever the step left running ends with it; its cgroup goes once the kernel has
/// moved the last process out, not on the step's time.
fn end_leftovers(running: &Running) {
    running.end_leftovers();
    if let Some(group) = running.group.clone() {
        tokio::spawn(async move { group.remove().await });
    }
}

/// The program a command starts; an empty argv starts nothing.
fn program_of(command: &StepCommand) -> Result<String, StepError> {
    match command.argv.first() {
        Some(program) if !program.is_empty() => Ok(program.clone()),
        _ => Err(StepError::Spawn {
            program: String::new(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty argv"),
        }),
    }
}

/// The command started: this worker's copy of its input's end goes, and a terminal's
/// output (relayed into a pipe) is its stdout.
fn input_started(command: &StepCommand, child: &mut Started) -> std::io::Result<()> {
    if let Some(Some(relayed)) = command.input.as_ref().map(|i| i.started()).transpose()? {
        child.stdout = Some(relayed);
    }
    Ok(())
}

/// The child's output pipes, registered with the runtime once the process is ours to
/// drop: on a failure it is killed and reaped as the child goes.
fn pipes_of(child: &mut Started) -> std::io::Result<(Pipe, Pipe)> {
    let receiver = |fd: Option<std::os::fd::OwnedFd>| {
        fd.map(tokio::net::unix::pipe::Receiver::from_owned_fd)
            .transpose()
    };
    Ok((
        receiver(child.stdout.take())?,
        receiver(child.stderr.take())?,
    ))
}

/// Waits for the step to end: on its own, at a limit, at its timeout or when stopped
/// (then its processes are ended: at a limit at once, else after the grace). The exit
/// is not reaped, so its CPU time can still be read from /proc.
async fn wait_for_end(
    command: &StepCommand,
    running: &Running,
    stop: &CancellationToken,
) -> Option<Interruption> {
    let pid = running.pid;
    let exited = tokio::task::spawn_blocking(move || {
        waitid(
            WaitId::Pid(Pid::from_raw(pid)),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
        )
    });
    tokio::pin!(exited);
    let breached = watch_limits(running);
    tokio::pin!(breached);
    // Biased: a step that already ended is an ended step, even if a stop arrived at the
    // same moment; its receipt is then written (or refused by the fence).
    let mut exit_seen = false;
    let interrupted = tokio::select! {
        biased;
        _ = &mut exited => { exit_seen = true; None },
        limit = &mut breached => Some(Interruption::Limit(limit)),
        _ = tokio::time::sleep(command.timeout) => Some(Interruption::TimedOut),
        _ = stop.cancelled() => Some(Interruption::Stopped),
    };
    // A step that ended on its own while the stop arrived (say the worker was paused
    // meanwhile) ended: its outcome is recorded, or refused by the fence.
    let interrupted = match interrupted {
        Some(Interruption::Stopped) if has_exited(pid) => None,
        other => other,
    };
    match interrupted {
        // Past a limit there is no grace: it would only grow further.
        Some(Interruption::Limit(_)) => {
            running.kill_all();
            let _ = exited.await;
        }
        Some(_) => terminate(running, command.kill_grace, &mut exited).await,
        None if !exit_seen => {
            let _ = exited.await;
        }
        None => {}
    }
    interrupted
}

/// A step that failed on its own at its disk quota is told so: its own message may be
/// anything.
async fn quota_reached(
    command: &StepCommand,
    status: &std::process::ExitStatus,
    interrupted: Option<Interruption>,
) -> Option<Limit> {
    if status.success() || interrupted.is_some() {
        return None;
    }
    let place = &command.place;
    let (tree, home) = (place.workspace.clone(), place.home.clone());
    let full = tokio::task::spawn_blocking(move || {
        crate::disk::exhausted(&tree) || crate::disk::exhausted(&home)
    })
    .await
    .unwrap_or(false);
    full.then_some(Limit::Disk)
}

/// Resolves with the first limit the sandbox passes; never, without a cgroup to count.
async fn watch_limits(running: &Running) -> Limit {
    if running.group.is_none() {
        return std::future::pending().await;
    }
    let mut every = tokio::time::interval(Duration::from_millis(100));
    loop {
        every.tick().await;
        if let Some(limit) = running.breach() {
            return limit;
        }
    }
}

/// Whether the process has exited (without reaping it).
fn has_exited(pid: i32) -> bool {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    !matches!(
        waitid(WaitId::Pid(Pid::from_raw(pid)), flags),
        Ok(nix::sys::wait::WaitStatus::StillAlive) | Err(_)
    )
}

/// SIGTERM to every process of the sandbox, SIGKILL to all after the grace period.
async fn terminate<F>(running: &Running, grace: Duration, exited: &mut std::pin::Pin<&mut F>)
where
    F: std::future::Future,
{
    running.signal_all(Signal::SIGTERM);
    if tokio::time::timeout(grace, exited.as_mut()).await.is_err() {
        running.kill_all();
        exited.as_mut().await;
    }
}

/// User plus system CPU time of an exited, unreaped process and of the children it
/// waited for, from `/proc/<pid>/stat`.
fn cpu_ms_of_zombie(pid: i32) -> i64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the parenthesised command name; utime is field 14 (index 11 here).
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: i64 = [11, 12, 13, 14]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|f| f.parse::<i64>().ok()))
        .sum();
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .unwrap_or(100);
    ticks * 1000 / per_second
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step_output::{output_base, stream_path};
    use std::path::Path;

    fn command(argv: &[&str], timeout: Duration, dir: &Path) -> StepCommand {
        StepCommand {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::from([("GREETING".to_string(), "hello".to_string())]),
            place: isolation::Spec {
                workspace: dir.to_path_buf(),
                cwd: None,
                home: dir.to_path_buf(),
                network: cairn_common::egress::Effective::flag(true),
                limits: Default::default(),
                identity: None,
                volumes: Vec::new(),
            },
            timeout,
            output_base: dir.join("out").join("step"),
            live: None,
            max_output: 16,
            tail_bytes: 8,
            redact: true,
            kill_grace: Duration::from_millis(200),
            input: None,
        }
    }

    /// Process groups only: these tests are about the step runner, not the namespaces.
    fn unsandboxed() -> Isolation {
        Isolation::start(isolation::Settings {
            mode: isolation::Mode::Off,
            bwrap: "bwrap".into(),
            uid: 1000,
            gid: 1000,
            network_default: true,
            defaults: Default::default(),
            read_only: Vec::new(),
            read_write: Vec::new(),
            cgroups: true,
            egress_allow: Vec::new(),
            etc_dir: std::env::temp_dir()
                .join(format!("cairn-step-etc-{}", uuid::Uuid::new_v4().simple())),
        })
        .expect("an unsandboxed runner")
    }

    fn scratch() -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("cairn-step-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("scratch");
        dir
    }

    #[tokio::test]
    async fn runs_with_only_its_environment_and_bounds_output() {
        let dir = scratch();
        std::env::set_var("CAIRN_SHOULD_NOT_LEAK", "secret");
        let cmd = command(&["sh", "-c", "echo $GREETING-${CAIRN_SHOULD_NOT_LEAK:-none}; echo 0123456789012345678901234; exit 3"], Duration::from_secs(10), &dir);
        let outcome = run(&cmd, &unsandboxed(), &CancellationToken::new())
            .await
            .expect("run");
        assert_eq!(outcome.exit_code, Some(3));
        assert!(!outcome.succeeded());
        let artifact = std::fs::read_to_string(&outcome.stdout_path).expect("artifact");
        assert_eq!(
            artifact, "hello-none\n01234",
            "bounded to 16 bytes, environment cleared"
        );
        assert!(outcome.truncated);
        assert_eq!(
            outcome.stdout_tail, "8901234\n",
            "the last 8 bytes of the whole stream"
        );
        assert_eq!(outcome.output_digest.len(), 64);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn each_epoch_of_a_step_has_its_own_output_files() {
        let artifacts = Path::new("/artifacts");
        let request = uuid::Uuid::new_v4();
        let (first, second) = (
            output_base(artifacts, request, "build.v2", 1),
            output_base(artifacts, request, "build.v2", 2),
        );
        assert_ne!(
            stream_path(&first, "stdout"),
            stream_path(&second, "stdout")
        );
        assert!(stream_path(&first, "stderr")
            .to_string_lossy()
            .ends_with("build.v2.epoch-1.stderr"));
    }

    #[tokio::test]
    async fn a_stream_that_printed_nothing_leaves_no_file() {
        let dir = scratch();
        let cmd = command(
            &["sh", "-c", "echo oops >&2"],
            Duration::from_secs(10),
            &dir,
        );
        // What an earlier command of this epoch left at the same path (a sandbox's exec
        // key reused, a step run again) is not this one's output.
        std::fs::create_dir_all(dir.join("out")).expect("out");
        std::fs::write(outcome_path(&cmd, "stdout"), "stale").expect("stale");
        let outcome = run(&cmd, &unsandboxed(), &CancellationToken::new())
            .await
            .expect("run");
        assert!(outcome.succeeded());
        assert!(
            !outcome.stdout_path.exists(),
            "no stdout file for a step that printed nothing"
        );
        assert_eq!(
            std::fs::read_to_string(outcome_path(&cmd, "stderr")).expect("stderr"),
            "oops\n"
        );
        assert_eq!(outcome.stdout_tail, "");
        let _ = std::fs::remove_dir_all(dir);
    }

    fn outcome_path(cmd: &StepCommand, stream: &str) -> PathBuf {
        stream_path(&cmd.output_base, stream)
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_process_group() {
        let dir = scratch();
        let marker = dir.join("survivor");
        let script = format!("(sleep 1; touch {}) & sleep 30", marker.display());
        let cmd = command(&["sh", "-c", &script], Duration::from_millis(300), &dir);
        let started = Instant::now();
        let outcome = run(&cmd, &unsandboxed(), &CancellationToken::new())
            .await
            .expect("run");
        assert_eq!(outcome.interrupted, Some(Interruption::TimedOut));
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            !marker.exists(),
            "a background child of the step was killed with it"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn stop_interrupts_and_cpu_time_is_charged() {
        let dir = scratch();
        let stop = CancellationToken::new();
        let cancel = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            cancel.cancel();
        });
        // Burn CPU until stopped.
        let cmd = command(
            &["sh", "-c", "while :; do :; done"],
            Duration::from_secs(30),
            &dir,
        );
        let outcome = run(&cmd, &unsandboxed(), &stop).await.expect("run");
        assert_eq!(outcome.interrupted, Some(Interruption::Stopped));
        assert!(outcome.cpu_ms >= 200, "cpu {} ms", outcome.cpu_ms);
        assert!(outcome.wall_ms >= 600);
        let _ = std::fs::remove_dir_all(dir);
    }
}
