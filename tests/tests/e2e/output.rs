//! A step's output is bytes: every byte value reaches the artifact, the live output the
//! API serves and the receipt's tail, and the secrets a step prints are redacted before
//! anything is stored. Live output reaches a follower within a second, and what was
//! printed before a worker died stays readable.

use cairn_common::output::unescape;
use cairn_e2e::cluster::{run_spec, Cluster, Settings};
use cairn_e2e::{Process, ServiceLock};
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Every byte 0–255, NUL and invalid UTF-8 included, printed to stdout and to stderr: the
/// step's receipt is written (the run completes), both artifacts hold the bytes exactly,
/// and both tails give them back.
#[tokio::test]
async fn every_byte_a_step_prints_is_kept() {
    let _services = ServiceLock::shared().await;
    let format: String = (0..=255u8).map(|b| format!("\\{b:03o}")).collect();
    let script = format!("printf '{format}'; printf '{format}' >&2");
    let (cluster, step) = completed_step("output-bytes", &script).await;
    let all: Vec<u8> = (0..=255u8).collect();
    for stream in ["stdout", "stderr"] {
        let run_id = step["run_id"].as_str().expect("run id");
        assert_eq!(
            cluster.output(run_id, "out", stream),
            (200, all.clone()),
            "{stream} from the API"
        );
        let tail = step[format!("{stream}_tail")].as_str().expect("tail");
        assert_eq!(
            unescape(tail).as_deref(),
            Some(&all[..]),
            "{stream} tail {tail:?}"
        );
        let base = step["output_artifact"].as_str().expect("artifact");
        let stored = std::fs::read(format!("{base}.{stream}")).expect("artifact file");
        assert_eq!(stored, all, "{stream} artifact");
    }
}

/// `tail_bytes` answers the output's last bytes, across chunk boundaries, and does not
/// go with `follow`.
#[tokio::test]
async fn a_tail_is_the_outputs_last_bytes() {
    let _services = ServiceLock::shared().await;
    // About 230 KB: several 64 KiB chunks.
    let (cluster, step) = completed_step("output-tail", "seq 1 40000").await;
    let run_id = step["run_id"].as_str().expect("run id");
    let (status, all) = cluster.output(run_id, "out", "stdout");
    assert_eq!(status, 200);
    assert!(all.len() > 3 * 65536, "{} bytes", all.len());
    for want in [1, 70_000, 131_072, all.len(), all.len() + 10] {
        let (status, tail) = cluster.output(run_id, "out", &format!("stdout&tail_bytes={want}"));
        assert_eq!(status, 200);
        let expected = &all[all.len().saturating_sub(want)..];
        assert!(
            tail == expected,
            "tail_bytes={want}: {} bytes, not the last {}",
            tail.len(),
            expected.len()
        );
    }
    for (query, refused) in [
        ("stdout&tail_bytes=0", 400),
        ("stdout&tail_bytes=1048577", 400),
        ("stdout&tail_bytes=5&follow=true", 422),
    ] {
        let (status, body) = cluster.output(run_id, "out", query);
        assert_eq!(
            status,
            refused,
            "{query}: {}",
            String::from_utf8_lossy(&body)
        );
    }
}

/// A step prints a private key block and tokens: its artifacts and tails hold
/// `[redacted]` in their place, and none of them.
#[tokio::test]
async fn secrets_a_step_prints_are_redacted() {
    let _services = ServiceLock::shared().await;
    let key = "PRIVATE KEY";
    let github = format!("{}_{}", "ghp", "k".repeat(36));
    let aws = format!("{}{}", "AKIA", "Q".repeat(16));
    let script = format!(
        "echo 'token {github} here'; printf -- '-----BEGIN OPENSSH {key}-----\\nb3BlbnNzaA\\n-----END OPENSSH {key}-----\\n'; echo 'id {aws}' >&2; echo done"
    );
    let (cluster, step) = completed_step("output-redact", &script).await;
    let base = step["output_artifact"].as_str().expect("artifact");
    let mut seen = String::new();
    for stream in ["stdout", "stderr"] {
        let run_id = step["run_id"].as_str().expect("run id");
        seen.push_str(&String::from_utf8_lossy(
            &cluster.output(run_id, "out", stream).1,
        ));
        seen.push_str(step[format!("{stream}_tail")].as_str().expect("tail"));
        seen.push_str(&String::from_utf8_lossy(
            &std::fs::read(format!("{base}.{stream}")).expect("artifact"),
        ));
    }
    for secret in [github.as_str(), aws.as_str(), "b3BlbnNzaA", "BEGIN OPENSSH"] {
        assert!(!seen.contains(secret), "{secret} was stored: {seen}");
    }
    assert!(seen.contains("token [redacted] here"), "{seen}");
    assert!(seen.contains("id [redacted]"), "{seen}");
    assert!(seen.contains("done"), "{seen}");
}

/// Runs one shell step on a fresh cluster; returns the cluster (which keeps the step's
/// artifacts) and the step's journal entry once it completed.
async fn completed_step(label: &str, script: &str) -> (Cluster, Value) {
    let cluster = Cluster::start(label, 1, Settings::default()).await;
    let step = json!({"key": "out", "argv": ["sh", "-c", script], "idempotent": true});
    let (run_id, _) = cluster.submit(&run_spec(vec![step], 1));
    let ended = ["completed", "failed", "needs_reconciliation"];
    let run = cluster.wait_for_state(&run_id, &ended, Duration::from_secs(60));
    assert_eq!(run["state"], "completed", "{run}");
    let mut step = cluster.journal(&run_id)["steps"][0].clone();
    step["run_id"] = json!(run_id);
    (cluster, step)
}

/// `cairnctl runs logs RUN STEP --follow` prints each line of a running step within a
/// second of the step printing it, and exits when the step ends.
#[tokio::test]
async fn a_follower_sees_each_line_within_a_second() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("output-follow", 1, Settings::default()).await;
    let script = "for i in 1 2 3 4 5; do echo \"$(date +%s.%N) line $i\"; sleep 1; done";
    let step = json!({"key": "tick", "argv": ["sh", "-c", script]});
    let (run_id, _) = cluster.submit(&run_spec(vec![step], 1));
    let mut follower = cluster
        .cairnctl()
        .args([
            "runs", "logs", &run_id, "tick", "--follow", "--stream", "stdout",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("cairnctl");
    let stdout = follower.stdout.take().expect("stdout");
    let mut arrivals = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("a line");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        arrivals.push((line, now));
    }
    let status = follower.wait().expect("cairnctl exits");
    assert!(status.success(), "{status}: {arrivals:?}");
    assert_eq!(arrivals.len(), 5, "{arrivals:?}");
    for (i, (line, arrived)) in arrivals.iter().enumerate() {
        let (printed, text) = line.split_once(' ').expect("timestamp and text");
        assert_eq!(text, format!("line {}", i + 1));
        let late = arrived - printed.parse::<f64>().expect("a timestamp");
        assert!(
            late < 1.0,
            "{line:?} arrived {late:.3} s after it was printed"
        );
    }
    cluster.wait_for_state(&run_id, &["completed"], Duration::from_secs(30));
}

/// The output a step printed before its worker was killed is still readable.
#[tokio::test]
async fn output_printed_before_a_worker_dies_stays_readable() {
    let _services = ServiceLock::shared().await;
    let settings = Settings {
        lease_ttl_seconds: 30,
        ..Settings::default()
    };
    let mut cluster = Cluster::start("output-kill", 1, settings).await;
    let script = "i=0; while [ $i -lt 200 ]; do echo line $i; i=$((i+1)); sleep 0.2; done";
    let step = json!({"key": "slow", "argv": ["sh", "-c", script]});
    let (run_id, _) = cluster.submit(&run_spec(vec![step], 1));
    let mut seen = Vec::new();
    cluster.wait_until(
        "three lines in the live output",
        Duration::from_secs(60),
        || {
            seen = cluster.output(&run_id, "slow", "stdout").1;
            seen.starts_with(b"line 0\nline 1\nline 2\n")
        },
    );
    cluster.workers[0].process.signal(Signal::SIGKILL);
    cluster.workers[0]
        .process
        .wait_exit(Duration::from_secs(60))
        .expect("the worker died");
    let (status, after) = cluster.output(&run_id, "slow", "stdout");
    assert_eq!(status, 200);
    assert!(
        after.starts_with(&seen),
        "{:?}",
        String::from_utf8_lossy(&after)
    );
}

/// Retention covers output: the reaper deletes a finished run's output `reclaim_after`
/// after it finished (0 s here), and the API then says it was reclaimed. A dry run
/// deletes nothing.
#[tokio::test]
async fn the_reaper_reclaims_the_output_of_a_finished_run() {
    let _services = ServiceLock::shared().await;
    let (cluster, step) = completed_step("output-reclaim", "echo kept for a while").await;
    let run_id = step["run_id"].as_str().expect("run id");
    let request = step["request_id"].as_str().expect("request id");
    let outputs = cluster.dir.join("artifacts").join("outputs").join(request);
    assert!(outputs.exists(), "{}", outputs.display());
    let sweep = |args: &[&str]| {
        let mut env = cluster.isolation.env();
        env.extend([
            ("CAIRN_RECLAIM_AFTER_SECONDS".to_string(), "0".to_string()),
            (
                "CAIRN_METRICS_LISTEN".to_string(),
                cairn_e2e::free_addr().to_string(),
            ),
        ]);
        let mut reaper = Process::start_with_args("cairn-reaper", &env, args);
        let done = reaper
            .wait_exit(Duration::from_secs(60))
            .expect("one sweep");
        assert!(done.success(), "{}", reaper.log());
    };
    sweep(&["--once", "--dry-run"]);
    assert_eq!(
        cluster.output(run_id, "out", "stdout"),
        (200, b"kept for a while\n".to_vec())
    );
    sweep(&["--once"]);
    assert!(!outputs.exists(), "{} is still there", outputs.display());
    let (status, body) = cluster.output(run_id, "out", "stdout");
    assert_eq!(status, 410, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("output_reclaimed"));
}

/// `runs logs --follow` follows a step again when a later attempt runs it again: the
/// worker running it is killed, another one re-runs it (it is idempotent), and the
/// follower prints both attempts' lines, then exits.
#[tokio::test]
async fn a_follower_follows_a_step_run_again_by_the_next_attempt() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("output-rerun", 2, Settings::default()).await;
    let script = "echo start $CAIRN_ATTEMPT; sleep 3; echo done $CAIRN_ATTEMPT";
    let step = json!({"key": "slow", "argv": ["sh", "-c", script], "idempotent": true});
    let (run_id, request_id) = cluster.submit(&run_spec(vec![step], 3));
    let mut follower = cluster
        .cairnctl()
        .args(["runs", "logs", &run_id, "--follow"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("cairnctl");
    let mut lines = BufReader::new(follower.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("text");
    assert_eq!(first, "start 1");
    let holder = cluster.holder(&request_id).await.expect("a holder");
    cluster.workers[cluster.worker_index(&holder)]
        .process
        .signal(Signal::SIGKILL);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = follower.wait().expect("cairnctl exits");
    assert!(status.success(), "{status}");
    assert_eq!(rest, ["start 2", "done 2"], "after the kill");
    cluster.wait_for_state(&run_id, &["completed"], Duration::from_secs(60));
}

/// The `output` events of a followed step, read until `stop` says so or the stream ends:
/// each event's id and its bytes. A run shows `running` from its claim, before its step
/// starts: a step not started yet answers 404, and is asked again for up to 30 s.
async fn follow_events(
    cluster: &Cluster,
    path: &str,
    last: Option<&str>,
    stop: impl Fn(&[(String, Vec<u8>)]) -> bool,
) -> Vec<(String, Vec<u8>)> {
    let asking = std::time::Instant::now();
    let mut response = loop {
        let mut request = reqwest::Client::new()
            .get(format!("http://{}{path}", cluster.api))
            .bearer_auth(cairn_e2e::cluster::ADMIN);
        if let Some(last) = last {
            request = request.header("last-event-id", last);
        }
        let response = request.send().await.expect("follow");
        if response.status() != 404 || asking.elapsed() > Duration::from_secs(30) {
            break response;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(response.status(), 200);
    let (mut buffer, mut events) = (String::new(), Vec::new());
    while !stop(&events) {
        let Ok(Some(chunk)) = response.chunk().await else {
            break;
        };
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            if !block.contains("event: output") {
                continue;
            }
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap_or_default()
                    .to_string()
            };
            let data: Value = serde_json::from_str(&field("data: ")).expect("data");
            let bytes = unescape(data["text"].as_str().expect("text")).expect("escaped text");
            events.push((field("id: "), bytes));
        }
    }
    events
}

/// A follower that reconnects with the last event's id as `Last-Event-ID` gets the rest
/// of the output: nothing twice, nothing missed.
#[tokio::test]
async fn a_follower_that_reconnects_goes_on_after_its_last_event() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("output-resume", 1, Settings::default()).await;
    let script = "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.7; done";
    let step = json!({"key": "tick", "argv": ["sh", "-c", script]});
    let (run_id, _) = cluster.submit(&run_spec(vec![step], 1));
    cluster.wait_for_state(&run_id, &["running"], Duration::from_secs(60));
    let path = format!("/api/v1/runs/{run_id}/steps/tick/output?stream=stdout&follow=true");
    let first = follow_events(&cluster, &path, None, |e| {
        e.iter().any(|(_, b)| b.windows(6).any(|w| w == b"line 2"))
    })
    .await;
    let last = first.last().expect("an event").0.clone();
    // The attempt (its lease epoch) and the chunk's number.
    let (epoch, seq) = last.split_once(':').expect("EPOCH:SEQ");
    assert_eq!(epoch, "1", "{last:?}");
    assert!(seq.parse::<u64>().is_ok(), "{last:?}");
    let rest = follow_events(&cluster, &path, Some(&last), |_| false).await;
    let joined: Vec<u8> = first.into_iter().chain(rest).flat_map(|(_, b)| b).collect();
    let expected: String = (1..=6).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&joined), expected);
    cluster.wait_for_state(&run_id, &["completed"], Duration::from_secs(30));
}
