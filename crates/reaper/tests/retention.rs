//! The reaper's rules, one time-travel test each, against the real PostgreSQL and a real
//! local artifact store.

use cairn_common::lineage::{self, NewSnapshot, SnapshotStatus};
use cairn_common::testing::TestDb;
use cairn_reaper::retention::{Durations, Sweep, SweepReport};
use cairn_snapshot::Repository;
use cairn_snapshot::{self as snapshot, CaptureRules};
use chrono::{DateTime, Duration, Utc};
use sqlx::PgPool;
use std::path::PathBuf;
use uuid::Uuid;

async fn sweep(pool: &PgPool, now: DateTime<Utc>) -> SweepReport {
    Sweep {
        pool,
        now,
        durations: &Durations::default(),
        batch: 100,
        dry_run: false,
    }
    .run()
    .await
    .expect("sweep")
}

fn scratch(label: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("cairn-reaper-{label}-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("scratch");
    dir
}

async fn snapshot_row(
    pool: &PgPool,
    kind: &str,
    store_url: &str,
    context: Option<Uuid>,
    workspace: Option<Uuid>,
) -> Uuid {
    let mut conn = pool.acquire().await.expect("conn");
    let id = lineage::create(
        &mut conn,
        &NewSnapshot {
            kind,
            agent: "agent",
            repository: None,
            backend: "local",
            base_image: None,
            canonical_ref: None,
            work_context_id: context,
            workspace_id: workspace,
            store_url,
            credential_generation: 0,
            owner: None,
        },
    )
    .await
    .expect("create");
    lineage::mark_ready(&mut conn, id, &snapshot::manifest_key(id), 1)
        .await
        .expect("ready");
    id
}

/// A checkpoint capture in progress (`uploading`), of `owner` (request, epoch) if given.
async fn capture_in_progress(
    pool: &PgPool,
    context: Uuid,
    workspace: Option<Uuid>,
    owner: Option<(Uuid, i64)>,
) -> (Uuid, DateTime<Utc>) {
    let mut conn = pool.acquire().await.expect("conn");
    let id = lineage::create(
        &mut conn,
        &NewSnapshot {
            kind: "checkpoint",
            agent: "agent",
            repository: None,
            backend: "local",
            base_image: None,
            canonical_ref: None,
            work_context_id: Some(context),
            workspace_id: workspace,
            store_url: "file:///tmp/none",
            credential_generation: 0,
            owner,
        },
    )
    .await
    .expect("create");
    lineage::set_status(
        &mut conn,
        id,
        &[SnapshotStatus::Creating],
        SnapshotStatus::Uploading,
    )
    .await
    .expect("uploading");
    let created = sqlx::query_scalar("SELECT created_at FROM project_snapshots WHERE id = $1")
        .bind(id)
        .fetch_one(&mut *conn)
        .await
        .expect("created");
    (id, created)
}

async fn field(pool: &PgPool, id: Uuid) -> (String, String) {
    sqlx::query_as("SELECT status, retention FROM project_snapshots WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("row")
}

#[tokio::test]
async fn idle_heads_are_retired_at_fourteen_days_not_before() {
    let db = TestDb::new().await;
    let context = Uuid::new_v4();
    let head = snapshot_row(
        &db.pool,
        "checkpoint",
        "file:///tmp/none",
        Some(context),
        None,
    )
    .await;
    let mut conn = db.pool.acquire().await.expect("conn");
    lineage::append(&mut conn, context, "agent", None, head)
        .await
        .expect("append");
    let used: DateTime<Utc> =
        sqlx::query_scalar("SELECT last_used_at FROM project_snapshots WHERE id = $1")
            .bind(head)
            .fetch_one(&mut *conn)
            .await
            .expect("used");
    let kept = sweep(&db.pool, used + Duration::days(14) - Duration::hours(1)).await;
    assert_eq!(kept.idle_heads_retired, 0, "13 days 23 hours: kept");
    assert_eq!(field(&db.pool, head).await.1, "current");
    let retired = sweep(&db.pool, used + Duration::days(14)).await;
    assert_eq!(retired.idle_heads_retired, 1, "14 days: retired");
    assert_eq!(field(&db.pool, head).await.1, "retired");
    assert!(lineage::restorable_head(&mut conn, context, "agent")
        .await
        .expect("query")
        .is_none());
}

#[tokio::test]
async fn retired_bytes_are_reclaimed_after_seven_days_through_their_own_store() {
    let db = TestDb::new().await;
    // The snapshot lives in a store no configuration names any more.
    let store_dir = scratch("store");
    let store = Repository::open(store_dir.to_str().expect("utf8")).expect("store");
    let tree = scratch("tree");
    std::fs::write(tree.join("shared.txt"), "shared by both snapshots").expect("write");
    let (old, new) = (
        snapshot_row(
            &db.pool,
            "checkpoint",
            store.url(),
            Some(Uuid::new_v4()),
            None,
        )
        .await,
        snapshot_row(
            &db.pool,
            "checkpoint",
            store.url(),
            Some(Uuid::new_v4()),
            None,
        )
        .await,
    );
    // The newer snapshot's capture runs first here, so the shared content lies in its
    // pack and the older snapshot's own content in a pack only the older one names.
    let (new_manifest, _) = snapshot::capture(&store, &tree, &CaptureRules::default(), None, new)
        .await
        .expect("capture");
    std::fs::write(tree.join("only-old.txt"), "only in the old one").expect("write");
    let (old_manifest, _) = snapshot::capture(&store, &tree, &CaptureRules::default(), None, old)
        .await
        .expect("capture");
    let mut conn = db.pool.acquire().await.expect("conn");
    for (id, manifest) in [(old, &old_manifest), (new, &new_manifest)] {
        lineage::record_packs(&mut conn, id, &manifest.packs)
            .await
            .expect("packs");
    }
    let only_old: Vec<Uuid> = old_manifest
        .packs
        .iter()
        .filter(|p| !new_manifest.packs.contains(p))
        .copied()
        .collect();
    assert_eq!(only_old.len(), 1, "the older snapshot's own pack");
    assert_eq!(new_manifest.packs.len(), 1);
    assert!(
        old_manifest.packs.contains(&new_manifest.packs[0]),
        "shared"
    );
    let retired_at = Utc::now();
    sqlx::query(
        "UPDATE project_snapshots SET retention = 'superseded', retired_at = $2 WHERE id = $1",
    )
    .bind(old)
    .bind(retired_at)
    .execute(&mut *conn)
    .await
    .expect("supersede");

    let early = sweep(
        &db.pool,
        retired_at + Duration::days(7) - Duration::minutes(1),
    )
    .await;
    assert_eq!(early.snapshots_reclaimed, 0);
    assert!(store
        .store()
        .exists(&snapshot::manifest_key(old))
        .await
        .expect("exists"));
    let due = sweep(&db.pool, retired_at + Duration::days(7)).await;
    assert_eq!(due.snapshots_reclaimed, 1);
    assert!(due.bytes_reclaimed > 0);
    assert_eq!(
        field(&db.pool, old).await,
        ("deleted".into(), "reclaimed".into())
    );
    assert!(!store
        .store()
        .exists(&snapshot::manifest_key(old))
        .await
        .expect("exists"));
    for pack in &only_old {
        for key in [snapshot::index_key(*pack), snapshot::pack_key(*pack)] {
            assert!(
                !store.store().exists(&key).await.expect("exists"),
                "{key} of an orphan pack is deleted"
            );
        }
    }
    assert!(
        store
            .store()
            .exists(&snapshot::pack_key(new_manifest.packs[0]))
            .await
            .expect("exists"),
        "a pack another snapshot references survives"
    );
    // The snapshot that shares a pack restores whole.
    snapshot::restore(&store, &new_manifest, &scratch("out").join("tree"))
        .await
        .expect("the newer snapshot is whole");
    // Idempotent: another sweep changes nothing.
    assert_eq!(
        sweep(&db.pool, retired_at + Duration::days(8))
            .await
            .snapshots_reclaimed,
        0
    );
}

#[tokio::test]
async fn holds_end_at_expiry_or_with_their_task_but_never_mid_capture() {
    let db = TestDb::new().await;
    let (run_id, _) = cairn_common::testing::insert_request(&db.pool).await;
    let workspace = Uuid::new_v4();
    sqlx::query("INSERT INTO workspaces (id, agent, backend, state) VALUES ($1, 'agent', 'local', 'stopped')")
        .bind(workspace)
        .execute(&db.pool)
        .await
        .expect("workspace");
    let now = Utc::now();
    let hold = |expires: DateTime<Utc>, capturing: bool, run: Option<Uuid>| {
        let pool = db.pool.clone();
        async move {
            let id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO holds (id, workspace_id, run_id, agent, reason, expires_at, capture_in_progress)
                 VALUES ($1, $2, $3, 'agent', 'test', $4, $5)",
            )
            .bind(id)
            .bind(workspace)
            .bind(run)
            .bind(expires)
            .bind(capturing)
            .execute(&pool)
            .await
            .expect("hold");
            id
        }
    };
    let expiring = hold(now + Duration::hours(1), false, None).await;
    let capturing = hold(now + Duration::hours(1), true, None).await;
    let of_task = hold(now + Duration::days(14), false, Some(run_id)).await;
    let ended = |id: Uuid| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>("SELECT ended_at IS NOT NULL FROM holds WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .expect("hold")
        }
    };
    sweep(&db.pool, now + Duration::minutes(59)).await;
    assert!(!ended(expiring).await, "before its expiry");
    sweep(&db.pool, now + Duration::hours(1)).await;
    assert!(ended(expiring).await, "at its expiry");
    assert!(
        !ended(capturing).await,
        "a hold whose capture is in progress is not ended under it"
    );
    assert!(!ended(of_task).await);
    sqlx::query("UPDATE runs SET state = 'cancelled' WHERE id = $1")
        .bind(run_id)
        .execute(&db.pool)
        .await
        .expect("cancel");
    sweep(&db.pool, now + Duration::hours(2)).await;
    assert!(ended(of_task).await, "a cancelled task's hold ends");
}

#[tokio::test]
async fn snapshots_of_rotated_credentials_are_retired() {
    let db = TestDb::new().await;
    let id = snapshot_row(&db.pool, "baseline", "file:///tmp/none", None, None).await;
    // A rotation recorded without retiring (say by an older version): the reaper catches up.
    sqlx::query("INSERT INTO credential_generations (agent, generation) VALUES ('agent', 1)")
        .execute(&db.pool)
        .await
        .expect("rotate");
    let report = sweep(&db.pool, Utc::now()).await;
    assert_eq!(report.credential_retired, 1);
    assert_eq!(field(&db.pool, id).await.1, "retired");
}

#[tokio::test]
async fn sandbox_snapshots_follow_their_workspace() {
    let db = TestDb::new().await;
    // An existing store: the reaper never creates a missing one (that waits for repair).
    let store_dir =
        std::env::temp_dir().join(format!("cairn-sandbox-store-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&store_dir).expect("store");
    let store = format!("file://{}", store_dir.display());
    let live = Uuid::new_v4();
    let destroyed = Uuid::new_v4();
    let paused = Uuid::new_v4();
    let now = Utc::now();
    for (id, state, destroyed_at, paused_at) in [
        (live, "running", None, None),
        (destroyed, "destroyed", Some(now), None),
        (paused, "paused", None, Some(now)),
    ] {
        sqlx::query("INSERT INTO workspaces (id, agent, backend, state, destroyed_at, paused_at) VALUES ($1, 'agent', 'local', $2, $3, $4)")
            .bind(id)
            .bind(state)
            .bind(destroyed_at)
            .bind(paused_at)
            .execute(&db.pool)
            .await
            .expect("workspace");
    }
    let older_stop = snapshot_row(&db.pool, "stop", &store, None, Some(live)).await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let latest_stop = snapshot_row(&db.pool, "stop", &store, None, Some(live)).await;
    let named = snapshot_row(&db.pool, "named", &store, None, Some(destroyed)).await;
    let of_destroyed = snapshot_row(&db.pool, "stop", &store, None, Some(destroyed)).await;
    let memory = snapshot_row(&db.pool, "memory", &store, None, Some(paused)).await;

    sweep(&db.pool, now + Duration::hours(23)).await;
    assert_eq!(
        field(&db.pool, older_stop).await.1,
        "superseded",
        "only the latest stop snapshot stays"
    );
    assert_eq!(field(&db.pool, latest_stop).await.1, "current");
    assert_eq!(
        field(&db.pool, of_destroyed).await.1,
        "current",
        "within the 24-hour grace"
    );
    assert_eq!(field(&db.pool, memory).await.1, "current");
    sweep(&db.pool, now + Duration::hours(24)).await;
    assert_eq!(
        field(&db.pool, of_destroyed).await,
        ("deleted".into(), "reclaimed".into()),
        "deleted after the grace"
    );
    assert_eq!(
        field(&db.pool, named).await.1,
        "current",
        "named snapshots stay until deleted"
    );
    sweep(&db.pool, now + Duration::hours(71)).await;
    assert_eq!(field(&db.pool, memory).await.1, "current");
    sweep(&db.pool, now + Duration::hours(72)).await;
    assert_eq!(
        field(&db.pool, memory).await.0,
        "deleted",
        "memory checkpoints expire 72 hours after the pause"
    );
    assert_eq!(
        field(&db.pool, latest_stop).await.1,
        "current",
        "the latest stop snapshot lives with its workspace"
    );
    let _ = std::fs::remove_dir_all(&store_dir);
}

#[tokio::test]
async fn an_unreachable_backend_waits_for_repair_and_a_later_retry_succeeds() {
    let db = TestDb::new().await;
    let base = scratch("unreachable");
    let blocker = base.join("not-a-directory");
    std::fs::write(&blocker, "a file where the store should be").expect("blocker");
    let store_url = format!("file://{}", blocker.join("store").display());
    let id = snapshot_row(
        &db.pool,
        "checkpoint",
        &store_url,
        Some(Uuid::new_v4()),
        None,
    )
    .await;
    let retired_at = Utc::now() - Duration::days(8);
    sqlx::query(
        "UPDATE project_snapshots SET retention = 'retired', retired_at = $2 WHERE id = $1",
    )
    .bind(id)
    .bind(retired_at)
    .execute(&db.pool)
    .await
    .expect("retire");
    let now = Utc::now();
    let failed = sweep(&db.pool, now).await;
    assert_eq!(failed.reclaim_failed, 1);
    let (retention, reason, attempts): (String, Option<String>, i32) = sqlx::query_as(
        "SELECT retention, repair_reason, repair_attempts FROM project_snapshots WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .expect("row");
    assert_eq!(
        (retention.as_str(), attempts),
        ("pending_operator_repair", 1)
    );
    assert!(reason.is_some_and(|r| !r.is_empty()));
    // Backoff: not retried at once.
    assert_eq!(sweep(&db.pool, now).await.reclaim_failed, 0);
    // The operator repairs the backend; a later sweep reclaims it.
    std::fs::remove_file(&blocker).expect("repair");
    std::fs::create_dir_all(blocker.join("store")).expect("repair");
    let later = sweep(&db.pool, now + Duration::minutes(5)).await;
    assert_eq!(later.snapshots_reclaimed, 1, "{later:?}");
    assert_eq!(field(&db.pool, id).await.0, "deleted");
}

/// A capture and a sweep at once never lose a chunk: whichever order they interleave
/// in, the new snapshot restores whole.
#[tokio::test]
async fn a_capture_running_beside_a_sweep_loses_no_chunk() {
    let db = TestDb::new().await;
    let store = Repository::open(scratch("store").to_str().expect("utf8")).expect("store");
    let tree = scratch("tree");
    for i in 0..40 {
        std::fs::write(
            tree.join(format!("f{i}.txt")),
            format!("content {i} ").repeat(2000),
        )
        .expect("write");
    }
    for round in 0..6 {
        // An old snapshot of the same content, due for reclamation.
        let old = snapshot_row(
            &db.pool,
            "checkpoint",
            store.url(),
            Some(Uuid::new_v4()),
            None,
        )
        .await;
        let (manifest, _) = snapshot::capture(&store, &tree, &CaptureRules::default(), None, old)
            .await
            .expect("capture");
        let mut conn = db.pool.acquire().await.expect("conn");
        lineage::record_packs(&mut conn, old, &manifest.packs)
            .await
            .expect("packs");
        sqlx::query("UPDATE project_snapshots SET retention = 'retired', retired_at = now() - interval '8 days' WHERE id = $1")
            .bind(old)
            .execute(&mut *conn)
            .await
            .expect("retire");
        drop(conn);

        // A new capture of the same tree, registered as the worker does, beside a sweep.
        let capture = async {
            let mut tx = db.pool.begin().await.expect("begin");
            lineage::lock_store_for_capture(&mut tx, store.url())
                .await
                .expect("lock");
            let id = lineage::create(
                &mut tx,
                &NewSnapshot {
                    kind: "checkpoint",
                    agent: "agent",
                    repository: None,
                    backend: "local",
                    base_image: None,
                    canonical_ref: None,
                    work_context_id: Some(Uuid::new_v4()),
                    workspace_id: None,
                    store_url: store.url(),
                    credential_generation: 0,
                    owner: None,
                },
            )
            .await
            .expect("create");
            lineage::set_status(
                &mut tx,
                id,
                &[SnapshotStatus::Creating],
                SnapshotStatus::Uploading,
            )
            .await
            .expect("uploading");
            tx.commit().await.expect("commit");
            if round % 2 == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            let (manifest, _) =
                snapshot::capture(&store, &tree, &CaptureRules::default(), None, id)
                    .await
                    .expect("capture");
            let mut tx = db.pool.begin().await.expect("begin");
            lineage::mark_ready(&mut tx, id, &snapshot::manifest_key(id), 1)
                .await
                .expect("ready");
            lineage::record_packs(&mut tx, id, &manifest.packs)
                .await
                .expect("packs");
            tx.commit().await.expect("commit");
            manifest
        };
        let reap = async {
            if round % 3 == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(3)).await;
            }
            sweep(&db.pool, Utc::now()).await
        };
        let (manifest, _) = tokio::join!(capture, reap);
        snapshot::restore(&store, &manifest, &scratch("out").join("tree"))
            .await
            .unwrap_or_else(|e| panic!("round {round}: the new snapshot lost a chunk: {e}"));
        // Whatever was deferred is reclaimed once no capture runs, and still loses nothing.
        sweep(&db.pool, Utc::now()).await;
        snapshot::restore(&store, &manifest, &scratch("out").join("tree"))
            .await
            .expect("still whole");
    }
}

#[tokio::test]
async fn a_dry_run_changes_nothing() {
    let db = TestDb::new().await;
    let id = snapshot_row(&db.pool, "baseline", "file:///tmp/none", None, None).await;
    sqlx::query("INSERT INTO credential_generations (agent, generation) VALUES ('agent', 1)")
        .execute(&db.pool)
        .await
        .expect("rotate");
    let report = Sweep {
        pool: &db.pool,
        now: Utc::now(),
        durations: &Durations::default(),
        batch: 100,
        dry_run: true,
    }
    .run()
    .await
    .expect("dry run");
    assert_eq!(report.credential_retired, 1, "it says what it would do");
    assert_eq!(field(&db.pool, id).await.1, "current", "and does nothing");
}

#[tokio::test]
async fn an_interrupted_capture_fails_after_a_while_and_stops_deferring_reclamation() {
    let db = TestDb::new().await;
    let workspace = Uuid::new_v4();
    sqlx::query("INSERT INTO workspaces (id, agent, backend, state) VALUES ($1, 'agent', 'local', 'running')")
        .bind(workspace)
        .execute(&db.pool)
        .await
        .expect("workspace");
    let (id, created) = capture_in_progress(&db.pool, Uuid::new_v4(), Some(workspace), None).await;
    let mut conn = db.pool.acquire().await.expect("conn");
    sqlx::query("INSERT INTO holds (id, workspace_id, agent, reason, expires_at, capture_in_progress) VALUES ($1, $2, 'agent', 'capture', now() + interval '1 day', TRUE)")
        .bind(Uuid::new_v4())
        .bind(workspace)
        .execute(&mut *conn)
        .await
        .expect("hold");
    assert_eq!(
        sweep(&db.pool, created + Duration::hours(5))
            .await
            .stale_captures_failed,
        0,
        "still in progress"
    );
    assert_eq!(
        sweep(&db.pool, created + Duration::hours(6))
            .await
            .stale_captures_failed,
        1
    );
    assert_eq!(field(&db.pool, id).await.0, "failed");
    let (capturing, ended): (bool, bool) = sqlx::query_as(
        "SELECT capture_in_progress, ended_at IS NOT NULL FROM holds WHERE workspace_id = $1",
    )
    .bind(workspace)
    .fetch_one(&mut *conn)
    .await
    .expect("hold");
    assert_eq!(
        (capturing, ended),
        (false, false),
        "the hold stays, no longer capturing"
    );
}

/// A run of the task `context` with one request in `state`, leased (epoch 3) until an
/// hour from now; returns the request id.
async fn live_request(pool: &PgPool, context: Uuid, state: &str) -> Uuid {
    let request = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO runs (id, root_run_id, work_context_id, agent, steps, max_commands, max_wall_seconds, max_attempts,
                           state, request_digest)
         VALUES ($1, $1, $1, 'agent', '[]', 1, 1, 1, 'running', 'x')",
    )
    .bind(context)
    .execute(pool)
    .await
    .expect("run");
    sqlx::query(
        "INSERT INTO execution_requests (id, run_id, kind, state, max_attempts, max_commands, max_wall_seconds,
                                         lease_epoch, lease_owner, lease_deadline)
         VALUES ($1, $2, 'run', $3, 1, 1, 1, 3, 'w1', now() + interval '1 hour')",
    )
    .bind(request)
    .bind(context)
    .bind(state)
    .execute(pool)
    .await
    .expect("request");
    request
}

#[tokio::test]
async fn a_live_tasks_head_is_never_retired_as_idle() {
    let db = TestDb::new().await;
    let context = Uuid::new_v4();
    let request = live_request(&db.pool, context, "executing").await;
    let head = snapshot_row(
        &db.pool,
        "checkpoint",
        "file:///tmp/none",
        Some(context),
        None,
    )
    .await;
    let mut conn = db.pool.acquire().await.expect("conn");
    lineage::append(&mut conn, context, "agent", None, head)
        .await
        .expect("append");
    let later = Utc::now() + Duration::days(15);
    for state in ["executing", "stopped_at_checkpoint", "needs_reconciliation"] {
        sqlx::query("UPDATE execution_requests SET state = $2 WHERE id = $1")
            .bind(request)
            .bind(state)
            .execute(&mut *conn)
            .await
            .expect("state");
        assert_eq!(
            sweep(&db.pool, later).await.idle_heads_retired,
            0,
            "{state}: the task is live"
        );
        assert_eq!(field(&db.pool, head).await.1, "current");
    }
    sqlx::query("UPDATE execution_requests SET state = 'failed' WHERE id = $1")
        .bind(request)
        .execute(&mut *conn)
        .await
        .expect("state");
    assert_eq!(sweep(&db.pool, later).await.idle_heads_retired, 1);
    assert_eq!(field(&db.pool, head).await.1, "retired");
}

#[tokio::test]
async fn a_capture_whose_owner_can_no_longer_commit_fails_within_minutes() {
    let db = TestDb::new().await;
    let context = Uuid::new_v4();
    let request = live_request(&db.pool, context, "executing").await;
    let (id, created) = capture_in_progress(&db.pool, context, None, Some((request, 3))).await;
    let mut conn = db.pool.acquire().await.expect("conn");
    assert_eq!(
        sweep(&db.pool, created + Duration::hours(1))
            .await
            .stale_captures_failed,
        0,
        "its owner still holds the lease: a long capture goes on"
    );
    // Another worker took the request over: the first can never commit this capture.
    sqlx::query("UPDATE execution_requests SET lease_epoch = 4 WHERE id = $1")
        .bind(request)
        .execute(&mut *conn)
        .await
        .expect("takeover");
    assert_eq!(
        sweep(&db.pool, created + Duration::seconds(30))
            .await
            .stale_captures_failed,
        0,
        "within the grace"
    );
    assert_eq!(
        sweep(&db.pool, created + Duration::minutes(1))
            .await
            .stale_captures_failed,
        1,
        "abandoned: failed in a minute, not six hours"
    );
    assert_eq!(field(&db.pool, id).await.0, "failed");
}
