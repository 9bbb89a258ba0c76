//! Faults that heal never cost a run anything: a Redis that stops answering (it is
//! advisory) neither holds a job up nor makes a worker think it lost its lease.

use cairn_e2e::cluster::{append_step, run_spec, Cluster, Settings};
use cairn_e2e::{free_addr, ServiceLock};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A Redis server of this test's own, so stopping it disturbs nobody else.
struct OwnRedis {
    child: Child,
    url: String,
}

impl OwnRedis {
    fn start() -> OwnRedis {
        let port = free_addr().port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (from the distribution's package) runs");
        let url = format!("redis://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        OwnRedis { child, url }
    }

    fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        kill(pid, signal).expect("signal redis-server");
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.signal(Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Redis stops answering (SIGSTOP: connections hang, as in a network partition) while
/// runs are claimed, renewed and completed: they all complete in their first attempt,
/// and no worker reports a lost lease.
#[tokio::test]
async fn a_redis_that_stops_answering_costs_no_lease() {
    let _services = ServiceLock::shared().await;
    let redis = OwnRedis::start();
    let mut cluster = Cluster::start("faults-redis", 0, Settings::default()).await;
    cluster
        .worker_env
        .push(("CAIRN_REDIS_URL".into(), redis.url.clone()));
    cluster.add_worker();
    redis.signal(Signal::SIGSTOP);
    let runs: Vec<String> = (0..6)
        .map(|i| {
            let spec = run_spec(
                vec![
                    append_step("s1", "log.txt", &format!("{i}"), 1.5, false),
                    append_step("s2", "log.txt", &format!("{i}"), 1.5, false),
                ],
                1,
            );
            cluster.submit(&spec).0
        })
        .collect();
    for run_id in &runs {
        let run = cluster.wait_for_state(
            run_id,
            &["completed", "failed", "needs_reconciliation"],
            Duration::from_secs(120),
        );
        assert_eq!(run["state"], "completed", "{run}");
        assert_eq!(run["attempt"], 1, "{run}");
    }
    assert_eq!(
        cluster.metric(0, "cairn_worker_leases_lost_total"),
        0.0,
        "a Redis outage is not a lost lease"
    );
    redis.signal(Signal::SIGCONT);
}

/// Every connection to the test's database is cut, again and again, while a
/// non-idempotent step ends and its receipt is written: the worker, whose lease is
/// still valid, retries the write instead of giving up, and the run completes in its
/// first attempt with each step run once. Nothing goes to a person.
#[tokio::test]
async fn a_lost_database_connection_at_a_receipt_is_retried_within_the_lease() {
    let _services = ServiceLock::shared().await;
    let settings = lease_of(30);
    let mut cluster = Cluster::start("faults-db", 0, settings).await;
    cluster.add_worker();
    let marker = cluster.path("s1-ending");
    let step = |key: &str, extra: &str| {
        serde_json::json!({
            "key": key,
            "argv": ["sh", "-c", format!("sleep 0.5; echo {key} >> log.txt; echo {key} >> {}; {extra}", cluster.path("effects"))],
            "idempotent": false,
            "timeout_seconds": 60
        })
    };
    let spec = run_spec(
        vec![
            step("s1", &format!("touch {marker}; sleep 0.3")),
            step("s2", ""),
        ],
        1,
    );
    let (run_id, _) = cluster.submit(&spec);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::path::Path::new(&marker).exists() {
        assert!(Instant::now() < deadline, "s1 never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Cut every connection of the cluster for 2.5 s: s1's end and receipt, s2's intent,
    // its run and receipt, and the completion all fall inside.
    let cut = Instant::now();
    let mut cuts = 0;
    while cut.elapsed() < Duration::from_millis(2500) {
        cuts += sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                                    WHERE datname = current_database() AND pid <> pg_backend_pid()) t",
        )
        .fetch_one(&cluster.pool)
        .await
        .expect("terminate");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(cuts > 0, "no connection was cut");
    let run = cluster.wait_for_state(
        &run_id,
        &["completed", "failed", "needs_reconciliation"],
        Duration::from_secs(90),
    );
    assert_eq!(run["state"], "completed", "{run}");
    assert_eq!(run["attempt"], 1, "{run}");
    assert_eq!(cluster.lines("effects"), ["s1", "s2"], "each step ran once");
}

/// The worker's connection is cut inside the completion's transaction (for a plain
/// run, the last receipt's, which the completion commits with), before it commits: the
/// worker, whose lease is still valid, writes it again instead of leaving the request
/// to the sweeper. The run completes in its first attempt, and
/// nothing counts as fencing.
#[tokio::test]
async fn a_lost_database_connection_at_the_completion_is_retried_within_the_lease() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("faults-completion", 0, Settings::default()).await;
    cluster.worker_env.push((
        "CAIRN_FAULT_POINTS".into(),
        "before_completion_commit".into(),
    ));
    cluster.add_worker();
    let effects = cluster.path("effects");
    let spec = run_spec(vec![append_step("s1", &effects, "s1", 0.0, false)], 1);
    let (run_id, _) = cluster.submit(&spec);
    let ended = [
        "completed",
        "failed",
        "needs_reconciliation",
        "stopped_at_checkpoint",
    ];
    let run = cluster.wait_for_state(&run_id, &ended, Duration::from_secs(60));
    assert_eq!(run["state"], "completed", "{run}");
    assert_eq!(
        run["attempt"], 1,
        "the completion was retried by its owner: {run}"
    );
    assert_eq!(cluster.lines("effects"), ["s1"], "the step ran once");
    assert!(
        cluster
            .logs()
            .contains("fault injection: this connection is cut"),
        "the fault was injected"
    );
    // The tree's release is written with the completion, so it was written again too:
    // the row is destroyed, the lineage retired, and the tree is gone.
    let released: (String, bool, String) = sqlx::query_as(
        "SELECT w.state, h.retired_at IS NOT NULL, w.path FROM workspaces w
           JOIN lineage_heads h ON h.work_context_id = w.work_context_id
          WHERE w.run_id = $1::uuid",
    )
    .bind(&run_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("the run's workspace");
    assert_eq!((released.0.as_str(), released.1), ("destroyed", true));
    // The files go once the transaction committed, just after the run shows completed.
    let tree = std::path::Path::new(&released.2);
    let removing = Instant::now();
    while tree.exists() && removing.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!tree.exists(), "the tree was removed");
    assert_eq!(
        cluster.metric(0, "cairn_worker_stale_writes_rejected_total"),
        0.0
    );
    assert_eq!(cluster.metric(0, "cairn_worker_self_fenced_total"), 0.0);
}

/// A worker dies (SIGKILL) in the middle of a step while another keeps beating: its
/// request is taken over as soon as its heartbeats lapse, long before its 60 s lease
/// would have, and the run completes.
#[tokio::test]
async fn a_dead_workers_request_is_taken_over_when_its_heartbeats_stop() {
    let _services = ServiceLock::shared().await;
    let settings = lease_of(60);
    let cluster = Cluster::start("faults-takeover", 2, settings).await;
    // Both workers beat for a while (a worker that started after the other died is no
    // evidence that the database was reachable while it was silent).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spec = run_spec(vec![append_step("s1", "log.txt", "one", 3.0, true)], 3);
    let (run_id, request_id) = cluster.submit(&spec);
    let (holder, _) = cluster
        .wait_for_holder(&request_id, None, Duration::from_secs(60))
        .await;
    let index = cluster.worker_index(&holder);
    cluster.workers[index].process.signal(Signal::SIGKILL);
    // Well inside the 60 s lease: the heartbeats, not the TTL, decide.
    let (_, took) = cluster
        .wait_for_holder(&request_id, Some(&holder), Duration::from_secs(30))
        .await;
    println!("taken over {took:?} after the kill");
    cluster.wait_for_state(&run_id, &["completed"], Duration::from_secs(60));
}

/// The only worker dies (SIGKILL) and a replacement with another name starts, as a new
/// pod would: once the replacement has beaten for the lapse, it is evidence that the
/// database was reachable while the dead worker was silent, and it takes the request
/// over long before the dead worker's 60 s lease would have lapsed.
#[tokio::test]
async fn a_replacement_worker_takes_over_from_a_dead_one() {
    let _services = ServiceLock::shared().await;
    let settings = lease_of(60);
    let mut cluster = Cluster::start("faults-replacement", 1, settings).await;
    let spec = run_spec(vec![append_step("s1", "log.txt", "one", 3.0, true)], 3);
    let (run_id, request_id) = cluster.submit(&spec);
    cluster
        .wait_for_holder(&request_id, None, Duration::from_secs(60))
        .await;
    cluster.workers[0].process.signal(Signal::SIGKILL);
    let killed = Instant::now();
    cluster.add_worker();
    let (holder, _) = cluster
        .wait_for_holder(&request_id, Some("w1"), Duration::from_secs(20))
        .await;
    assert_eq!(holder, "w2");
    println!("taken over {:?} after the kill", killed.elapsed());
    cluster.wait_for_state(&run_id, &["completed"], Duration::from_secs(60));
}

/// A worker that only pauses (SIGSTOP for less than the lapse) is not taken over: its
/// run completes in its first attempt.
#[tokio::test]
async fn a_worker_that_pauses_briefly_keeps_its_request() {
    let _services = ServiceLock::shared().await;
    let settings = lease_of(60);
    let cluster = Cluster::start("faults-slow", 2, settings).await;
    let spec = run_spec(vec![append_step("s1", "log.txt", "one", 4.0, false)], 3);
    let (run_id, request_id) = cluster.submit(&spec);
    let (holder, _) = cluster
        .wait_for_holder(&request_id, None, Duration::from_secs(60))
        .await;
    let worker = &cluster.workers[cluster.worker_index(&holder)].process;
    // 2 s against a 5 s lapse: the last beat may be 1 s old when it stops, and its
    // first beat after may take a moment.
    worker.signal(Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_secs(2)).await;
    worker.signal(Signal::SIGCONT);
    let run = cluster.wait_for_state(
        &run_id,
        &["completed", "needs_reconciliation"],
        Duration::from_secs(60),
    );
    assert_eq!(run["state"], "completed", "{run}");
    assert_eq!(run["attempt"], 1, "{run}");
}

/// A worker stalls (SIGSTOP) while full: RabbitMQ goes on pushing deliveries ahead to
/// it, and they wait there until the broker drops its connection (a minute or more). A
/// request still queued well after its announcement, while another worker has been
/// waiting for work all that time, is announced again, so every run admitted after the
/// stall completes within seconds. The stalled worker's own requests are taken over
/// when its heartbeats lapse.
#[tokio::test]
async fn deliveries_parked_on_a_stalled_worker_are_announced_again() {
    let _services = ServiceLock::shared().await;
    let cluster = stall_a_full_worker("faults-parked").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    let effects = cluster.path("effects");
    let quick: Vec<String> = (0..8)
        .map(|n| {
            let step = append_step("q", &effects, &n.to_string(), 0.0, true);
            cluster.submit(&run_spec(vec![step], 3)).0
        })
        .collect();
    for run_id in &quick {
        let left = Duration::from_secs(25).saturating_sub(started.elapsed());
        let run = cluster.wait_for_state(run_id, &["completed", "failed"], left);
        assert_eq!(run["state"], "completed", "{run}");
    }
    println!(
        "8 runs admitted after the stall completed in {:?}",
        started.elapsed()
    );
    let mut lines = cluster.lines("effects");
    lines.sort();
    assert_eq!(
        lines,
        ["0", "1", "2", "3", "4", "5", "6", "7"],
        "each ran once"
    );
    cluster.workers[0].process.signal(Signal::SIGCONT);
}

/// The same under a steady load: the other worker gets a delivery every few hundred
/// milliseconds, so it never waits long for work, but runs announced after the parked
/// ones are claimed while those stay queued (a queue is first in, first out): the
/// parked runs are announced again and complete.
#[tokio::test]
async fn deliveries_parked_on_a_stalled_worker_are_announced_again_under_load() {
    let _services = ServiceLock::shared().await;
    let cluster = stall_a_full_worker("faults-parked-load").await;
    let started = Instant::now();
    let effects = cluster.path("effects");
    let mut runs: Vec<(String, Instant)> = Vec::new();
    // A run every 250 ms for 16 s (w1's consumers take their prefetch's worth first);
    // while the load goes on, every run admitted 8 s ago or more has completed.
    while started.elapsed() < Duration::from_secs(16) {
        let step = append_step("q", &effects, &runs.len().to_string(), 0.0, true);
        runs.push((cluster.submit(&run_spec(vec![step], 3)).0, Instant::now()));
        for (run_id, admitted) in &runs {
            if admitted.elapsed() > Duration::from_secs(8) {
                let run = cluster.run(run_id);
                assert_eq!(run["state"], "completed", "8 s after admission: {run}");
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    cluster.workers[0].process.signal(Signal::SIGCONT);
}

fn lease_of(seconds: u64) -> Settings {
    Settings {
        lease_ttl_seconds: seconds,
        ..Settings::default()
    }
}

/// A cluster whose w1 is full (concurrency 4, four 8 s runs) and stalled by SIGSTOP with
/// its consumers still open (its AMQP heartbeat is 600 s), and a w2 with room for 16.
async fn stall_a_full_worker(label: &str) -> Cluster {
    let mut cluster = Cluster::start(label, 0, Settings::default()).await;
    // A long AMQP heartbeat: the broker keeps the stalled worker's connection, as it does
    // for a worker that is merely busy, so only the sweeper can free what it holds.
    cluster
        .worker_env
        .push(("CAIRN_AMQP_HEARTBEAT_SECONDS".into(), "600".into()));
    cluster.add_worker();
    cluster.worker_env.pop();
    for n in 0..4 {
        let step = append_step("s1", "log.txt", &n.to_string(), 8.0, true);
        let (_, request_id) = cluster.submit(&run_spec(vec![step], 3));
        cluster
            .wait_for_holder(&request_id, None, Duration::from_secs(60))
            .await;
    }
    cluster.workers[0].process.signal(Signal::SIGSTOP);
    cluster
        .worker_env
        .push(("CAIRN_WORKER_CONCURRENCY".into(), "16".into()));
    cluster.add_worker();
    cluster
}

/// Runs a one-step run on a worker armed with the fault point `point` and checks it
/// healed without a person or a second attempt: the run completes in its first
/// attempt, the fault was injected (`injected` is in the logs), the step ran once and
/// nothing counted as fencing. Returns the cluster and the request's id.
async fn one_step_healed(label: &str, point: &str, injected: &str) -> (Cluster, String) {
    healed(label, point, injected, &["s1"]).await
}

/// [`one_step_healed`], for a run of `steps` (each appends its key to one file, outside
/// the tree, after 50 ms: a wall time a receipt charged twice would show).
async fn healed(label: &str, point: &str, injected: &str, steps: &[&str]) -> (Cluster, String) {
    let mut cluster = Cluster::start(label, 0, Settings::default()).await;
    cluster
        .worker_env
        .push(("CAIRN_FAULT_POINTS".into(), point.into()));
    cluster.add_worker();
    let effects = cluster.path("effects");
    let specs = (steps.iter())
        .map(|key| append_step(key, &effects, key, 0.05, false))
        .collect();
    let spec = run_spec(specs, 1);
    let (run_id, request_id) = cluster.submit(&spec);
    let ended = ["completed", "failed", "needs_reconciliation"];
    let run = cluster.wait_for_state(&run_id, &ended, Duration::from_secs(60));
    assert_eq!(run["state"], "completed", "{run}");
    assert_eq!(run["attempt"], 1, "{run}");
    assert!(cluster.logs().contains(injected), "the fault was injected");
    assert_eq!(cluster.lines("effects"), steps, "each step ran once");
    assert_eq!(
        cluster.metric(0, "cairn_worker_stale_writes_rejected_total"),
        0.0
    );
    assert_eq!(cluster.metric(0, "cairn_worker_self_fenced_total"), 0.0);
    (cluster, request_id)
}

/// The worker's connection is cut inside the claim's transaction, after it took the
/// lease: nothing of the claim lands, not even the epoch's move, so no lease is left
/// to lapse. The redelivered message claims the request at epoch 1.
#[tokio::test]
async fn a_claim_cut_before_its_commit_leaves_no_lease_behind() {
    let _services = ServiceLock::shared().await;
    let cut = "fault injection: this connection is cut";
    let (cluster, request_id) = one_step_healed("faults-claim", "inside_claim", cut).await;
    let epoch: i64 =
        sqlx::query_scalar("SELECT lease_epoch FROM execution_requests WHERE id = $1::uuid")
            .bind(&request_id)
            .fetch_one(&cluster.pool)
            .await
            .expect("the request's epoch");
    assert_eq!(epoch, 1, "the cut claim moved no epoch");
}

/// A commit armed with `point` landed and its reply was lost: the worker read it back,
/// and the step's command was charged once.
async fn a_lost_reply_is_read_back(label: &str, point: &str) {
    let _services = ServiceLock::shared().await;
    let lost = "fault injection: a commit's reply is lost";
    let (cluster, request_id) = one_step_healed(label, point, lost).await;
    let used = used_commands(&cluster, &request_id).await;
    assert_eq!(used, 1, "the step's command was charged once");
}

/// The last step left the tree unchanged, so its receipt and the completion were sealed
/// on the tree's snapshot with no capture, and that commit's reply was lost: the worker
/// reads the receipt back, then the completion from the request, and counts the run
/// completed once.
#[tokio::test]
async fn a_lost_reply_to_an_unchanged_trees_seal_is_read_back() {
    let _services = ServiceLock::shared().await;
    let lost = "fault injection: a commit's reply is lost";
    // The first step captures the fresh tree; the second changes nothing in it.
    let (label, steps) = ("faults-unchanged-seal-reply", ["s1", "s2"]);
    let (cluster, request_id) = healed(label, "seal_reply@2", lost, &steps).await;
    assert_eq!(used_commands(&cluster, &request_id).await, 2);
    let completed = cluster.metric(0, "cairn_worker_jobs_completed_total");
    assert_eq!(completed, 1.0, "the run was counted completed once");
}

/// A middle step left the tree unchanged, so its receipt was sealed on the tree's
/// snapshot with no capture, and that commit's reply was lost: the worker reads the
/// receipt back instead of writing it again, which would charge its wall time twice.
#[tokio::test]
async fn a_lost_reply_to_an_unchanged_trees_receipt_is_read_back() {
    let _services = ServiceLock::shared().await;
    let lost = "fault injection: a commit's reply is lost";
    let (label, steps) = ("faults-unchanged-receipt-reply", ["s1", "s2", "s3"]);
    let (cluster, request_id) = healed(label, "seal_reply@2", lost, &steps).await;
    assert_eq!(used_commands(&cluster, &request_id).await, 3);
    let (used, receipts): (i64, i64) = sqlx::query_as(
        "SELECT e.used_wall_ms, (SELECT sum(wall_ms)::bigint FROM journal_receipts r WHERE r.request_id = e.id)
           FROM execution_requests e WHERE e.id = $1::uuid",
    )
    .bind(&request_id)
    .fetch_one(&cluster.pool)
    .await
    .expect("the request's wall time");
    assert_eq!(used, receipts, "each receipt's wall time was charged once");
}

/// The commands charged to a request.
async fn used_commands(cluster: &Cluster, request_id: &str) -> i32 {
    sqlx::query_scalar("SELECT used_commands FROM execution_requests WHERE id = $1::uuid")
        .bind(request_id)
        .fetch_one(&cluster.pool)
        .await
        .expect("the request's charge")
}

/// The tree's record in use, with the first intent, landed but its reply was lost: the
/// worker reads the record back and runs the step, instead of leaving an intent without
/// its step to a successor (which would send a non-idempotent step to a person).
#[tokio::test]
async fn a_lost_reply_to_the_trees_record_is_read_back() {
    a_lost_reply_is_read_back("faults-in-use-reply", "in_use_reply").await;
}

/// A later step's intent landed but its reply was lost, and the first read-back of it
/// was not answered either: the worker asks again instead of writing the intent again,
/// so each step's command is charged once and each step runs once.
#[tokio::test]
async fn an_intent_is_not_written_again_while_its_read_back_is_unanswered() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("faults-intent-read-back", 0, Settings::default()).await;
    let points = "intent_reply,intent_read_back";
    cluster
        .worker_env
        .push(("CAIRN_FAULT_POINTS".into(), points.into()));
    cluster.add_worker();
    let effects = cluster.path("effects");
    let steps = vec![
        append_step("s1", &effects, "s1", 0.0, false),
        append_step("s2", &effects, "s2", 0.0, false),
    ];
    let (run_id, request_id) = cluster.submit(&run_spec(steps, 1));
    let ended = ["completed", "failed", "needs_reconciliation"];
    let run = cluster.wait_for_state(&run_id, &ended, Duration::from_secs(60));
    assert_eq!(run["state"], "completed", "{run}");
    assert_eq!(run["attempt"], 1, "{run}");
    let logs = cluster.logs();
    assert!(logs.contains("fault injection: a commit's reply is lost"));
    assert!(logs.contains("fault injection: a read-back is not answered"));
    assert_eq!(cluster.lines("effects"), ["s1", "s2"], "each step ran once");
    let used = used_commands(&cluster, &request_id).await;
    assert_eq!(used, 2, "each step's command was charged once");
}

/// The last receipt, its checkpoint and the completion landed but the reply was lost:
/// the worker reads the completion back instead of taking the released lease for a
/// lost one.
#[tokio::test]
async fn a_lost_reply_to_the_completion_with_the_receipt_is_read_back() {
    a_lost_reply_is_read_back("faults-seal-reply", "seal_reply").await;
}
