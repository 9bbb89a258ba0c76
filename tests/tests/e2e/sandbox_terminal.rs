//! A running exec's input, terminal and end, end to end: bytes sent to its standard
//! input reach it in order and its end closes it; a command in a terminal sees a
//! terminal of the asked size, gets what is typed, follows a resize; `kill` ends one;
//! `cairnctl sandbox shell` is a shell whose output and exit status come back.

use cairn_e2e::cluster::{Cluster, Settings};
use cairn_e2e::sandboxes::*;
use cairn_e2e::ServiceLock;
use serde_json::{json, Value};
use std::io::Write;

/// Starts an exec without waiting; its operation's path, once it runs.
fn start(cluster: &Cluster, id: &str, body: Value) -> String {
    let (status, started) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec?wait=false"),
        Some(&body),
    );
    assert_eq!(status, 202, "{started}");
    let op = started["operation_id"].as_str().expect("id").to_string();
    let path = format!("/api/v1/sandboxes/{id}/operations/{op}");
    cluster.wait_until("the exec runs", LONG, || {
        cluster.call("GET", &path, None).1["state"] != "pending"
    });
    path
}

fn ended(cluster: &Cluster, path: &str) -> Value {
    let mut last = Value::Null;
    cluster.wait_until("the exec ends", LONG, || {
        last = cluster.call("GET", path, None).1;
        last["state"] == "done"
    });
    last["result"].clone()
}

fn send(cluster: &Cluster, path: &str, query: &str, bytes: &[u8]) -> (u16, Value) {
    let (status, body) = raw(cluster, "POST", &format!("{path}/input{query}"), bytes);
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// What the exec has printed so far.
fn printed(cluster: &Cluster, path: &str) -> String {
    let (_, bytes) = raw(cluster, "GET", &format!("{path}/output?stream=stdout"), b"");
    String::from_utf8_lossy(&bytes).to_string()
}

#[tokio::test]
async fn an_exec_takes_input_runs_in_a_terminal_and_is_killed() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-terminal", 1, Settings::default()).await;
    let id = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &id, "running");

    // Standard input, kept open: what is sent arrives in order, and its end ends `cat`.
    let piped = start(
        &cluster,
        &id,
        json!({"argv": ["sh", "-c", "tr a-z A-Z"], "stdin": true, "timeout_sec": 60}),
    );
    assert_eq!(
        send(&cluster, &piped, "", b"hello\n"),
        (200, json!({"written": 6}))
    );
    let (status, refused) = cluster.call(
        "POST",
        &format!("{piped}/resize"),
        Some(&json!({"rows": 10, "cols": 10})),
    );
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (409, Some("not_a_terminal")),
        "{refused}"
    );
    assert_eq!(send(&cluster, &piped, "?eof=true", b"bye\x00\xff").0, 200);
    let result = ended(&cluster, &piped);
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(result["stdout"], "HELLO\nBYE\\x00\\xff", "{result}");
    let (status, late) = send(&cluster, &piped, "", b"late");
    assert_eq!(
        (status, late["error"]["code"].as_str()),
        (409, Some("not_running")),
        "{late}"
    );

    // An exec waiting for input holds up no other operation: they run beside it, in
    // their turn among themselves, and it goes on taking input.
    let waiting = start(
        &cluster,
        &id,
        json!({"argv": ["sh", "-c", "read line; echo got:$line; echo $line > typed.txt; cat beside.txt"], "stdin": true, "timeout_sec": 60}),
    );
    let (status, beside) = exec(&cluster, &id, "echo from-beside | tee beside.txt");
    assert_eq!(status, 200, "{beside}");
    assert_eq!(beside["result"]["stdout"], "from-beside\n");
    let (status, content) = file(&cluster, &id, "beside.txt");
    assert_eq!(
        (status, content.as_slice()),
        (200, b"from-beside\n".as_slice())
    );
    assert_eq!(send(&cluster, &waiting, "?eof=true", b"typed\n").0, 200);
    let result = ended(&cluster, &waiting);
    assert_eq!(result["stdout"], "got:typed\nfrom-beside\n", "{result}");
    // Its receipt stands on a checkpoint of its own, past the one of the exec in turn
    // (invariant 9), and its effect is there.
    let (_, receipt) = cluster.call("GET", &waiting, None);
    assert!(receipt["snapshot_id"].is_string(), "{receipt}");
    assert_ne!(
        receipt["snapshot_id"], beside["snapshot_id"],
        "{receipt} {beside}"
    );
    let (_, typed) = file(&cluster, &id, "typed.txt");
    assert_eq!(typed, b"typed\n");

    // Without `stdin`, an exec takes no input; `kill` ends it and its receipt says so.
    let sleeper = start(
        &cluster,
        &id,
        json!({"argv": ["sleep", "300"], "timeout_sec": 600}),
    );
    let (status, refused) = send(&cluster, &sleeper, "", b"x");
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (409, Some("no_input")),
        "{refused}"
    );
    let (status, killing) = cluster.call("POST", &format!("{sleeper}/kill"), None);
    assert_eq!(status, 202, "{killing}");
    let result = ended(&cluster, &sleeper);
    assert_eq!(result["killed"], true, "{result}");
    assert_eq!(result["exit_code"], Value::Null, "{result}");

    // A terminal: the command sees one of the asked size, gets what is typed, and
    // follows a resize.
    let script = "stty size; [ -t 0 ] && echo is-a-tty; read line; echo got:$line; stty size";
    let terminal = start(
        &cluster,
        &id,
        json!({"argv": ["sh", "-c", script], "pty": {"rows": 30, "cols": 100}, "timeout_sec": 60}),
    );
    cluster.wait_until("the first size printed", LONG, || {
        printed(&cluster, &terminal).contains("is-a-tty")
    });
    let (status, _) = cluster.call(
        "POST",
        &format!("{terminal}/resize"),
        Some(&json!({"rows": 40, "cols": 120})),
    );
    assert_eq!(status, 204);
    assert_eq!(send(&cluster, &terminal, "", b"abc\r").0, 200);
    let result = ended(&cluster, &terminal);
    let out = result["stdout"].as_str().unwrap_or_default();
    assert_eq!(result["exit_code"], 0, "{result}");
    // (A receipt's tails write a carriage return as `\x0d`.)
    assert!(out.starts_with("30 100\\x0d\nis-a-tty\\x0d\n"), "{out}");
    assert!(
        out.contains("abc\\x0d\n"),
        "the terminal echoes what is typed: {out}"
    );
    assert!(out.ends_with("got:abc\\x0d\n40 120\\x0d\n"), "{out}");

    // A command in a terminal holds the terminal and nothing else of the worker's: no
    // pipe, socket or other descriptor leaks into it (the listing's own directory aside).
    let fds = start(
        &cluster,
        &id,
        json!({"argv": ["ls", "-l", "/proc/self/fd/"], "pty": {"rows": 24, "cols": 200}, "timeout_sec": 60}),
    );
    let result = ended(&cluster, &fds);
    let out = result["stdout"].as_str().unwrap_or_default().to_string();
    let targets: Vec<(&str, &str)> = out
        .split("\\x0d\n")
        .filter_map(|line| line.split_once(" -> "))
        .map(|(left, target)| (left.rsplit(' ').next().unwrap_or_default(), target))
        .collect();
    let terminal_fds: Vec<&str> = targets[..3.min(targets.len())]
        .iter()
        .map(|t| t.1)
        .collect();
    assert_eq!(
        targets.iter().map(|t| t.0).collect::<Vec<_>>(),
        ["0", "1", "2", "3"],
        "{out}"
    );
    assert!(
        terminal_fds
            .iter()
            .all(|t| *t == terminal_fds[0] && t.contains("pts")),
        "{out}"
    );
    assert!(targets[3].1.starts_with("/proc/"), "{out}");

    // Killed, a terminal's whole session ends, even what ignores SIGTERM and SIGHUP.
    let stubborn = "trap '' HUP TERM INT; echo ready; while :; do sleep 777; done";
    let session = start(
        &cluster,
        &id,
        json!({"argv": ["sh", "-c", stubborn], "pty": {"rows": 24, "cols": 80}, "timeout_sec": 600}),
    );
    cluster.wait_until("the session runs", LONG, || {
        printed(&cluster, &session).contains("ready")
    });
    let (status, _) = cluster.call("POST", &format!("{session}/kill"), None);
    assert_eq!(status, 202);
    assert_eq!(ended(&cluster, &session)["killed"], true);
    let listing = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done";
    cluster.wait_until("the job ended with its terminal", LONG, || {
        let (_, seen) = exec(&cluster, &id, listing);
        !seen["result"]["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("sleep 777")
    });

    // `cairnctl sandbox shell`: a shell that runs what it is given, with its status.
    let mut shell = cluster
        .cairnctl()
        .args(["sandbox", "shell", &id])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cairnctl");
    shell
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"echo $((6 * 7)) > answer; cat answer\nexit 3\n")
        .expect("typed");
    let done = shell.wait_with_output().expect("the shell ends");
    let out = String::from_utf8_lossy(&done.stdout);
    assert_eq!(
        done.status.code(),
        Some(3),
        "{out} {}",
        String::from_utf8_lossy(&done.stderr)
    );
    // (What is typed ahead may be echoed before the first prompt: `$ 42`.)
    assert!(out.contains("42\r\n"), "{out}");
    let (status, kept) = file(&cluster, &id, "answer");
    assert_eq!((status, kept.as_slice()), (200, b"42\n".as_slice()));

    // A stop ends an exec beside the others, frozen by a pause too, and its receipt
    // says so.
    let open = start(
        &cluster,
        &id,
        json!({"argv": ["cat"], "stdin": true, "timeout_sec": 600}),
    );
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/pause"), None);
    assert_eq!(status, 200);
    wait_state(&cluster, &id, "paused");
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    assert_eq!(status, 200);
    wait_state(&cluster, &id, "stopped");
    let (_, op) = cluster.call("GET", &open, None);
    assert_eq!(
        (op["state"].as_str(), &op["result"]["stopped"]),
        (Some("done"), &json!(true)),
        "{op}"
    );
}
