//! `cairnctl` drives every route of a running scheduler.

use cairn_e2e::cluster::{Cluster, Settings};
use cairn_e2e::{binary, free_addr, wait_for_status, Isolation, Process, ServiceLock};
use serde_json::json;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BOOTSTRAP: &str = "e2e-bootstrap-admin-token";

struct Ctl {
    server: String,
    state_dir: std::path::PathBuf,
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.stdout, self.stderr))
    }
}

impl Ctl {
    fn run(&self, token: &str, args: &[&str]) -> Out {
        let output = Command::new(binary("cairnctl"))
            .args(args)
            .env("CAIRN_SERVER", &self.server)
            .env("CAIRN_TOKEN", token)
            .env("CAIRN_STATE_DIR", &self.state_dir)
            .output()
            .expect("run cairnctl");
        Out {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    fn ok(&self, token: &str, args: &[&str]) -> Out {
        let out = self.run(token, args);
        assert_eq!(
            out.code, 0,
            "cairnctl {args:?} failed: {}{}",
            out.stdout, out.stderr
        );
        out
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write file");
    path.to_string_lossy().into_owned()
}

#[tokio::test]
async fn cairnctl_drives_every_route() {
    let _services = ServiceLock::shared().await;
    let isolation = Isolation::new("cli");
    let addr = free_addr();
    let mut env = isolation.env();
    env.push(("CAIRN_LISTEN".into(), addr.to_string()));
    env.push(("CAIRN_BOOTSTRAP_ADMIN_TOKEN".into(), BOOTSTRAP.into()));
    let mut scheduler = Process::start("cairn-scheduler", &env);
    wait_for_status(
        &mut scheduler,
        addr,
        "/readyz",
        200,
        Duration::from_secs(60),
    );
    let work = std::env::temp_dir().join(format!("cairn-cli-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&work).expect("work dir");
    let ctl = Ctl {
        server: format!("http://{addr}"),
        state_dir: work.join("state"),
    };

    // Tokens.
    let operator = ctl
        .ok(
            BOOTSTRAP,
            &[
                "--json", "token", "create", "--role", "operator", "--name", "op",
            ],
        )
        .json();
    let operator = operator["token"].as_str().expect("token").to_string();
    let viewer = ctl
        .ok(
            BOOTSTRAP,
            &["--json", "token", "create", "--role", "viewer"],
        )
        .json();
    let viewer_id = viewer["token_id"].as_str().expect("id").to_string();
    let viewer = viewer["token"].as_str().expect("token").to_string();
    assert_eq!(
        ctl.run(&viewer, &["token", "create", "--role", "admin"])
            .code,
        6,
        "viewers cannot create tokens"
    );

    // Source profiles: the install's own is qualified; an admin revokes and qualifies it.
    let shown = ctl.ok(&viewer, &["--json", "qualification", "show"]).json();
    assert_eq!(shown["current"]["status"], "qualified", "{shown}");
    let profile = shown["current"]["profile_digest"]
        .as_str()
        .expect("profile")
        .to_string();
    let revoked = ctl
        .ok(
            BOOTSTRAP,
            &[
                "--json",
                "qualification",
                "revoke",
                &profile,
                "--note",
                "test",
            ],
        )
        .json();
    assert_eq!(revoked["status"], "revoked", "{revoked}");
    let text = ctl
        .ok(BOOTSTRAP, &["qualification", "qualify", &profile])
        .stdout;
    assert!(text.contains("qualified"), "{text}");
    assert_eq!(
        ctl.run(&viewer, &["qualification", "revoke", &profile])
            .code,
        6,
        "viewers cannot revoke a profile"
    );

    // Runs.
    let spec = write(
        &work,
        "run.yaml",
        "agent: coder\nsteps:\n  - key: build\n    argv: [make]\n  - key: test\n    argv: [make, test]\n    idempotent: true\nbudgets:\n  max_commands: 5\n  max_wall_seconds: 300\n",
    );
    let run = ctl
        .ok(
            &operator,
            &["--json", "runs", "submit", &spec, "--idempotency-key", "k1"],
        )
        .json();
    let run_id = run["run_id"].as_str().expect("run id").to_string();
    let request_id = run["request_id"].as_str().expect("request id").to_string();
    let replay = ctl
        .ok(
            &operator,
            &["--json", "runs", "submit", &spec, "--idempotency-key", "k1"],
        )
        .json();
    assert_eq!(replay["run_id"], run["run_id"]);
    let bad = write(
        &work,
        "bad.yaml",
        "agent: coder\nsteps: [{key: a, argv: [\"true\"]}]\nbudgets: {max_commands: 1, max_wall_seconds: 0}\n",
    );
    let rejected = ctl.run(&operator, &["runs", "submit", &bad]);
    assert_eq!(rejected.code, 5, "{}", rejected.stderr);
    assert!(
        rejected.stderr.contains("max_wall_seconds"),
        "{}",
        rejected.stderr
    );
    let second = ctl
        .ok(&operator, &["--json", "runs", "submit", &spec])
        .json();
    let second_id = second["run_id"].as_str().expect("id").to_string();

    let table = ctl.ok(&viewer, &["runs", "list"]).stdout;
    assert!(table.starts_with("RUN"), "{table}");
    assert!(
        table.contains(&run_id) && table.contains(&second_id),
        "{table}"
    );
    let listed = ctl
        .ok(
            &viewer,
            &[
                "--json", "runs", "list", "--state", "queued", "--limit", "1",
            ],
        )
        .json();
    assert_eq!(listed["runs"].as_array().map(Vec::len), Some(1));
    let cursor = listed["next_cursor"].as_str().expect("cursor").to_string();
    let next = ctl
        .ok(
            &viewer,
            &[
                "--json", "runs", "list", "--state", "queued", "--limit", "1", "--cursor", &cursor,
            ],
        )
        .json();
    assert_ne!(next["runs"][0]["run_id"], listed["runs"][0]["run_id"]);
    let shown = ctl.ok(&viewer, &["runs", "show", &run_id]).stdout;
    assert!(
        shown.contains("queued") && shown.contains("make test"),
        "{shown}"
    );
    let requests = ctl
        .ok(&viewer, &["--json", "runs", "requests", &run_id])
        .json();
    assert_eq!(
        requests["execution_requests"][0]["request_id"].as_str(),
        Some(request_id.as_str())
    );
    ctl.ok(&viewer, &["--json", "runs", "journal", &run_id]);
    assert_eq!(ctl.run(&viewer, &["runs", "show", "not-an-id"]).code, 2);
    assert_eq!(
        ctl.run(
            &viewer,
            &["runs", "show", &uuid::Uuid::new_v4().simple().to_string()]
        )
        .code,
        3
    );

    // Nothing executes here (no worker): pause and resume are conflicts, and a viewer
    // may not pause at all.
    assert_eq!(
        ctl.run(
            &operator,
            &["runs", "pause", &second_id, "--wait-seconds", "0"]
        )
        .code,
        4
    );
    assert_eq!(ctl.run(&operator, &["runs", "resume", &second_id]).code, 4);
    assert_eq!(ctl.run(&viewer, &["runs", "pause", &second_id]).code, 6);
    let cancelled = ctl
        .ok(&operator, &["--json", "runs", "cancel", &second_id])
        .json();
    assert_eq!(cancelled["state"], "cancelled");
    let watched = ctl.run(
        &viewer,
        &["runs", "watch", &second_id, "--interval-seconds", "0.2"],
    );
    assert_eq!(
        watched.code, 9,
        "watch exits 9 for a cancelled run: {}",
        watched.stdout
    );
    assert!(watched.stdout.contains("cancelled"));

    // Policy.
    let policy = ctl.ok(&viewer, &["--json", "policy", "get"]).json();
    assert_eq!(policy["allow_checkpoint_continuation"], false);
    assert_eq!(
        ctl.run(&operator, &["policy", "set", "--enabled", "true"])
            .code,
        6
    );
    let set = ctl
        .ok(
            BOOTSTRAP,
            &[
                "--json",
                "policy",
                "set",
                "--enabled",
                "true",
                "--allow-checkpoint-continuation",
                "true",
            ],
        )
        .json();
    assert_eq!(set["allow_checkpoint_continuation"], true);
    assert_eq!(set["allow_final_outcome_continuation"], false);

    // Put the first run where a lapsed lease with spent attempts leaves it.
    let pool = sqlx::PgPool::connect(&isolation.database_url)
        .await
        .expect("db");
    let request_uuid = uuid::Uuid::parse_str(&request_id).expect("uuid");
    cairn_common::testing::stop_at_checkpoint(&pool, request_uuid).await;

    let candidate = ctl
        .ok(
            &viewer,
            &[
                "--json",
                "checkpoint-continuations",
                "candidate",
                &run_id,
                &request_id,
            ],
        )
        .json();
    assert_eq!(candidate["admission"], "READY", "{candidate}");
    let digest = candidate["candidate_digest"].as_str().expect("digest");
    let document = write(
        &work,
        "action.json",
        &format!(
            r#"{{"version": 1, "candidate_digest": "{digest}", "valid_for_seconds": 120,
                "acknowledge_retained_response_consumed_once": true,
                "acknowledge_no_completed_effect_replay": true,
                "acknowledge_same_request_attempt_and_budgets": true,
                "acknowledge_finite_ownership_lease": true}}"#
        ),
    );
    let action = ctl.ok(&viewer, &["new-id"]).stdout.trim().to_string();
    assert_eq!(action.len(), 32);
    let saved = ctl.ok(
        BOOTSTRAP,
        &[
            "checkpoint-continuations",
            "request",
            &run_id,
            &request_id,
            &action,
            &document,
        ],
    );
    assert!(saved.stdout.contains("saved action"), "{}", saved.stdout);
    let record: Value = serde_json::from_slice(
        &std::fs::read(ctl.state_dir.join(format!("{action}.json"))).expect("record"),
    )
    .expect("record json");
    assert_eq!(record["outcome"], "saved");
    assert_eq!(record["body"]["valid_for_seconds"], 120);
    let status = ctl
        .ok(
            &viewer,
            &[
                "--json",
                "checkpoint-continuations",
                "status",
                &run_id,
                &request_id,
            ],
        )
        .json();
    assert_eq!(
        (status["status"].as_str(), status["action_id"].as_str()),
        (Some("queued"), Some(action.as_str()))
    );
    // The same action with another document is refused locally: keep the saved decision.
    let other = write(
        &work,
        "other.json",
        &std::fs::read_to_string(&document)
            .expect("doc")
            .replace("120", "121"),
    );
    let refused = ctl.run(
        BOOTSTRAP,
        &[
            "checkpoint-continuations",
            "request",
            &run_id,
            &request_id,
            &action,
            &other,
        ],
    );
    assert_eq!(refused.code, 4, "{}", refused.stderr);
    assert!(refused.stderr.contains("status"), "{}", refused.stderr);

    // Final-outcome routes: the candidate is held (policy off), status reads not_recovered.
    let held = ctl.run(
        &viewer,
        &[
            "--json",
            "final-outcome-continuations",
            "candidate",
            &run_id,
            &request_id,
        ],
    );
    assert_eq!(held.code, 4);
    assert_eq!(held.json()["admission_window_purpose"], "claim_only");
    let status = ctl
        .ok(
            &viewer,
            &[
                "--json",
                "final-outcome-continuations",
                "status",
                &run_id,
                &request_id,
            ],
        )
        .json();
    assert_eq!(status["status"], "not_recovered");
    let final_doc = write(
        &work,
        "final.json",
        &format!(
            r#"{{"version": 1, "candidate_digest": "{}", "valid_for_seconds": 60,
                "acknowledge_already_consumed_final_output": true,
                "acknowledge_no_completed_effect_replay": true,
                "acknowledge_same_request_attempt_and_budgets": true,
                "acknowledge_finite_ownership_lease": true}}"#,
            "0".repeat(64)
        ),
    );
    let final_action = uuid::Uuid::new_v4().simple().to_string();
    let denied = ctl.run(
        BOOTSTRAP,
        &[
            "final-outcome-continuations",
            "request",
            &run_id,
            &request_id,
            &final_action,
            &final_doc,
        ],
    );
    assert_eq!(
        denied.code, 6,
        "only the run's original operator may act: {}",
        denied.stderr
    );

    // An uncertain response (the connection drops before any answer): the record is
    // kept and the user is told to read status.
    let dropping = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead = Ctl {
        server: format!("http://{}", dropping.local_addr().expect("addr")),
        state_dir: ctl.state_dir.clone(),
    };
    std::thread::spawn(move || {
        for stream in dropping.incoming().flatten() {
            let mut request = [0u8; 4096];
            let _ = std::io::Read::read(&mut &stream, &mut request);
            drop(stream);
        }
    });
    let lost_action = uuid::Uuid::new_v4().simple().to_string();
    let uncertain = dead.run(
        BOOTSTRAP,
        &[
            "checkpoint-continuations",
            "request",
            &run_id,
            &request_id,
            &lost_action,
            &document,
        ],
    );
    assert_eq!(uncertain.code, 75, "{}", uncertain.stderr);
    assert!(
        uncertain.stderr.contains("checkpoint-continuations status"),
        "{}",
        uncertain.stderr
    );
    let record: Value = serde_json::from_slice(
        &std::fs::read(ctl.state_dir.join(format!("{lost_action}.json"))).expect("record"),
    )
    .expect("json");
    assert_eq!(record["outcome"], "uncertain");

    // Credential rotation.
    let rotated = ctl
        .ok(BOOTSTRAP, &["--json", "credentials", "rotate", "coder"])
        .json();
    assert_eq!(rotated["generation"], 1);

    // Token revocation and migrations.
    ctl.ok(BOOTSTRAP, &["token", "revoke", &viewer_id]);
    assert_eq!(ctl.run(&viewer, &["runs", "list"]).code, 6);
    let migrated = Command::new(binary("cairnctl"))
        .args(["migrate"])
        .env("CAIRN_DATABASE_URL", &isolation.database_url)
        .output()
        .expect("migrate");
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    assert!(String::from_utf8_lossy(&migrated.stdout).contains("up to date"));

    pool.close().await;
    let _ = std::fs::remove_dir_all(&work);
    scheduler.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        scheduler
            .wait_exit(Duration::from_secs(20))
            .is_some_and(|s| s.success()),
        "{}",
        scheduler.log()
    );
}

/// Exit codes tell the truth: an unreachable scheduler is exit 1 with the reason, for a
/// read and for a write alike (nothing was sent); a mistyped command is a usage error
/// with a suggestion.
#[test]
fn an_unreachable_scheduler_and_a_typo_get_exit_codes_that_tell_the_truth() {
    let work = std::env::temp_dir().join(format!("cairn-cli-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&work).expect("work dir");
    // Nothing listens on a port just freed.
    let closed = free_addr();
    let ctl = Ctl {
        server: format!("http://{closed}"),
        state_dir: work.join("state"),
    };
    let spec = write(
        &work,
        "run.yaml",
        "agent: coder\nsteps: [{key: a, argv: [\"true\"]}]\n",
    );
    for args in [
        vec!["runs", "list"],
        vec!["runs", "show", "0123456789abcdef0123456789abcdef"],
        vec!["runs", "submit", spec.as_str()],
    ] {
        let out = ctl.run("any-token", &args);
        assert_eq!(out.code, 1, "{args:?}: {}", out.stderr);
        assert_eq!(
            out.stderr.trim_end(),
            format!("error: cannot reach the scheduler at http://{closed}: connection refused"),
            "{args:?}"
        );
    }

    let typo = ctl.run("any-token", &["run", "list"]);
    assert_eq!(typo.code, 2, "{}", typo.stderr);
    let first = typo.stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("usage: "), "{}", typo.stderr);
    assert!(first.contains("did you mean 'runs'"), "{}", typo.stderr);
    assert!(typo.stderr.contains("cairnctl --help"), "{}", typo.stderr);
    let _ = std::fs::remove_dir_all(&work);
}

/// `runs watch` off a terminal prints a plain line per change: each step's state, how
/// it was done and its epoch, then the stop reason; `runs logs` prints every started
/// step's output in plan order.
#[tokio::test]
async fn watch_and_logs_show_a_run_step_by_step() {
    let _services = ServiceLock::shared().await;
    // No worker until the watch has printed the run as queued: otherwise a fast claim
    // can take the first step past `pending` before the watch's first look.
    let mut cluster = Cluster::start("cli-watch", 0, Settings::default()).await;
    let spec = json!({
        "agent": "e2e",
        "steps": [
            {"key": "greet", "argv": ["sh", "-c", "echo hello; sleep 1"]},
            {"key": "boom", "argv": ["sh", "-c", "echo oops >&2; exit 3"]},
            {"key": "never", "argv": ["true"]}
        ]
    });
    let (run_id, _) = cluster.submit(&spec);
    let mut watch = cluster
        .cairnctl()
        .args(["runs", "watch", &run_id, "--interval-seconds", "0.2"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("cairnctl");
    let stdout = watch.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut text = String::new();
    let mut worker_started = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                text.push_str(&line);
                text.push('\n');
                if !worker_started && line.contains("step greet: pending") {
                    cluster.add_worker();
                    worker_started = true;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = watch.kill();
                panic!("the watch did not end within 60 s:\n{text}");
            }
        }
    }
    let status = watch.wait().expect("cairnctl exits");
    assert_eq!(status.code(), Some(8), "{text}");
    let ctl = |args: &[&str]| cluster.cairnctl().args(args).output().expect("cairnctl");
    for expected in [
        "step greet: pending",
        "step greet: running at epoch 1",
        "step greet: completed, executed at epoch 1",
        "step boom: failed, executed at epoch 1",
        "(exit 3)",
        "step never: pending",
        "run failed: step boom exited with status 3",
    ] {
        assert!(text.contains(expected), "{expected:?} missing:\n{text}");
    }
    assert!(
        !text.contains('\u{1b}'),
        "no terminal codes off a terminal:\n{text}"
    );

    let journal = String::from_utf8_lossy(&ctl(&["runs", "journal", &run_id]).stdout).into_owned();
    let row = |key: &str| {
        journal
            .lines()
            .find(|l| l.starts_with(&format!("{key} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        row("greet").contains("completed") && row("greet").ends_with("hello"),
        "{journal}"
    );
    assert!(
        row("boom").contains("failed") && row("boom").ends_with("oops"),
        "{journal}"
    );

    let logs = ctl(&["runs", "logs", &run_id]);
    assert_eq!(logs.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "hello\n");
    assert_eq!(String::from_utf8_lossy(&logs.stderr), "oops\n");
}

/// A run queued with no worker alive: `runs watch` says so once it waited.
#[tokio::test]
async fn watch_says_when_no_worker_is_there_to_take_a_run() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("cli-noworker", 0, Settings::default()).await;
    let (run_id, _) =
        cluster.submit(&json!({"agent": "e2e", "steps": [{"key": "a", "argv": ["true"]}]}));
    let mut watch = cluster
        .cairnctl()
        .args([
            "runs",
            "watch",
            &run_id,
            "--interval-seconds",
            "0.2",
            "--unclaimed-seconds",
            "1",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("cairnctl");
    let stdout = watch.stdout.take().expect("stdout");
    let hint = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .map_while(Result::ok)
        .find(|l| l.contains("no worker is alive"));
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(hint.is_some_and(|h| h.contains("start cairn-worker")));
}

/// A well-formed final-outcome continuation body.
fn acceptance() -> Value {
    json!({
        "version": 1, "candidate_digest": "a".repeat(64), "valid_for_seconds": 60,
        "acknowledge_already_consumed_final_output": true, "acknowledge_no_completed_effect_replay": true,
        "acknowledge_same_request_attempt_and_budgets": true, "acknowledge_finite_ownership_lease": true
    })
}

/// `good` broken one way at a time, each named.
fn coercions(good: &Value) -> Vec<(&'static str, Value)> {
    let ack = "acknowledge_already_consumed_final_output";
    let mut cases: Vec<(&'static str, Value)> = Vec::new();
    for (what, value) in [
        ("1", json!(1)),
        ("\"true\"", json!("true")),
        ("false", json!(false)),
    ] {
        let mut body = good.clone();
        body[ack] = value;
        cases.push((what, body));
    }
    let mut extra = good.clone();
    extra["note"] = json!("x");
    cases.push(("extra field", extra));
    let mut missing = good.clone();
    missing
        .as_object_mut()
        .map(|b| b.remove("acknowledge_finite_ownership_lease"));
    cases.push(("missing field", missing));
    let mut version = good.clone();
    version["version"] = json!(2);
    cases.push(("version 2", version));
    let mut digest = good.clone();
    digest["candidate_digest"] = json!("abc");
    cases.push(("short digest", digest));
    cases
}

/// A continuation body the scheduler would refuse is refused by `cairnctl` first: each
/// coercion (an extra field, `1` or `"true"` for an acknowledgement, a `false` one, a
/// missing field, another version, a short digest) exits 5, and nothing
/// is saved or sent: the server here counts every connection, and sees none.
#[test]
fn a_continuation_body_the_server_would_refuse_is_neither_saved_nor_sent() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let work = std::env::temp_dir().join(format!("cairn-cli-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&work).expect("work dir");
    let ctl = Ctl {
        server: format!("http://{}", listener.local_addr().expect("addr")),
        state_dir: work.join("actions"),
    };
    let good = acceptance();
    let cases = coercions(&good);
    let (run, request, action) = ("1".repeat(32), "2".repeat(32), "3".repeat(32));
    for (what, body) in cases {
        let document = write(&work, "body.json", &body.to_string());
        let args = [
            "final-outcome-continuations",
            "request",
            &run,
            &request,
            &action,
            &document,
        ];
        let out = ctl.run(BOOTSTRAP, &args);
        assert_eq!(out.code, 5, "{what}: {}{}", out.stdout, out.stderr);
        assert!(
            out.stderr.contains("nothing was saved or sent"),
            "{what}: {}",
            out.stderr
        );
    }
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a refused body reached the server"
    );
    assert!(
        !ctl.state_dir.join(format!("{action}.json")).exists(),
        "a refused body was saved"
    );
    // The same body, well formed, does leave: the listener sees its connection.
    let document = write(&work, "body.json", &good.to_string());
    let server = std::thread::spawn(move || {
        listener.set_nonblocking(false).expect("blocking");
        // Read and dropped unanswered: the outcome is unknown to cairnctl.
        let (stream, _) = listener.accept().expect("accept");
        let mut request = [0u8; 4096];
        std::io::Read::read(&mut &stream, &mut request).is_ok_and(|n| n > 0)
    });
    let args = [
        "final-outcome-continuations",
        "request",
        &run,
        &request,
        &action,
        &document,
    ];
    let out = ctl.run(BOOTSTRAP, &args);
    assert!(
        server.join().expect("listener"),
        "the good body was never sent"
    );
    assert_eq!(out.code, 75, "{}", out.stderr);
    let _ = std::fs::remove_dir_all(&work);
}
