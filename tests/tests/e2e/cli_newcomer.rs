//! `cairnctl` as a newcomer meets it: its own `--help` examples work, help never shows a
//! secret from the environment, a closed pipe ends it quietly, tables fit the terminal,
//! and `watch` says how a run ended through its exit code.

use cairn_e2e::binary;
use cairn_e2e::cluster::{run_spec, Cluster, Settings};
use cairn_e2e::ServiceLock;
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// The subcommands a help text lists under `Commands:` (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(String::from)
        .collect()
}

#[test]
fn no_help_text_shows_a_secret_from_the_environment() {
    const SECRET: &str = "sekrit-7f3a";
    let mut pending = vec![Vec::<String>::new()];
    let mut read = 0;
    while let Some(path) = pending.pop() {
        let out = Command::new(binary("cairnctl"))
            .args(&path)
            .arg("--help")
            .env("CAIRN_TOKEN", SECRET)
            .env("CAIRN_SERVER", format!("http://ops:{SECRET}@127.0.0.1:9"))
            .env(
                "CAIRN_DATABASE_URL",
                format!("postgres://u:{SECRET}@127.0.0.1/db"),
            )
            .output()
            .expect("cairnctl");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{path:?}: {help}");
        assert!(
            !help.contains(SECRET),
            "cairnctl {} --help shows a secret:\n{help}",
            path.join(" ")
        );
        read += 1;
        for sub in subcommands(&help) {
            let mut deeper = path.clone();
            deeper.push(sub);
            pending.push(deeper);
        }
    }
    assert!(read > 60, "only {read} help texts were read");
}

#[test]
fn a_closed_pipe_ends_cairnctl_without_a_panic() {
    // The read end is closed before cairnctl starts: its first print meets a broken pipe.
    let (reader, writer) = nix::unistd::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(binary("cairnctl"))
        .arg("new-id")
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .expect("cairnctl");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("panicked"), "{said}");
    assert_ne!(out.status.code(), Some(101), "{said}");
}

fn ctl(cluster: &Cluster, args: &[&str]) -> std::process::Output {
    cluster.cairnctl().args(args).output().expect("cairnctl")
}

#[tokio::test]
async fn list_filters_fit_the_terminal_and_watch_exits_by_how_the_run_ended() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("cli-newcomer", 1, Settings::default()).await;
    let slow = run_spec(vec![json!({"key": "wait", "argv": ["sleep", "60"]})], 1);
    let (slow_id, _) = cluster.submit(&slow);
    cluster.wait_for_state(&slow_id, &["running"], LONG);

    // `--state executing`, as the help said, is `running`.
    for state in ["executing", "running"] {
        let out = ctl(&cluster, &["runs", "list", "--state", state]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{state}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains(&slow_id), "{state}: {text}");
    }
    let out = ctl(&cluster, &["runs", "list", "--state", "bogus"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("needs_reconciliation") && said.contains("paused"),
        "{said}"
    );

    // A table fits the terminal's width; piped, it keeps whole cells.
    let narrow = cluster
        .cairnctl()
        .env("COLUMNS", "80")
        .args(["runs", "list"])
        .output()
        .expect("cairnctl");
    let text = String::from_utf8_lossy(&narrow.stdout);
    assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
    assert!(text.contains('…'), "{text}");
    assert!(
        text.contains(&slow_id),
        "the id is kept whole while others give way: {text}"
    );
    let piped = String::from_utf8_lossy(&ctl(&cluster, &["runs", "list"]).stdout).into_owned();
    assert!(piped.contains(&slow_id), "{piped}");

    assert!(ctl(&cluster, &["runs", "cancel", &slow_id])
        .status
        .success());
    let watched = ctl(
        &cluster,
        &["runs", "watch", &slow_id, "--interval-seconds", "0.2"],
    );
    assert_eq!(
        watched.status.code(),
        Some(9),
        "cancelled: {}",
        String::from_utf8_lossy(&watched.stdout)
    );

    let failing = run_spec(vec![json!({"key": "no", "argv": ["false"]})], 1);
    let (failing_id, _) = cluster.submit(&failing);
    let watched = ctl(
        &cluster,
        &["runs", "watch", &failing_id, "--interval-seconds", "0.2"],
    );
    assert_eq!(
        watched.status.code(),
        Some(8),
        "failed: {}",
        String::from_utf8_lossy(&watched.stdout)
    );
}
