//! The step's isolation on this host (invariant 10), through the step runner the worker
//! uses: what a step can see, reach and use, and that nothing it starts outlives it.
//! The end-to-end tests (`tests/tests/e2e/sandbox.rs`) drive the same through the API.

use cairn_common::run::{StepLimits, MAX_VARIABLES};
use cairn_worker::isolation::{self, Isolation, Limit, Mode};
use cairn_worker::step::{self, Interruption, StepCommand, StepError, StepOutcome};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn settings() -> isolation::Settings {
    isolation::Settings {
        mode: Mode::Required,
        bwrap: "bwrap".into(),
        uid: 1000,
        gid: 1000,
        network_default: true,
        defaults: StepLimits::default(),
        read_only: Vec::new(),
        read_write: Vec::new(),
        cgroups: true,
        egress_allow: Vec::new(),
        etc_dir: std::env::temp_dir().join(format!(
            "cairn-sandbox-etc-{}",
            uuid::Uuid::new_v4().simple()
        )),
    }
}

/// The full sandbox: this machine allows it (the setup installs bubblewrap), and a test
/// that silently ran without it would prove nothing.
fn sandbox() -> Isolation {
    Isolation::start(settings()).expect("this machine gives steps the full sandbox")
}

struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("cairn-sandbox-{}", uuid::Uuid::new_v4().simple()));
        for sub in ["workspace", "home", "out"] {
            std::fs::create_dir_all(dir.join(sub)).expect("scratch");
        }
        Scratch { dir }
    }

    fn workspace(&self) -> PathBuf {
        self.dir.join("workspace")
    }

    fn command(&self, argv: &[&str]) -> StepCommand {
        StepCommand {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::from([("HOME".to_string(), isolation::HOME.to_string())]),
            place: isolation::Spec {
                workspace: self.workspace(),
                cwd: None,
                home: self.dir.join("home"),
                network: cairn_common::egress::Effective::flag(false),
                limits: StepLimits::default(),
                identity: None,
                volumes: Vec::new(),
            },
            timeout: Duration::from_secs(30),
            output_base: self
                .dir
                .join("out")
                .join(uuid::Uuid::new_v4().simple().to_string()),
            live: None,
            max_output: 1024 * 1024,
            tail_bytes: 64 * 1024,
            redact: false,
            kill_grace: Duration::from_millis(500),
            input: None,
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn run(sandbox: &Isolation, command: &StepCommand) -> StepOutcome {
    step::run(command, sandbox, &CancellationToken::new())
        .await
        .expect("the step starts")
}

async fn sh(sandbox: &Isolation, scratch: &Scratch, script: &str) -> StepOutcome {
    run(sandbox, &scratch.command(&["sh", "-c", script])).await
}

/// The held namespaces of a sandbox resource, at `command`'s place.
async fn session(sandbox: &Isolation, command: &StepCommand) -> isolation::Session {
    sandbox
        .start_session(
            &command.place,
            &isolation::identity::make(uuid::Uuid::new_v4()).expect("an identity"),
        )
        .await
        .expect("a session")
        .expect("namespaces here")
}

/// Host processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            found.push(format!("{:?}: {cmdline}", entry.file_name()));
        }
    }
    found
}

#[tokio::test]
async fn the_worker_environment_and_processes_are_out_of_sight() {
    let sandbox = sandbox();
    let scratch = Scratch::new();
    // What a worker holds in its environment.
    std::env::set_var("CAIRN_SANDBOX_TEST_SECRET", "hunter2-worker-secret");
    let out = sh(
        &sandbox,
        &scratch,
        "tr '\\0' '\\n' </proc/$PPID/environ; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' <$f; done; \
         echo; echo pids: $(ls -d /proc/[0-9]* | wc -l); id -u; id -g",
    )
    .await;
    assert!(out.succeeded(), "{out:?}");
    assert!(
        !out.stdout_tail.contains("hunter2"),
        "the worker's environment leaked: {}",
        out.stdout_tail
    );
    let lines: Vec<&str> = out.stdout_tail.lines().collect();
    // Its namespace's init, the shell, and the shell's children: nothing of the host.
    let pids: usize = lines
        .iter()
        .find_map(|l| l.strip_prefix("pids: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("a count");
    assert!(pids <= 6, "{pids} processes visible: {}", out.stdout_tail);
    assert_eq!(
        lines[lines.len() - 2..],
        ["1000", "1000"],
        "{}",
        out.stdout_tail
    );
    assert_eq!(out.sandbox["isolated"], true, "{}", out.sandbox);
}

/// bubblewrap, and nsenter into a sandbox resource's namespaces, run on the host with
/// the worker's authority. A step's variables must reach the step and never the
/// launcher's own dynamic loader: `LD_PRELOAD` there would run the step's code as the
/// worker, outside every namespace. `LD_DEBUG` shows which programs' loaders saw them.
/// Nor may a variable stand on a host command line, which every user can read.
#[tokio::test]
async fn a_steps_variables_reach_it_and_never_the_host_side_launcher() {
    let sandbox = sandbox();
    let scratch = Scratch::new();
    let secret = format!("hunter2-{}", uuid::Uuid::new_v4().simple());
    let with_variables = |argv: &[&str]| {
        let mut command = scratch.command(argv);
        command.env.extend([
            ("LD_DEBUG".to_string(), "libs".to_string()),
            ("-u".to_string(), "a name like an option".to_string()),
            ("SECRET".to_string(), format!("{secret} two\nlines=")),
        ]);
        command
    };
    // While the command runs (a second), no host process's command line holds the
    // secret: bubblewrap's, nsenter's (which waits for it) or any other.
    let exposed = || async {
        let mut seen = Vec::new();
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(25)).await;
            seen.extend(processes_with(&secret));
        }
        seen
    };
    let command = with_variables(&["sh", "-c", "sleep 1; exec /usr/bin/env"]);
    let (plain, seen) = tokio::join!(run(&sandbox, &command), exposed());
    assert_eq!(seen, Vec::<String>::new(), "bwrap");
    let session = session(&sandbox, &command).await;
    let command = with_variables(&["sh", "-c", "sleep 1; exec /usr/bin/env"]);
    let stop = CancellationToken::new();
    let (entered, seen) =
        tokio::join!(step::run_in(&command, &session, &sandbox, &stop), exposed());
    assert_eq!(seen, Vec::<String>::new(), "nsenter");
    let direct = with_variables(&["/usr/bin/env"]);
    let entered_directly = step::run_in(&direct, &session, &sandbox, &stop)
        .await
        .expect("the command starts");
    session.end(&sandbox).await;
    let entered = entered.expect("the command starts");
    let plain_directly = run(&sandbox, &with_variables(&["/usr/bin/env"])).await;
    let cases = [
        ("bwrap", plain, false),
        ("bwrap", plain_directly, true),
        ("nsenter", entered, false),
        ("nsenter", entered_directly, true),
    ];
    for (how, out, env_itself) in cases {
        assert!(out.succeeded(), "{how}: {out:?}");
        let stdout = std::fs::read_to_string(&out.stdout_path).expect("stdout");
        let stderr_path = out.stdout_path.with_extension("stderr");
        let stderr = std::fs::read_to_string(&stderr_path).expect("stderr");
        let loaded = |program: &str| {
            stderr
                .lines()
                .any(|l| l.contains("initialize program:") && l.trim_end().ends_with(program))
        };
        assert!(
            loaded("/usr/bin/env"),
            "{how}: the step's loader sees its variables: {stderr}"
        );
        assert!(
            !loaded(how),
            "{how}'s loader on the host saw the step's variables: {stderr}"
        );
        assert!(
            stdout.contains(&format!("\nSECRET={secret} two\nlines=\n")),
            "{how}: {stdout}"
        );
        // `sh` drops a name it cannot hold; `env` run directly shows it arrived.
        if env_itself {
            assert!(
                stdout.contains("-u=a name like an option\n"),
                "{how}: {stdout}"
            );
        }
    }
}

/// The most variables a request may give a command all reach it: bubblewrap takes each
/// as three of its at most 9,000 arguments.
#[tokio::test]
async fn the_most_variables_a_request_may_give_reach_the_step() {
    let sandbox = sandbox();
    let scratch = Scratch::new();
    let mut command = scratch.command(&["/usr/bin/env"]);
    command.env = (0..MAX_VARIABLES)
        .map(|i| (format!("CAIRN_V{i}"), format!("value {i}")))
        .collect();
    let out = run(&sandbox, &command).await;
    assert!(out.succeeded(), "{out:?}");
    let stdout = std::fs::read_to_string(&out.stdout_path).expect("stdout");
    let seen = stdout.lines().filter(|l| l.starts_with("CAIRN_V")).count();
    assert_eq!(seen, MAX_VARIABLES);
}

/// bubblewrap and nsenter are the host's, found on the worker's own PATH: a step's PATH,
/// which may name a directory the step wrote, never chooses the program the worker
/// runs on the host.
#[tokio::test]
async fn a_steps_path_never_chooses_the_launcher() {
    use std::os::unix::fs::PermissionsExt;
    let sandbox = sandbox();
    let scratch = Scratch::new();
    let fake = scratch.dir.join("fake-bin");
    std::fs::create_dir_all(&fake).expect("dir");
    let marker = scratch.dir.join("ran-on-the-host");
    for name in ["bwrap", "nsenter"] {
        let path = fake.join(name);
        std::fs::write(&path, format!("#!/bin/sh\ntouch {}\n", marker.display())).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let mut command = scratch.command(&["true"]);
    command.env.insert(
        "PATH".to_string(),
        format!("{}:{}", fake.display(), isolation::DEFAULT_PATH),
    );
    let plain = run(&sandbox, &command).await;
    let session = session(&sandbox, &command).await;
    let entered = step::run_in(&command, &session, &sandbox, &CancellationToken::new())
        .await
        .expect("the command starts");
    session.end(&sandbox).await;
    assert!(
        !marker.exists(),
        "a program of the step's PATH ran on the host"
    );
    assert!(plain.succeeded(), "{plain:?}");
    assert!(entered.succeeded(), "{entered:?}");
}

/// A descriptor the worker inherited without close-on-exec (from a shell, a supervisor)
/// is the worker's, not the step's: bubblewrap hands on whatever it is given.
#[tokio::test]
async fn a_step_holds_only_its_standard_descriptors() {
    let sandbox = sandbox();
    let scratch = Scratch::new();
    let secret = scratch.dir.join("worker-only");
    std::fs::write(&secret, "the worker's").expect("write");
    let inherited = std::fs::File::open(&secret).expect("open");
    // SAFETY: fcntl(2) on a descriptor this test owns: as if inherited, open on exec.
    #[allow(unsafe_code)]
    let cleared = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&inherited),
            libc::F_SETFD,
            0,
        )
    };
    assert_eq!(cleared, 0);
    let out = sh(&sandbox, &scratch, "ls /proc/self/fd | tr '\\n' ' '").await;
    drop(inherited);
    assert!(out.succeeded(), "{out:?}");
    // 0, 1, 2 and the directory `ls` reads.
    assert_eq!(
        out.stdout_tail.split_whitespace().collect::<Vec<_>>(),
        ["0", "1", "2", "3"],
        "{}",
        out.stdout_tail
    );
}

#[tokio::test]
async fn a_step_has_no_capability_and_no_new_privileges() {
    let sandbox = sandbox();
    let scratch = Scratch::new();
    let status = run(&sandbox, &scratch.command(&["cat", "/proc/self/status"])).await;
    for field in ["CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"] {
        let line = status
            .stdout_tail
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_default()
            .to_string();
        assert!(line.ends_with("0000000000000000"), "{line}");
    }
    assert!(
        status.stdout_tail.lines().any(|l| l == "NoNewPrivs:\t1"),
        "{}",
        status.stdout_tail
    );
}

#[tokio::test]
async fn a_step_sees_only_its_workspace_home_tmp_and_a_read_only_system() {
    let sandbox = sandbox();
    let scratch = Scratch::new();
    // A sibling workspace and a snapshot store on the host, beside this one.
    let other = scratch.dir.join("other-workspace");
    std::fs::create_dir_all(&other).expect("other");
    std::fs::write(other.join("secret.txt"), "other run's file").expect("write");
    let outside = scratch.dir.join("outside-marker");
    let script = format!(
        "cat {other}/secret.txt; ls {store}; touch {outside}; touch /usr/cairn-marker; \
         touch /etc/cairn-marker; cat /etc/shadow; \
         echo in-workspace > {ws}/inside.txt && echo wrote-workspace; \
         echo tmp > /tmp/t && echo wrote-tmp; echo home > $HOME/h && echo wrote-home; ls /",
        other = other.display(),
        store = scratch.dir.display(),
        outside = outside.display(),
        ws = isolation::WORKSPACE,
    );
    let out = sh(&sandbox, &scratch, &script).await;
    assert!(!out.stdout_tail.contains("other run's file"), "{out:?}");
    assert!(!outside.exists(), "a write outside the workspace landed");
    assert!(!Path::new("/usr/cairn-marker").exists());
    assert!(!Path::new("/etc/cairn-marker").exists());
    assert!(!out.stdout_tail.contains("root:"), "{}", out.stdout_tail);
    for wrote in ["wrote-workspace", "wrote-tmp", "wrote-home"] {
        assert!(out.stdout_tail.contains(wrote), "{wrote}: {out:?}");
    }
    assert_eq!(
        std::fs::read_to_string(scratch.workspace().join("inside.txt")).expect("inside"),
        "in-workspace\n"
    );
    let root: Vec<&str> = out
        .stdout_tail
        .lines()
        .skip_while(|l| *l != "wrote-home")
        .skip(1)
        .collect();
    for absent in ["root", "work", "var", "srv", "mnt"] {
        assert!(!root.contains(&absent), "/{absent} is visible: {root:?}");
    }
}

#[tokio::test]
async fn a_symlink_cwd_out_of_the_workspace_is_refused() {
    let sandbox = sandbox();
    let scratch = Scratch::new();
    std::os::unix::fs::symlink("/", scratch.workspace().join("escape")).expect("link");
    std::fs::create_dir_all(scratch.workspace().join("src/inner")).expect("dir");
    std::os::unix::fs::symlink("src", scratch.workspace().join("inside")).expect("link");
    let mut command = scratch.command(&["cat", "passwd"]);
    command.place.cwd = Some("escape/etc".into());
    let refused = step::run(&command, &sandbox, &CancellationToken::new()).await;
    match refused {
        Err(StepError::Cwd(e)) => assert!(e.to_string().contains("leaves the workspace"), "{e}"),
        other => panic!("the symlink cwd ran: {other:?}"),
    }
    // A link that stays inside is followed.
    let mut command = scratch.command(&["pwd"]);
    command.place.cwd = Some("inside/inner".into());
    let out = run(&sandbox, &command).await;
    assert!(out.succeeded(), "{out:?}");
}

/// A step is never in the host's network namespace: with or without the network, the
/// host's loopback is out of reach; with it, the step has a NAT interface beside its
/// loopback, and without it only the loopback.
#[tokio::test]
async fn no_step_reaches_the_host_loopback_and_network_true_has_its_own_nat() {
    let sandbox = sandbox();
    let scratch = Scratch::new();
    let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = listener.local_addr().expect("addr").port();
    let script = format!(
        "tail -n +3 /proc/net/dev | wc -l; exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"
    );
    let mut command = scratch.command(&["bash", "-c", &script]);
    for network in [true, false] {
        command.place.network = cairn_common::egress::Effective::flag(network);
        let out = run(&sandbox, &command).await;
        assert!(
            !out.succeeded(),
            "network: {network} reached the host: {out:?}"
        );
        let interfaces = if network { "2\n" } else { "1\n" };
        assert_eq!(out.stdout_tail, interfaces, "{out:?}");
        assert_eq!(out.sandbox["network"], network);
        assert!(out.sandbox["namespaces"]
            .as_array()
            .is_some_and(|n| n.contains(&serde_json::json!("network"))));
    }
    drop(listener);
}

#[tokio::test]
async fn a_setsid_orphan_ends_with_its_step_on_timeout_and_on_stop() {
    // Each mechanism alone ends it: the PID namespace (no cgroup), and the cgroup.
    for cgroups in [false, true] {
        let sandbox = Isolation::start(isolation::Settings {
            cgroups,
            ..settings()
        })
        .expect("sandbox");
        orphans_end_with_their_step(&sandbox).await;
    }
}

async fn orphans_end_with_their_step(sandbox: &Isolation) {
    let scratch = Scratch::new();
    // Unique per run: an orphan of another run is not this one's.
    let unique = || format!("1001.{}", uuid::Uuid::new_v4().as_u128() % 1_000_000_000);
    for (marker, stopped) in [(unique(), false), (unique(), true)] {
        let script = format!("setsid sh -c 'sleep {marker}' & sleep 100");
        let mut command = scratch.command(&["sh", "-c", &script]);
        command.timeout = Duration::from_secs(if stopped { 60 } else { 2 });
        let stop = CancellationToken::new();
        if stopped {
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                stop.cancel();
            });
        }
        let started = Instant::now();
        let out = step::run(&command, sandbox, &stop).await.expect("run");
        let took = started.elapsed();
        let expected = if stopped {
            Interruption::Stopped
        } else {
            Interruption::TimedOut
        };
        assert_eq!(out.interrupted, Some(expected));
        // Two seconds, the kill grace, and a margin for a loaded machine.
        assert!(took < Duration::from_secs(6), "ended after {took:?}");
        assert!(
            processes_with(&format!("sleep {marker}")).is_empty(),
            "the orphan outlived its step: {:?}",
            processes_with(&format!("sleep {marker}"))
        );
    }
}

#[tokio::test]
async fn a_fork_loop_is_stopped_by_the_pids_limit() {
    let sandbox = sandbox();
    if sandbox.report().cgroup == "none" {
        panic!("this machine delegates a cgroup; the pids limit under test needs it");
    }
    let scratch = Scratch::new();
    let mut command = scratch.command(&["sh", "-c", "while :; do sleep 30 & done"]);
    command.place.limits.pids = Some(32);
    let started = Instant::now();
    let out = run(&sandbox, &command).await;
    assert_eq!(out.limit, Some(Limit::Pids), "{out:?}");
    assert!(!out.succeeded());
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(out.describe().contains("pids_limit"), "{}", out.describe());
    assert_eq!(out.journal().limit.as_deref(), Some("pids_limit"));
}

#[tokio::test]
async fn allocating_past_the_memory_limit_ends_the_step_with_memory_limit() {
    let sandbox = sandbox();
    if sandbox.report().cgroup == "none" {
        panic!("this machine delegates a cgroup; the memory limit under test needs it");
    }
    let scratch = Scratch::new();
    let grow = "import time\nchunks = []\nwhile True:\n    chunks.append(bytearray(8 << 20))\n    time.sleep(0.01)";
    let mut command = scratch.command(&["python3", "-c", grow]);
    command.place.limits.memory_mb = Some(64);
    let out = run(&sandbox, &command).await;
    assert_eq!(out.limit, Some(Limit::Memory), "{out:?}");
    assert_eq!(out.journal().limit.as_deref(), Some("memory_limit"));
    // Under the limit, the same program is fine.
    let mut command = scratch.command(&["python3", "-c", "b = bytearray(16 << 20); print('ok')"]);
    command.place.limits.memory_mb = Some(64);
    let out = run(&sandbox, &command).await;
    assert!(out.succeeded(), "{out:?}");
    assert_eq!(out.limit, None);
}

#[tokio::test]
async fn open_files_and_cpu_time_are_limited() {
    let sandbox = sandbox();
    let scratch = Scratch::new();
    let mut command = scratch.command(&["sh", "-c", "ulimit -n; ulimit -t"]);
    command.place.limits.open_files = Some(64);
    command.place.limits.cpu_seconds = Some(7);
    let out = run(&sandbox, &command).await;
    assert_eq!(out.stdout_tail, "64\n7\n", "{out:?}");
    let mut spin = scratch.command(&["sh", "-c", "while :; do :; done"]);
    spin.place.limits.cpu_seconds = Some(1);
    let out = run(&sandbox, &spin).await;
    assert!(!out.succeeded(), "{out:?}");
    assert!(out.cpu_ms >= 900, "{out:?}");
}

#[tokio::test]
async fn the_detection_report_matches_the_host() {
    let sandbox = sandbox();
    let report = sandbox.report();
    let version = std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .expect("bwrap");
    assert_eq!(
        report.mechanism,
        String::from_utf8_lossy(&version.stdout).trim()
    );
    let tries = |args: &[&str]| {
        std::process::Command::new("bwrap")
            .args(["--ro-bind", "/", "/", "--dev", "/dev"])
            .args(args)
            .arg("true")
            .status()
            .is_ok_and(|s| s.success())
    };
    assert_eq!(report.user_namespace, tries(&["--unshare-user"]));
    assert_eq!(
        report.pid_namespace,
        tries(&["--unshare-pid", "--proc", "/proc"])
    );
    assert_eq!(report.network_namespace, tries(&["--unshare-net"]));
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
    let v2_only = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let v1_memory = mounts.lines().any(|l| {
        l.contains(" cgroup ")
            && l.split(' ')
                .nth(3)
                .is_some_and(|o| o.split(',').any(|c| c == "memory"))
    });
    let expected = if v2_only {
        "v2"
    } else if v1_memory {
        "v1"
    } else {
        "none"
    };
    assert_eq!(report.cgroup, expected, "{report:?}");
    assert!(report.isolated, "{report:?}");
    // And a worker that may not use it says so.
    let off = Isolation::start(isolation::Settings {
        mode: Mode::Off,
        ..settings()
    })
    .expect("off starts");
    assert!(!off.isolates());
    let missing = Isolation::start(isolation::Settings {
        bwrap: "/nonexistent/bwrap".into(),
        ..settings()
    })
    .expect_err("required without bubblewrap");
    assert!(missing.contains("bubblewrap"), "{missing}");
}

#[tokio::test]
async fn configured_host_paths_are_seen_read_only_or_read_write_even_under_tmp() {
    let scratch = Scratch::new();
    let (tools, cache) = (scratch.dir.join("tools"), scratch.dir.join("cache"));
    std::fs::create_dir_all(&tools).expect("tools");
    std::fs::create_dir_all(&cache).expect("cache");
    std::fs::write(tools.join("tool"), "a tool").expect("tool");
    let sandbox = Isolation::start(isolation::Settings {
        read_only: vec![tools.clone()],
        read_write: vec![cache.clone()],
        ..settings()
    })
    .expect("sandbox");
    let script = format!(
        "cat {tools}/tool; echo; touch {tools}/new || echo read-only; echo cached > {cache}/entry",
        tools = tools.display(),
        cache = cache.display()
    );
    let out = sh(&sandbox, &scratch, &script).await;
    assert_eq!(out.stdout_tail, "a tool\nread-only\n", "{out:?}");
    assert!(!tools.join("new").exists());
    assert_eq!(
        std::fs::read_to_string(cache.join("entry")).expect("entry"),
        "cached\n"
    );
}

#[tokio::test]
async fn the_step_user_is_configurable_and_has_a_name() {
    let sandbox = Isolation::start(isolation::Settings {
        uid: 4242,
        gid: 4343,
        ..settings()
    })
    .expect("sandbox");
    let scratch = Scratch::new();
    let out = sh(
        &sandbox,
        &scratch,
        "id -u; id -g; id -un; touch mine && stat -c %u mine",
    )
    .await;
    assert_eq!(out.stdout_tail, "4242\n4343\ncairn\n4242\n", "{out:?}");
    assert_eq!(out.sandbox["uid"], 4242);
}

#[tokio::test]
async fn step_cgroups_a_dead_worker_left_are_removed_at_start() {
    let own = std::fs::read_to_string("/proc/self/cgroup").expect("cgroup");
    let parent = match own.lines().find_map(|l| l.split_once(":memory:")) {
        Some((_, path)) => Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')),
        None => {
            let path = own.lines().find_map(|l| l.strip_prefix("0::")).expect("v2");
            Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'))
        }
    };
    // No process has the largest pid the kernel can give.
    let stale = parent.join("cairn-4194303-0");
    std::fs::create_dir_all(stale.join("step-7")).expect("a stale step cgroup");
    let _sandbox = sandbox();
    assert!(!stale.exists(), "{} was left", stale.display());
}

/// A sandbox resource's commands see its own machine id, host name and SSH host key,
/// not the host's and not another sandbox's, and cannot change them (invariant 10: the
/// files are the worker's); a run's step sees none of them.
#[tokio::test]
async fn a_sandbox_sees_its_own_identity_and_a_step_none() {
    let sandbox = sandbox();
    let scratch = Scratch::new();
    let script = "cat /etc/machine-id; uname -n; cat /etc/hostname; \
                  cat /etc/ssh/ssh_host_ed25519_key.pub; \
                  head -c 35 /etc/ssh/ssh_host_ed25519_key; echo; \
                  (echo x > /etc/machine-id) 2>/dev/null && echo wrote the machine id; \
                  (echo x > /etc/ssh/ssh_host_ed25519_key) 2>/dev/null && echo wrote the key; \
                  true";
    let command = scratch.command(&["sh", "-c", script]);
    let stop = CancellationToken::new();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let identity = isolation::identity::make(uuid::Uuid::new_v4()).expect("an identity");
        let session = sandbox
            .start_session(&command.place, &identity)
            .await
            .expect("a session")
            .expect("namespaces here");
        let out = step::run_in(&command, &session, &sandbox, &stop)
            .await
            .expect("the command starts");
        session.end(&sandbox).await;
        assert!(out.succeeded(), "{out:?}");
        let stdout = std::fs::read_to_string(&out.stdout_path).expect("stdout");
        let expected = format!(
            "{}\n{}\n{}\n{}-----BEGIN OPENSSH PRIVATE KEY-----\n",
            identity.machine_id,
            identity.hostname,
            identity.hostname,
            identity.ssh_host_ed25519_key_pub
        );
        assert_eq!(stdout, expected);
        seen.push(identity.machine_id);
    }
    assert_ne!(seen[0], seen[1]);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let step = sh(
        &sandbox,
        &scratch,
        "cat /etc/machine-id; ls -A /etc/ssh; uname -n",
    )
    .await;
    assert!(step.succeeded(), "{step:?}");
    let stdout = std::fs::read_to_string(&step.stdout_path).expect("stdout");
    assert_eq!(stdout, host, "a run's step: no machine id, no host key");
}
