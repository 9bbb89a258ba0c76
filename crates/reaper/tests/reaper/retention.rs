//! The reaper's rules, one time-travel test each, against the real PostgreSQL and a real
//! local artifact store.

use cairn_common::lineage::{self, CapturedBy, NewSnapshot, SnapshotStatus};
use cairn_common::testing::TestDb;
use cairn_reaper::retention::{Durations, Sweep, SweepReport};
use cairn_snapshot::Repository;
use cairn_snapshot::{self as snapshot, CaptureRules, Manifest};
use chrono::{DateTime, Duration, Utc};
use sqlx::{PgConnection, PgPool};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use uuid::Uuid;

async fn sweep(pool: &PgPool, now: DateTime<Utc>) -> SweepReport {
    sweep_as(pool, now, false).await
}

async fn sweep_as(pool: &PgPool, now: DateTime<Utc>, dry_run: bool) -> SweepReport {
    Sweep {
        pool,
        now,
        durations: &Durations::default(),
        batch: 100,
        dry_run,
    }
    .run()
    .await
    .expect("sweep")
}

/// How many interrupted captures a sweep at `now` fails.
async fn captures_failed_at(pool: &PgPool, now: DateTime<Utc>) -> u64 {
    sweep(pool, now).await.stale_captures_failed
}

fn scratch(label: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("cairn-reaper-{label}-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("scratch");
    dir
}

/// A local artifact store in a directory of its own.
fn local_store() -> Repository {
    Repository::open(scratch("store").to_str().expect("utf8")).expect("store")
}

/// The identity of the store at `url`, as a worker would read it: one per URL here
/// (a test that needs one store under two URLs sets `store_id` itself).
fn identity_of(url: &str) -> Uuid {
    static IDS: std::sync::Mutex<Option<HashMap<String, Uuid>>> = std::sync::Mutex::new(None);
    let mut ids = IDS.lock().unwrap_or_else(|e| e.into_inner());
    *ids.get_or_insert_with(HashMap::new)
        .entry(url.to_string())
        .or_insert_with(Uuid::new_v4)
}

/// A snapshot of the agent "agent" in the local backend.
fn new_snapshot<'a>(
    kind: &'a str,
    store_url: &'a str,
    context: Option<Uuid>,
    workspace: Option<Uuid>,
    owner: Option<(Uuid, i64)>,
) -> NewSnapshot<'a> {
    NewSnapshot {
        kind,
        agent: "agent",
        repository: None,
        backend: "local",
        base_image: None,
        canonical_ref: None,
        work_context_id: context,
        workspace_id: workspace,
        store_url,
        store_id: identity_of(store_url),
        credential_generation: 0,
        owner: owner.map(|(request, epoch)| (CapturedBy::Request(request), epoch)),
        predecessor: None,
        name: None,
        writer_node: None,
    }
}

/// A ready snapshot (its bytes are not written: see `capture_recorded`).
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
        &new_snapshot(kind, store_url, context, workspace, None),
    )
    .await
    .expect("create");
    mark_ready(&mut conn, id, &[]).await;
    id
}

/// A ready checkpoint of a task of its own.
async fn checkpoint(pool: &PgPool, store_url: &str) -> Uuid {
    snapshot_row(pool, "checkpoint", store_url, Some(Uuid::new_v4()), None).await
}

/// A ready checkpoint made the head of `context`'s lineage.
async fn head_of(pool: &PgPool, context: Uuid) -> Uuid {
    let head = snapshot_row(pool, "checkpoint", "file:///tmp/none", Some(context), None).await;
    let mut conn = pool.acquire().await.expect("conn");
    lineage::append(&mut conn, context, "agent", None, head)
        .await
        .expect("append");
    head
}

/// Registers a capture as the worker does before it writes any byte: `uploading`.
async fn start_capture(conn: &mut PgConnection, new: &NewSnapshot<'_>) -> Uuid {
    let id = lineage::create(conn, new).await.expect("create");
    let uploading = SnapshotStatus::Uploading;
    lineage::set_status(conn, id, &[SnapshotStatus::Creating], uploading)
        .await
        .expect("uploading");
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
    let new = new_snapshot(
        "checkpoint",
        "file:///tmp/none",
        Some(context),
        workspace,
        owner,
    );
    let id = start_capture(&mut conn, &new).await;
    let created = sqlx::query_scalar("SELECT created_at FROM project_snapshots WHERE id = $1")
        .bind(id)
        .fetch_one(&mut *conn)
        .await
        .expect("created");
    (id, created)
}

/// Captures `tree` into `store` as snapshot `id`.
async fn capture(store: &Repository, tree: &Path, id: Uuid) -> Manifest {
    snapshot::capture(store, tree, &CaptureRules::default(), None, id)
        .await
        .expect("capture")
        .0
}

/// Captures `tree` as snapshot `id` and records its packs, as a finished capture does.
async fn capture_recorded(pool: &PgPool, store: &Repository, tree: &Path, id: Uuid) -> Manifest {
    let manifest = capture(store, tree, id).await;
    let mut conn = pool.acquire().await.expect("conn");
    lineage::record_packs(&mut conn, id, &manifest.packs)
        .await
        .expect("packs");
    manifest
}

/// Retires snapshot `id` (as `retention`) at `retired_at`.
async fn retire(pool: &PgPool, id: Uuid, retention: &str, retired_at: DateTime<Utc>) {
    sqlx::query("UPDATE project_snapshots SET retention = $2, retired_at = $3 WHERE id = $1")
        .bind(id)
        .bind(retention)
        .bind(retired_at)
        .execute(pool)
        .await
        .expect("retire");
}

/// A workspace of the agent in `state`, destroyed or paused at the times given.
async fn workspace(
    pool: &PgPool,
    state: &str,
    destroyed_at: Option<DateTime<Utc>>,
    paused_at: Option<DateTime<Utc>>,
) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query("INSERT INTO workspaces (id, agent, backend, state, destroyed_at, paused_at) VALUES ($1, 'agent', 'local', $2, $3, $4)")
        .bind(id)
        .bind(state)
        .bind(destroyed_at)
        .bind(paused_at)
        .execute(pool)
        .await
        .expect("workspace");
    id
}

/// A hold on `workspace` (of the task of `run`, if given) until `expires_at`.
async fn hold(
    pool: &PgPool,
    workspace: Uuid,
    run: Option<Uuid>,
    expires_at: DateTime<Utc>,
    capturing: bool,
) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO holds (id, workspace_id, run_id, agent, reason, expires_at, capture_in_progress)
         VALUES ($1, $2, $3, 'agent', 'test', $4, $5)",
    )
    .bind(id)
    .bind(workspace)
    .bind(run)
    .bind(expires_at)
    .bind(capturing)
    .execute(pool)
    .await
    .expect("hold");
    id
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
    let head = head_of(&db.pool, context).await;
    let mut conn = db.pool.acquire().await.expect("conn");
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
    assert!(lineage::survey(&mut conn, context, "agent")
        .await
        .expect("query")
        .restorable
        .is_none());
}

#[tokio::test]
async fn retired_bytes_are_reclaimed_after_seven_days_through_their_own_store() {
    let db = TestDb::new().await;
    // The snapshot lives in a store no configuration names any more.
    let store = local_store();
    let tree = scratch("tree");
    std::fs::write(tree.join("shared.txt"), "shared by both snapshots").expect("write");
    let old = checkpoint(&db.pool, store.url()).await;
    let new = checkpoint(&db.pool, store.url()).await;
    // The newer snapshot's capture runs first here, so the shared content lies in its
    // pack and the older snapshot's own content in a pack only the older one names.
    let new_manifest = capture_recorded(&db.pool, &store, &tree, new).await;
    std::fs::write(tree.join("only-old.txt"), "only in the old one").expect("write");
    let old_manifest = capture_recorded(&db.pool, &store, &tree, old).await;
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
    retire(&db.pool, old, "superseded", retired_at).await;
    let stored = |key: String| {
        let store = &store;
        async move { store.store().exists(&key).await.expect("exists") }
    };

    let early = sweep(
        &db.pool,
        retired_at + Duration::days(7) - Duration::minutes(1),
    )
    .await;
    assert_eq!(early.snapshots_reclaimed, 0);
    assert!(stored(snapshot::manifest_key(old)).await);
    let due = sweep(&db.pool, retired_at + Duration::days(7)).await;
    assert_eq!(due.snapshots_reclaimed, 1);
    assert!(due.bytes_reclaimed > 0);
    assert_eq!(
        field(&db.pool, old).await,
        ("deleted".into(), "reclaimed".into())
    );
    assert!(!stored(snapshot::manifest_key(old)).await);
    for pack in &only_old {
        for key in [snapshot::index_key(*pack), snapshot::pack_key(*pack)] {
            assert!(
                !stored(key.clone()).await,
                "{key} of an orphan pack is deleted"
            );
        }
    }
    assert!(
        stored(snapshot::pack_key(new_manifest.packs[0])).await,
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
    let workspace = workspace(&db.pool, "stopped", None, None).await;
    let now = Utc::now();
    let in_an_hour = now + Duration::hours(1);
    let expiring = hold(&db.pool, workspace, None, in_an_hour, false).await;
    let capturing = hold(&db.pool, workspace, None, in_an_hour, true).await;
    let of_task = hold(
        &db.pool,
        workspace,
        Some(run_id),
        now + Duration::days(14),
        false,
    )
    .await;
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
    sweep(&db.pool, in_an_hour).await;
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

/// A baseline snapshot of the agent, whose credentials were then rotated without
/// retiring it (say by an older version).
async fn baseline_of_rotated_credentials(pool: &PgPool) -> Uuid {
    let id = snapshot_row(pool, "baseline", "file:///tmp/none", None, None).await;
    sqlx::query("INSERT INTO credential_generations (agent, generation) VALUES ('agent', 1)")
        .execute(pool)
        .await
        .expect("rotate");
    id
}

#[tokio::test]
async fn snapshots_of_rotated_credentials_are_retired() {
    let db = TestDb::new().await;
    let id = baseline_of_rotated_credentials(&db.pool).await;
    // The reaper catches up.
    let report = sweep(&db.pool, Utc::now()).await;
    assert_eq!(report.credential_retired, 1);
    assert_eq!(field(&db.pool, id).await.1, "retired");
}

#[tokio::test]
async fn sandbox_snapshots_follow_their_workspace() {
    let db = TestDb::new().await;
    // An existing store: the reaper never creates a missing one (that waits for repair).
    let store_dir = scratch("sandbox-store");
    let store = format!("file://{}", store_dir.display());
    let now = Utc::now();
    let live = workspace(&db.pool, "running", None, None).await;
    let destroyed = workspace(&db.pool, "destroyed", Some(now), None).await;
    let paused = workspace(&db.pool, "paused", None, Some(now)).await;
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
    let id = checkpoint(&db.pool, &store_url).await;
    retire(&db.pool, id, "retired", Utc::now() - Duration::days(8)).await;
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
    let store = local_store();
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
        let old = checkpoint(&db.pool, store.url()).await;
        capture_recorded(&db.pool, &store, &tree, old).await;
        retire(&db.pool, old, "retired", Utc::now() - Duration::days(8)).await;

        // A new capture of the same tree, registered as the worker does, beside a sweep.
        let capture = async {
            let mut tx = db.pool.begin().await.expect("begin");
            // The worker tries the lock and, while the reaper holds it, tries again.
            while lineage::lock_for_capture(&mut tx, "agent", identity_of(store.url()))
                .await
                .expect("lock")
                .is_none()
            {
                tx.rollback().await.expect("rollback");
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                tx = db.pool.begin().await.expect("begin");
            }
            let context = Some(Uuid::new_v4());
            let new = new_snapshot("checkpoint", store.url(), context, None, None);
            let id = start_capture(&mut tx, &new).await;
            tx.commit().await.expect("commit");
            if round % 2 == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            let manifest = capture(&store, &tree, id).await;
            let mut tx = db.pool.begin().await.expect("begin");
            mark_ready(&mut tx, id, &manifest.packs).await;
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
    let id = baseline_of_rotated_credentials(&db.pool).await;
    let report = sweep_as(&db.pool, Utc::now(), true).await;
    assert_eq!(report.credential_retired, 1, "it says what it would do");
    assert_eq!(field(&db.pool, id).await.1, "current", "and does nothing");
}

#[tokio::test]
async fn an_interrupted_capture_fails_after_a_while_and_stops_deferring_reclamation() {
    let db = TestDb::new().await;
    let workspace = workspace(&db.pool, "running", None, None).await;
    let (id, created) = capture_in_progress(&db.pool, Uuid::new_v4(), Some(workspace), None).await;
    hold(
        &db.pool,
        workspace,
        None,
        Utc::now() + Duration::days(1),
        true,
    )
    .await;
    assert_eq!(
        captures_failed_at(&db.pool, created + Duration::hours(5)).await,
        0,
        "still in progress"
    );
    assert_eq!(
        captures_failed_at(&db.pool, created + Duration::hours(6)).await,
        1
    );
    assert_eq!(field(&db.pool, id).await.0, "failed");
    let (capturing, ended): (bool, bool) = sqlx::query_as(
        "SELECT capture_in_progress, ended_at IS NOT NULL FROM holds WHERE workspace_id = $1",
    )
    .bind(workspace)
    .fetch_one(&db.pool)
    .await
    .expect("hold");
    assert_eq!(
        (capturing, ended),
        (false, false),
        "the hold stays, no longer capturing"
    );
}

/// A task with one request in `state`, leased (epoch 3) until an hour from now; returns
/// the task (its run's work context) and the request.
async fn live_request(pool: &PgPool, state: &str) -> (Uuid, Uuid) {
    // The run is its own work context.
    let (context, request) = cairn_common::testing::insert_request(pool).await;
    sqlx::query(
        "UPDATE execution_requests SET state = $2, lease_epoch = 3, lease_owner = 'w1',
                lease_deadline = now() + interval '1 hour' WHERE id = $1",
    )
    .bind(request)
    .bind(state)
    .execute(pool)
    .await
    .expect("lease");
    (context, request)
}

#[tokio::test]
async fn a_live_tasks_head_is_never_retired_as_idle() {
    let db = TestDb::new().await;
    let (context, request) = live_request(&db.pool, "executing").await;
    let head = head_of(&db.pool, context).await;
    let later = Utc::now() + Duration::days(15);
    for (state, retired, retention) in [
        ("executing", 0, "current"),
        ("stopped_at_checkpoint", 0, "current"),
        ("needs_reconciliation", 0, "current"),
        ("failed", 1, "retired"),
    ] {
        sqlx::query("UPDATE execution_requests SET state = $2 WHERE id = $1")
            .bind(request)
            .bind(state)
            .execute(&db.pool)
            .await
            .expect("state");
        assert_eq!(
            sweep(&db.pool, later).await.idle_heads_retired,
            retired,
            "{state}: only a task whose every request ended lets its head go idle"
        );
        assert_eq!(field(&db.pool, head).await.1, retention, "{state}");
    }
}

#[tokio::test]
async fn a_capture_whose_owner_can_no_longer_commit_fails_within_minutes() {
    let db = TestDb::new().await;
    let (context, request) = live_request(&db.pool, "executing").await;
    let (id, created) = capture_in_progress(&db.pool, context, None, Some((request, 3))).await;
    assert_eq!(
        captures_failed_at(&db.pool, created + Duration::hours(1)).await,
        0,
        "its owner still holds the lease: a long capture goes on"
    );
    // Another worker took the request over: the first can never commit this capture.
    sqlx::query("UPDATE execution_requests SET lease_epoch = 4 WHERE id = $1")
        .bind(request)
        .execute(&db.pool)
        .await
        .expect("takeover");
    assert_eq!(
        captures_failed_at(&db.pool, created + Duration::seconds(30)).await,
        0,
        "within the grace"
    );
    assert_eq!(
        captures_failed_at(&db.pool, created + Duration::minutes(1)).await,
        1,
        "abandoned: failed in a minute, not six hours"
    );
    assert_eq!(field(&db.pool, id).await.0, "failed");
}

/// A ready checkpoint of a task of its own, recorded under `store_url` with `store_id`:
/// how a host that mounts the store at another path records it.
async fn checkpoint_in(pool: &PgPool, store_url: &str, store_id: Uuid) -> Uuid {
    let mut conn = pool.acquire().await.expect("conn");
    let new = NewSnapshot {
        store_id,
        ..new_snapshot("checkpoint", store_url, Some(Uuid::new_v4()), None, None)
    };
    let id = lineage::create(&mut conn, &new).await.expect("create");
    mark_ready(&mut conn, id, &[]).await;
    id
}

/// One store reached through two URLs (a share mounted at two paths on two hosts) is
/// one store: a pack another URL's live snapshot reuses survives the reclaim of the
/// snapshot that wrote it, and a capture under either URL defers reclaiming the store.
#[tokio::test]
async fn one_store_under_two_urls_is_one_store() {
    let db = TestDb::new().await;
    let store = local_store();
    let identity = store.identity().await.expect("identity");
    assert_eq!(
        Repository::open(store.url())
            .expect("again")
            .identity()
            .await
            .expect("identity"),
        identity,
        "the identity is written once, in the store"
    );
    let elsewhere = "file:///mnt/another-host/store";
    let tree = scratch("tree");
    std::fs::write(tree.join("shared.txt"), "the same content in both tasks").expect("write");
    let first = checkpoint_in(&db.pool, store.url(), identity).await;
    let first_manifest = capture_recorded(&db.pool, &store, &tree, first).await;
    // The second task's capture, on the other host, reuses the first one's pack.
    let second = checkpoint_in(&db.pool, elsewhere, identity).await;
    let second_manifest = capture_recorded(&db.pool, &store, &tree, second).await;
    assert_eq!(second_manifest.packs, first_manifest.packs, "deduplicated");
    retire(&db.pool, first, "retired", Utc::now() - Duration::days(8)).await;

    // A capture in progress through the other URL defers the store's reclaim.
    let mut conn = db.pool.acquire().await.expect("conn");
    let capturing = start_capture(
        &mut conn,
        &NewSnapshot {
            store_id: identity,
            ..new_snapshot("checkpoint", elsewhere, Some(Uuid::new_v4()), None, None)
        },
    )
    .await;
    let deferred = sweep(&db.pool, Utc::now()).await;
    assert_eq!(
        (deferred.reclaim_deferred, deferred.snapshots_reclaimed),
        (1, 0)
    );
    let failed = SnapshotStatus::Failed;
    lineage::set_status(&mut conn, capturing, &[SnapshotStatus::Uploading], failed)
        .await
        .expect("failed");

    let swept = sweep(&db.pool, Utc::now()).await;
    assert_eq!(swept.snapshots_reclaimed, 1);
    assert_eq!(field(&db.pool, first).await.0, "deleted");
    for pack in &first_manifest.packs {
        assert!(
            store
                .store()
                .exists(&snapshot::pack_key(*pack))
                .await
                .expect("exists"),
            "the pack the other URL's snapshot references is kept"
        );
    }
    snapshot::restore(&store, &second_manifest, &scratch("out").join("tree"))
        .await
        .expect("the second task's head restores");
}

/// A dry run reports what one sweep does, every batch of every rule in order, and
/// changes nothing: neither the rows nor the store.
#[tokio::test]
async fn a_dry_run_reports_what_the_sweep_then_does() {
    let db = TestDb::new().await;
    let store = local_store();
    let tree = scratch("tree");
    let mut ids = Vec::new();
    for i in 0..3 {
        std::fs::write(tree.join("file.txt"), format!("version {i}")).expect("write");
        let id = checkpoint(&db.pool, store.url()).await;
        capture_recorded(&db.pool, &store, &tree, id).await;
        retire(&db.pool, id, "retired", Utc::now() - Duration::days(8)).await;
        ids.push(id);
    }
    let swept = |dry_run: bool| {
        let pool = &db.pool;
        async move {
            Sweep {
                pool,
                now: Utc::now(),
                durations: &Durations::default(),
                batch: 1,
                dry_run,
            }
            .run()
            .await
            .expect("sweep")
        }
    };
    let dry = swept(true).await;
    assert_eq!(dry.snapshots_reclaimed, 3, "{dry:?}");
    assert!(dry.bytes_reclaimed > 0);
    for id in &ids {
        assert_eq!(
            field(&db.pool, *id).await,
            ("ready".into(), "retired".into())
        );
        let manifest = snapshot::manifest_key(*id);
        assert!(store.store().exists(&manifest).await.expect("exists"));
    }
    let real = swept(false).await;
    assert_eq!(
        (real.snapshots_reclaimed, real.bytes_reclaimed),
        (dry.snapshots_reclaimed, dry.bytes_reclaimed),
        "the dry run said what the sweep did"
    );
}

/// A quarantined snapshot's bytes stay for their own period, counted from the
/// quarantine, however old the snapshot is.
#[tokio::test]
async fn quarantined_bytes_are_kept_from_the_quarantine_on() {
    let db = TestDb::new().await;
    let store = local_store();
    let tree = scratch("tree");
    std::fs::write(tree.join("evidence.txt"), "what failed its check").expect("write");
    let id = checkpoint(&db.pool, store.url()).await;
    capture_recorded(&db.pool, &store, &tree, id).await;
    sqlx::query(
        "UPDATE project_snapshots SET created_at = now() - interval '60 days' WHERE id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .expect("old");
    let mut conn = db.pool.acquire().await.expect("conn");
    let quarantined = SnapshotStatus::Quarantined;
    lineage::set_status(&mut conn, id, &[SnapshotStatus::Ready], quarantined)
        .await
        .expect("quarantined");
    let kept = Durations::default().quarantine_kept;
    let early = sweep(&db.pool, Utc::now() + kept - Duration::hours(1)).await;
    assert_eq!(early.snapshots_reclaimed, 0);
    assert_eq!(field(&db.pool, id).await.0, "quarantined");
    let due = sweep(&db.pool, Utc::now() + kept + Duration::minutes(1)).await;
    assert_eq!(due.snapshots_reclaimed, 1);
}

/// The idle clock of a head counts from its task's last state change as well as from
/// its last capture or restore: a task that ended yesterday keeps its head 14 days.
#[tokio::test]
async fn the_idle_clock_counts_from_the_tasks_last_state_change() {
    let db = TestDb::new().await;
    let (context, request) = live_request(&db.pool, "executing").await;
    let head = head_of(&db.pool, context).await;
    sqlx::query(
        "UPDATE project_snapshots SET last_used_at = now() - interval '20 days' WHERE id = $1",
    )
    .bind(head)
    .execute(&db.pool)
    .await
    .expect("used long ago");
    sqlx::query("UPDATE execution_requests SET state = 'failed', updated_at = now() WHERE id = $1")
        .bind(request)
        .execute(&db.pool)
        .await
        .expect("ended now");
    let early = sweep(
        &db.pool,
        Utc::now() + Duration::days(14) - Duration::hours(1),
    )
    .await;
    assert_eq!(early.idle_heads_retired, 0);
    assert_eq!(field(&db.pool, head).await.1, "current");
    let due = sweep(
        &db.pool,
        Utc::now() + Duration::days(14) + Duration::minutes(1),
    )
    .await;
    assert_eq!(due.idle_heads_retired, 1);
}

/// Marks a capture of one byte ready, its manifest at its key, as a worker's commit does.
pub async fn mark_ready(conn: &mut sqlx::PgConnection, id: Uuid, pack_ids: &[Uuid]) {
    let stored = lineage::Stored {
        manifest_key: &snapshot::manifest_key(id),
        size_bytes: 1,
        tree_digest: "t",
        pack_ids,
    };
    assert!(lineage::mark_ready(conn, id, &stored).await.expect("ready"));
}
