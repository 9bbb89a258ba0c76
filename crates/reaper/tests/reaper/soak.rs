//! A reaper soak: random captures, restores, credential rotations, task state changes
//! and sweeps, with the clock moved forward by up to days at a time. Whatever the
//! order, every snapshot the reaper has not deleted still restores whole, and every
//! task that has not ended keeps a head until a rule it can see (a rotation) retires it.
//! `CAIRN_SOAK_SEED` replays a failure; the seed is printed.

use cairn_common::lineage::{self, NewSnapshot};
use cairn_common::testing::{self, TestDb};
use cairn_reaper::retention::{Durations, Sweep};
use cairn_snapshot::{self as snapshot, CaptureRules, Manifest, Repository};
use chrono::{DateTime, Duration, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use uuid::Uuid;

const TASKS: usize = 6;
const ROUNDS: usize = 120;
const AGENT: &str = "test-agent";

struct Task {
    context: Uuid,
    request: Uuid,
    tree: PathBuf,
    /// The manifest of the task's head, as its worker would keep it.
    head: Option<(Uuid, Arc<Manifest>)>,
}

fn scratch(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cairn-soak-{label}-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("scratch");
    dir
}

/// Sets a snapshot's clocks to the simulated `now`.
async fn at(pool: &PgPool, id: Uuid, now: DateTime<Utc>) {
    sqlx::query("UPDATE project_snapshots SET created_at = $2, last_used_at = $2 WHERE id = $1")
        .bind(id)
        .bind(now)
        .execute(pool)
        .await
        .expect("clock");
}

/// A checkpoint of `task`, as a worker takes one: registered with the store, captured
/// against the previous manifest, then made ready and appended in one transaction.
async fn capture(
    pool: &PgPool,
    store: &Repository,
    store_id: Uuid,
    task: &mut Task,
    manifests: &mut HashMap<Uuid, Manifest>,
    now: DateTime<Utc>,
) {
    let mut tx = pool.begin().await.expect("begin");
    let generation = lineage::lock_for_capture(&mut tx, AGENT, store_id)
        .await
        .expect("locks")
        .expect("the store is free");
    let id = lineage::create(
        &mut tx,
        &NewSnapshot {
            store_url: store.url(),
            store_id,
            credential_generation: generation,
            ..testing::new_checkpoint(AGENT, task.context)
        },
    )
    .await
    .expect("create");
    tx.commit().await.expect("commit");
    let previous = task.head.as_ref().map(|h| h.1.clone());
    let (manifest, _) =
        snapshot::capture(store, &task.tree, &CaptureRules::default(), previous, id)
            .await
            .expect("capture");
    let mut tx = pool.begin().await.expect("begin");
    super::retention::mark_ready(&mut tx, id, &manifest.packs).await;
    let expected = task.head.as_ref().map(|h| h.0);
    lineage::append(&mut tx, task.context, AGENT, expected, id)
        .await
        .expect("append");
    tx.commit().await.expect("commit");
    at(pool, id, now).await;
    task.head = Some((id, Arc::new(manifest.clone())));
    manifests.insert(id, manifest);
}

/// Every snapshot the reaper has not deleted restores whole.
async fn all_restore(
    pool: &PgPool,
    store: &Repository,
    manifests: &HashMap<Uuid, Manifest>,
    seed: u64,
) {
    let kept: Vec<(Uuid, String, String)> = sqlx::query_as(
        "SELECT id, status, retention FROM project_snapshots WHERE status NOT IN ('deleted', 'failed')",
    )
    .fetch_all(pool)
    .await
    .expect("snapshots");
    for (id, status, retention) in kept {
        let manifest = &manifests[&id];
        snapshot::restore(store, manifest, &scratch("out").join("tree"))
            .await
            .unwrap_or_else(|e| {
                panic!("seed {seed}: snapshot {id} ({status}, {retention}) lost its bytes: {e}")
            });
    }
}

fn seed() -> u64 {
    std::env::var("CAIRN_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

#[tokio::test]
async fn every_snapshot_the_reaper_keeps_restores_through_random_histories() {
    let db = TestDb::new().await;
    let seed = seed();
    println!("CAIRN_SOAK_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let store = Repository::open(scratch("store").to_str().expect("utf8")).expect("store");
    let store_id = store.identity().await.expect("identity");
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let (context, request) = testing::insert_request(&db.pool).await;
        let tree = scratch(&format!("tree{i}"));
        // Shared content across tasks, so packs are shared between lineages.
        std::fs::write(tree.join("common.txt"), "common to every task ".repeat(500))
            .expect("write");
        tasks.push(Task {
            context,
            request,
            tree,
            head: None,
        });
    }
    let mut manifests = HashMap::new();
    let mut now = Utc::now();
    let durations = Durations::default();
    for round in 0..ROUNDS {
        now += Duration::hours(rng.random_range(0..72));
        let task = rng.random_range(0..TASKS);
        match rng.random_range(0..10) {
            0..=3 => {
                let t = &mut tasks[task];
                let name = format!("f{}.txt", rng.random_range(0..4));
                let text = format!("round {round} ").repeat(rng.random_range(1..2000));
                std::fs::write(t.tree.join(name), text).expect("write");
                capture(&db.pool, &store, store_id, t, &mut manifests, now).await;
            }
            4 => {
                // A restore of the task's head, as a successor's: it marks the head used.
                let Some((head, manifest)) = tasks[task].head.clone() else {
                    continue;
                };
                let usable: bool = sqlx::query_scalar(
                    "SELECT status = 'ready' AND retention = 'current' FROM project_snapshots WHERE id = $1",
                )
                .bind(head)
                .fetch_one(&db.pool)
                .await
                .expect("head");
                if usable {
                    snapshot::restore(&store, &manifest, &scratch("restore").join("tree"))
                        .await
                        .unwrap_or_else(|e| panic!("seed {seed} round {round}: head lost: {e}"));
                    at(&db.pool, head, now).await;
                }
            }
            5 => {
                let mut conn = db.pool.acquire().await.expect("conn");
                lineage::rotate_credentials(&mut conn, AGENT)
                    .await
                    .expect("rotate");
                // Every lineage starts again under the new generation.
                for t in &mut tasks {
                    t.head = None;
                }
            }
            6 | 7 => {
                let states = [
                    "executing",
                    "stopped_at_checkpoint",
                    "needs_reconciliation",
                    "completed",
                    "failed",
                ];
                let state = states[rng.random_range(0..states.len())];
                // A terminal state is final (the transition table's rule).
                sqlx::query(
                    "UPDATE execution_requests SET state = $2, updated_at = $3
                      WHERE id = $1 AND state NOT IN ('completed', 'failed', 'cancelled')",
                )
                .bind(tasks[task].request)
                .bind(state)
                .bind(now)
                .execute(&db.pool)
                .await
                .expect("state");
            }
            _ => {
                Sweep {
                    pool: &db.pool,
                    now,
                    durations: &durations,
                    batch: rng.random_range(1..5),
                    dry_run: rng.random_range(0..4) == 0,
                }
                .run()
                .await
                .expect("sweep");
                // A head the reaper retired is one its task cannot continue from.
                let mut conn = db.pool.acquire().await.expect("conn");
                for t in &mut tasks {
                    let Some((head, _)) = t.head else { continue };
                    let current = lineage::head(&mut conn, t.context).await.expect("head");
                    if current.map(|h| h.0) != Some(head) {
                        t.head = None;
                    }
                }
            }
        }
        if round % 40 == 39 {
            all_restore(&db.pool, &store, &manifests, seed).await;
        }
    }
    // The last sweep far in the future: everything due goes, nothing needed does.
    Sweep {
        pool: &db.pool,
        now: now + Duration::days(60),
        durations: &durations,
        batch: 3,
        dry_run: false,
    }
    .run()
    .await
    .expect("sweep");
    all_restore(&db.pool, &store, &manifests, seed).await;
    // A task that has not ended keeps its head unless a rotation retired it.
    let lost: Vec<Uuid> = sqlx::query_scalar(
        "SELECT h.work_context_id FROM lineage_heads h
           JOIN project_snapshots s ON s.id = h.head_id
           JOIN runs r ON r.work_context_id = h.work_context_id
           JOIN execution_requests e ON e.run_id = r.id
          WHERE e.state NOT IN ('completed', 'failed', 'cancelled')
            AND (h.retired_at IS NOT NULL OR s.status = 'deleted')
            AND s.retire_reason IS DISTINCT FROM 'credentials_rotated'",
    )
    .fetch_all(&db.pool)
    .await
    .expect("heads");
    assert!(
        lost.is_empty(),
        "seed {seed}: live tasks lost their heads: {lost:?}"
    );
}
