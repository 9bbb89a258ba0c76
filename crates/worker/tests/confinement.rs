//! A confined check lives in a network namespace with only loopback: it cannot reach a
//! listener on the host's 127.0.0.1, while the same command unconfined can.

use cairn_worker::step::{self, StepCommand, StepOutcome};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cairn-confine-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("scratch");
    dir
}

async fn run(argv: &[&str], isolate_network: bool, dir: &Path) -> StepOutcome {
    let command = StepCommand {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::new(),
        cwd: dir.to_path_buf(),
        timeout: Duration::from_secs(30),
        output_base: dir
            .join("out")
            .join(if isolate_network { "confined" } else { "open" }),
        max_output: 64 * 1024,
        tail_bytes: 4096,
        redact: true,
        kill_grace: Duration::from_millis(200),
        isolate_network,
    };
    step::run(&command, &CancellationToken::new())
        .await
        .expect("the command starts")
}

#[tokio::test]
async fn a_confined_check_cannot_reach_the_host_loopback_but_has_its_own() {
    assert!(
        cairn_worker::confine::available(),
        "this machine can create network namespaces; the confinement under test needs them"
    );
    let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = listener.local_addr().expect("addr").port();
    let dir = scratch();
    let connect = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");

    let open = run(&["bash", "-c", &connect], false, &dir).await;
    assert!(open.succeeded(), "unconfined reaches the host: {open:?}");
    assert_eq!(open.stdout_tail, "connected\n");

    let confined = run(&["bash", "-c", &connect], true, &dir).await;
    assert!(
        !confined.succeeded(),
        "confined must not reach the host: {confined:?}"
    );
    assert_eq!(confined.stdout_tail, "");

    // Loopback inside the namespace is up: a check can still talk to itself.
    let own = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); \
               c = socket.create_connection(s.getsockname(), timeout=5); print('own loopback')";
    let inside = run(&["python3", "-c", own], true, &dir).await;
    assert!(inside.succeeded(), "loopback is up inside: {inside:?}");
    assert_eq!(inside.stdout_tail, "own loopback\n");

    // No interface but loopback exists inside.
    let links = run(&["cat", "/proc/net/dev"], true, &dir).await;
    let interfaces: Vec<&str> = links
        .stdout_tail
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(str::trim))
        .collect();
    assert_eq!(interfaces, ["lo"], "{}", links.stdout_tail);

    // No capability is left, so the host's namespace cannot be entered again, and
    // set-user-id programs gain nothing.
    let status = run(&["cat", "/proc/self/status"], true, &dir).await;
    for field in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
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
    let reenter = run(
        &["nsenter", "--net=/proc/1/ns/net", "bash", "-c", &connect],
        true,
        &dir,
    )
    .await;
    assert!(
        !reenter.succeeded(),
        "setns back to the host must fail: {reenter:?}"
    );
    assert_eq!(reenter.stdout_tail, "");
    drop(listener);
    let _ = std::fs::remove_dir_all(&dir);
}
