//! A local simulation of KEDA scaling the worker Deployment down (docs/KUBERNETES.md,
//! "Scaling"), since there is no cluster here. Workers run jobs; KEDA's decision is
//! computed from the chart's metrics (`cairn_worker_demand`: its runs against the job
//! slots, its sandboxes against the sandbox slots), as KEDA and the HPA compute it; and the workers the ReplicaSet would stop get SIGTERM with
//! the chart's drain. Without a pod-deletion cost the ReplicaSet may pick any pod, so
//! the simulation picks the busiest: the worst case. No running step may be stopped,
//! and every run must complete.

use cairn_common::queue::{JobQueue, Topology};
use cairn_e2e::cluster::{Cluster, Settings};
use cairn_e2e::{testing, ServiceLock};
use nix::sys::signal::Signal;
use serde_json::json;
use std::time::{Duration, Instant};

const CONCURRENCY: i64 = 2;
const WORKERS: usize = 3;
const RUNS: usize = 4;
const STEPS: [&str; 3] = ["one", "two", "three"];
const STEP_SECONDS: u64 = 2;
/// The drain covers the longest step (as docs/KUBERNETES.md says to set it), not a whole
/// run: a draining worker hands each run back at its next step boundary.
const DRAIN_SECONDS: u64 = 5;
/// The chart's worker grace is drainSeconds + captureSeconds + margin; a worker that
/// outlived it would be killed (SIGKILL) by Kubernetes.
const GRACE: Duration = Duration::from_secs(DRAIN_SECONDS + 120 + 30);

/// The replicas KEDA's PostgreSQL scaler makes the HPA want. The metric is external, of
/// type AverageValue: the HPA wants ceil(metric / target), keeps the current count when
/// metric / (target × current) is within its 10 % tolerance, and stays within
/// [max(min, 1), max]. At or under the activation value KEDA deactivates the scaler and
/// sets minReplicaCount itself (0 is then allowed).
fn keda_replicas(demand: i64, target: i64, current: i64, min: i64, max: i64) -> i64 {
    const ACTIVATION: i64 = 0;
    if demand <= ACTIVATION {
        return min;
    }
    let current = current.max(1);
    let ratio = demand as f64 / (target * current) as f64;
    let wanted = if (ratio - 1.0).abs() <= 0.1 {
        current
    } else {
        (demand + target - 1) / target
    };
    wanted.clamp(min.max(1), max)
}

/// What the chart's runs trigger reads.
async fn demand(cluster: &Cluster) -> i64 {
    sqlx::query_scalar("SELECT runs FROM cairn_worker_demand")
        .fetch_one(&cluster.pool)
        .await
        .expect("the demand view")
}

/// What the chart's old trigger read: the messages in the job queues (ready and
/// unacked). A worker acks at its claim, so running jobs are not there.
async fn queued_messages(cluster: &Cluster) -> i64 {
    let connection = cairn_common::queue::connect(&testing::amqp_url())
        .await
        .expect("amqp");
    let channel = connection.create_channel().await.expect("channel");
    let topology = Topology::new(&cluster.isolation.prefix, 5);
    let mut total = 0;
    for queue in JobQueue::ALL {
        let declared = channel
            .queue_declare(
                topology.queue(queue).as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await
            .expect("passive declare");
        total += i64::from(declared.message_count());
    }
    let _ = connection.close(200, "done".into()).await;
    total
}

/// Running requests per live worker id.
async fn running_per_worker(cluster: &Cluster) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT lease_owner, count(*) FROM execution_requests
          WHERE state = 'executing' AND lease_owner IS NOT NULL
          GROUP BY lease_owner",
    )
    .fetch_all(&cluster.pool)
    .await
    .expect("running requests")
}

fn three_steps(run: usize, file: &str) -> serde_json::Value {
    let steps: Vec<_> = STEPS
        .iter()
        .map(|key| {
            let tag = format!("{run}-{key}");
            json!({
                "key": key,
                "argv": ["sh", "-c", format!("echo start-{tag} >> {file}; sleep {STEP_SECONDS}; echo end-{tag} >> {file}")],
                "idempotent": false
            })
        })
        .collect();
    json!({"agent": "e2e", "steps": steps, "budgets": {"max_commands": 10, "max_wall_seconds": 600}, "max_attempts": 1})
}

#[tokio::test]
async fn scaling_down_on_demand_never_stops_a_running_step() {
    let _services = ServiceLock::shared().await;
    let settings = Settings {
        drain_seconds: DRAIN_SECONDS,
        ..Settings::default()
    };
    let mut cluster = Cluster::start("scale", 0, settings).await;
    cluster.worker_env = vec![("CAIRN_WORKER_CONCURRENCY".into(), CONCURRENCY.to_string())];
    for _ in 0..WORKERS {
        cluster.add_worker();
    }
    let file = cluster.path("effects");
    let runs: Vec<String> = (0..RUNS)
        .map(|run| cluster.submit(&three_steps(run, &file)).0)
        .collect();
    cluster.wait_until(
        "every run's first step to start",
        Duration::from_secs(60),
        || {
            let lines = cluster.lines("effects");
            lines
                .iter()
                .filter(|l| l.ends_with("-one") && l.starts_with("start-"))
                .count()
                == RUNS
        },
    );

    // The old trigger saw an empty queue while every run was running, and would have
    // scaled to its minimum, stopping busy workers.
    let busy = running_per_worker(&cluster).await;
    let old = keda_replicas(
        queued_messages(&cluster).await,
        CONCURRENCY,
        WORKERS as i64,
        1,
        10,
    );
    assert!(
        old < busy.len() as i64,
        "old decision {old}, busy workers {busy:?}"
    );

    // KEDA's loop, every polling interval: scale down to its decision, stopping the
    // busiest workers first; minReplicaCount 0.
    let mut live: Vec<usize> = (0..WORKERS).collect();
    let mut decisions = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !live.is_empty() {
        assert!(Instant::now() < deadline, "decisions so far: {decisions:?}");
        let demand = demand(&cluster).await;
        let wanted = keda_replicas(demand, CONCURRENCY, live.len() as i64, 0, 10);
        decisions.push((demand, live.len(), wanted));
        if demand == 0 {
            for run in &runs {
                let state = cluster.run(run)["state"].clone();
                assert_eq!(state, "completed", "no demand while {run} is {state}");
            }
        }
        let running = running_per_worker(&cluster).await;
        while live.len() as i64 > wanted {
            let jobs_of = |index: &usize| {
                let id = &cluster.workers[*index].id;
                running.iter().find(|(w, _)| w == id).map_or(0, |(_, n)| *n)
            };
            let busiest = *live
                .iter()
                .max_by_key(|i| jobs_of(i))
                .expect("a live worker");
            cluster.workers[busiest].process.signal(Signal::SIGTERM);
            live.retain(|i| *i != busiest);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    for worker in cluster.workers.iter_mut() {
        let status = worker
            .process
            .wait_exit(GRACE)
            .expect("a worker outlived the chart's grace period");
        assert!(status.success(), "{}: {}", worker.id, worker.process.log());
    }
    assert!(
        decisions
            .iter()
            .any(|(demand, _, wanted)| *demand > 0 && *wanted > 0),
        "{decisions:?}"
    );

    // Every step ran once, from its start to its end; every run completed on its first
    // attempt, however many workers it moved between.
    let lines = cluster.lines("effects");
    for run in 0..RUNS {
        for key in STEPS {
            for edge in ["start", "end"] {
                let line = format!("{edge}-{run}-{key}");
                let seen = lines.iter().filter(|l| **l == line).count();
                assert_eq!(seen, 1, "{line}: {lines:?}\n{decisions:?}");
            }
        }
    }
    for run in &runs {
        let view = cluster.run(run);
        assert_eq!(view["state"], "completed", "{view}");
        assert_eq!(view["attempt"], 1, "{view}");
    }
}

/// Sandboxes are demand against their own slots (the chart's second trigger): three
/// hosted sandboxes on workers with 4 sandbox slots and 2 job slots ask for one worker,
/// where their sum with the runs, against the job slots, asked for two. A run counts
/// against the job slots beside them.
#[tokio::test]
async fn sandboxes_are_demand_against_their_own_slots() {
    use cairn_e2e::sandboxes::{create, wait_state};
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("scale-sandboxes", 0, Settings::default()).await;
    cluster.worker_env = vec![
        ("CAIRN_WORKER_CONCURRENCY".into(), CONCURRENCY.to_string()),
        ("CAIRN_SANDBOX_SLOTS".into(), "4".into()),
    ];
    cluster.add_worker();
    for _ in 0..3 {
        let id = create(&cluster, json!({"agent": "e2e"}));
        wait_state(&cluster, &id, "running");
    }
    let read = || async {
        let row: (i64, i64, i64) =
            sqlx::query_as("SELECT runs, sandboxes, demand FROM cairn_worker_demand")
                .fetch_one(&cluster.pool)
                .await
                .expect("the demand view");
        row
    };
    let wanted = |runs: i64, sandboxes: i64| {
        keda_replicas(runs, CONCURRENCY, 1, 0, 10).max(keda_replicas(sandboxes, 4, 1, 0, 10))
    };
    let (runs, sandboxes, sum) = read().await;
    assert_eq!((runs, sandboxes, sum), (0, 3, 3));
    assert_eq!(wanted(runs, sandboxes), 1);
    assert_eq!(
        keda_replicas(sum, CONCURRENCY, 1, 0, 10),
        2,
        "the sum asked for more"
    );
    let submitted = cluster.submit(&json!({
        "agent": "e2e",
        "steps": [{"key": "wait", "argv": ["sleep", "30"], "idempotent": true}],
    }));
    let (runs, sandboxes, _) = read().await;
    assert_eq!((runs, sandboxes), (1, 3), "{submitted:?}");
    assert_eq!(wanted(runs, sandboxes), 1);
}
