//! Checkpoint lineage and holds against the real PostgreSQL.

use cairn_common::hold::{self, HoldTarget};
use cairn_common::lineage::{self, LineageError, NewSnapshot, SnapshotStatus};
use cairn_common::testing::TestDb;
use sqlx::PgPool;
use uuid::Uuid;

async fn ready_checkpoint(pool: &PgPool, agent: &str, context: Uuid) -> Uuid {
    let mut conn = pool.acquire().await.expect("conn");
    let generation = lineage::survey(&mut conn, context, agent)
        .await
        .expect("generation")
        .generation;
    let id = lineage::create(
        &mut conn,
        &NewSnapshot {
            credential_generation: generation,
            ..cairn_common::testing::new_checkpoint(agent, context)
        },
    )
    .await
    .expect("create");
    assert!(lineage::mark_ready(
        &mut conn,
        id,
        &lineage::Stored {
            manifest_key: "manifests/x",
            size_bytes: 1,
            tree_digest: "t",
            pack_ids: &[]
        }
    )
    .await
    .expect("ready"));
    id
}

#[tokio::test]
async fn of_concurrent_appends_against_one_head_exactly_one_wins() {
    let db = TestDb::new().await;
    let context = Uuid::new_v4();
    let first = ready_checkpoint(&db.pool, "agent", context).await;
    let mut conn = db.pool.acquire().await.expect("conn");
    assert_eq!(
        lineage::append(&mut conn, context, "agent", None, first)
            .await
            .expect("first"),
        1
    );
    drop(conn);
    for round in 0..10 {
        let head = lineage::head(&mut db.pool.acquire().await.expect("conn"), context)
            .await
            .expect("head")
            .expect("has head");
        let (a, b) = (
            ready_checkpoint(&db.pool, "agent", context).await,
            ready_checkpoint(&db.pool, "agent", context).await,
        );
        let (mut ca, mut cb) = (
            db.pool.acquire().await.expect("conn"),
            db.pool.acquire().await.expect("conn"),
        );
        let (ra, rb) = tokio::join!(
            lineage::append(&mut ca, context, "agent", Some(head.0), a),
            lineage::append(&mut cb, context, "agent", Some(head.0), b)
        );
        let wins = [ra.is_ok(), rb.is_ok()].iter().filter(|w| **w).count();
        assert_eq!(wins, 1, "round {round}: exactly one append wins");
        let loser = if ra.is_ok() { rb } else { ra };
        assert!(matches!(loser, Err(LineageError::Conflict { .. })));
        let now = lineage::head(&mut db.pool.acquire().await.expect("conn"), context)
            .await
            .expect("head")
            .expect("head");
        assert_eq!(now.1, head.1 + 1, "sequence N+1");
        // The winner records its place; the head it replaced leaves reuse.
        type Placed = (Uuid, String, Option<i64>, Option<Uuid>, Option<Uuid>);
        let rows: Vec<Placed> = sqlx::query_as(
            "SELECT id, retention, sequence, predecessor_id, work_context_id
                   FROM project_snapshots WHERE id = ANY($1) ORDER BY sequence NULLS LAST",
        )
        .bind(vec![head.0, now.0])
        .fetch_all(&db.pool)
        .await
        .expect("rows");
        assert_eq!(
            rows,
            [
                (
                    head.0,
                    "superseded".into(),
                    Some(head.1),
                    rows[0].3,
                    Some(context)
                ),
                (
                    now.0,
                    "current".into(),
                    Some(now.1),
                    Some(head.0),
                    Some(context)
                ),
            ],
            "round {round}"
        );
    }
    // A stale expectation never overwrites.
    let stale = ready_checkpoint(&db.pool, "agent", context).await;
    let mut conn = db.pool.acquire().await.expect("conn");
    assert!(matches!(
        lineage::append(&mut conn, context, "agent", Some(first), stale).await,
        Err(LineageError::Conflict { .. })
    ));
    assert!(matches!(
        lineage::append(&mut conn, context, "agent", None, stale).await,
        Err(LineageError::Conflict { .. })
    ));
}

#[tokio::test]
async fn an_append_replaces_only_a_head_that_can_no_longer_be_restored() {
    let db = TestDb::new().await;
    let context = Uuid::new_v4();
    let mut conn = db.pool.acquire().await.expect("conn");
    let first = ready_checkpoint(&db.pool, "agent", context).await;
    assert_eq!(
        lineage::append(&mut conn, context, "agent", None, first)
            .await
            .expect("first"),
        1
    );
    // A tree derived from no snapshot (a baseline or cold start) never supersedes a
    // head it lacks while that head can be restored.
    let fallback = ready_checkpoint(&db.pool, "agent", context).await;
    assert!(matches!(
        lineage::append(&mut conn, context, "agent", None, fallback).await,
        Err(LineageError::Conflict { actual, .. }) if actual == Some(first)
    ));
    // A legitimately retired lineage goes on: a tree derived from its head continues it
    // (never a conflict forever), and the lineage is current again.
    lineage::retire(&mut conn, context, "idle")
        .await
        .expect("retire");
    // Both the head and its current checkpoints leave reuse.
    let (head_retired, retention): (bool, String) = sqlx::query_as(
        "SELECT h.retired_at IS NOT NULL, s.retention
           FROM lineage_heads h JOIN project_snapshots s ON s.id = h.head_id
          WHERE h.work_context_id = $1",
    )
    .bind(context)
    .fetch_one(&mut *conn)
    .await
    .expect("retired");
    assert_eq!((head_retired, retention.as_str()), (true, "retired"));
    let second = ready_checkpoint(&db.pool, "agent", context).await;
    assert_eq!(
        lineage::append(&mut conn, context, "agent", Some(first), second)
            .await
            .expect("after the retirement"),
        2
    );
    assert_eq!(
        lineage::head(&mut conn, context).await.expect("head"),
        Some((second, 2)),
        "current again"
    );
    // A quarantined head cannot be restored: a fallback tree replaces it and starts a
    // chain of its own (no predecessor), keeping the sequence going.
    lineage::set_status(
        &mut conn,
        second,
        &[SnapshotStatus::Ready],
        SnapshotStatus::Quarantined,
    )
    .await
    .expect("quarantine");
    let third = ready_checkpoint(&db.pool, "agent", context).await;
    assert_eq!(
        lineage::append(&mut conn, context, "agent", None, third)
            .await
            .expect("over a quarantined head"),
        3
    );
    // Each append recorded its snapshot's place; only one that derives from the head
    // supersedes it.
    for (snapshot, sequence, predecessor, retention) in [
        (first, 1, None, "retired"),
        (second, 2, Some(first), "current"),
        (third, 3, None, "current"),
    ] {
        let placed: (Option<i64>, Option<Uuid>, String) = sqlx::query_as(
            "SELECT sequence, predecessor_id, retention FROM project_snapshots WHERE id = $1",
        )
        .bind(snapshot)
        .fetch_one(&mut *conn)
        .await
        .expect("placed");
        assert_eq!(
            placed,
            (Some(sequence), predecessor, retention.to_string()),
            "sequence {sequence}"
        );
    }
    let fourth = ready_checkpoint(&db.pool, "agent", context).await;
    lineage::append(&mut conn, context, "agent", Some(third), fourth)
        .await
        .expect("fourth");
    assert_eq!(
        lineage::ancestry(&mut conn, fourth)
            .await
            .expect("ancestry"),
        [fourth, third],
        "the new chain holds none of the old one's effects"
    );
    assert_eq!(
        lineage::ancestry(&mut conn, second)
            .await
            .expect("ancestry"),
        [second, first]
    );
}

#[tokio::test]
async fn a_restore_only_ever_sees_its_own_work_context() {
    let db = TestDb::new().await;
    let (mine, theirs) = (Uuid::new_v4(), Uuid::new_v4());
    let their_checkpoint = ready_checkpoint(&db.pool, "agent", theirs).await;
    let mut conn = db.pool.acquire().await.expect("conn");
    lineage::append(&mut conn, theirs, "agent", None, their_checkpoint)
        .await
        .expect("append");
    assert!(lineage::survey(&mut conn, mine, "agent")
        .await
        .expect("query")
        .restorable
        .is_none());
    assert_eq!(
        lineage::survey(&mut conn, theirs, "agent")
            .await
            .expect("query")
            .restorable
            .map(|r| r.id),
        Some(their_checkpoint)
    );
    assert!(
        lineage::survey(&mut conn, theirs, "another-agent")
            .await
            .expect("query")
            .restorable
            .is_none(),
        "ownership includes the agent"
    );
}

#[tokio::test]
async fn a_survey_finds_the_tasks_held_tree_in_its_directory_only() {
    let db = TestDb::new().await;
    let (context, directory) = (Uuid::new_v4(), Uuid::new_v4());
    let mut conn = db.pool.acquire().await.expect("conn");
    let workspace = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO workspaces (id, work_context_id, agent, backend, state, path, directory_id)
         VALUES ($1, $2, 'agent', 'local', 'running', '/w/tree', $3)",
    )
    .bind(workspace)
    .bind(context)
    .bind(directory)
    .execute(&mut *conn)
    .await
    .expect("workspace");
    let target = HoldTarget {
        workspace_id: workspace,
        run_id: None,
        work_context: Some(context),
        agent: "agent",
    };
    let later = chrono::Utc::now() + chrono::Duration::days(1);
    let hold_id = hold::hold(&mut conn, &target, "handoff", later)
        .await
        .expect("hold");
    let pool = db.pool.clone();
    let held = |agent: &'static str, dir: Option<Uuid>| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.expect("conn");
            let survey = lineage::survey_in(&mut conn, context, agent, dir).await;
            survey.expect("survey").held
        }
    };
    let found = held("agent", Some(directory)).await;
    let expected = lineage::HeldTree {
        workspace_id: workspace,
        path: "/w/tree".into(),
        hold_id,
        snapshot_id: None,
    };
    assert_eq!(found, Some(expected), "the held tree in the directory");
    assert_eq!(
        held("agent", Some(Uuid::new_v4())).await,
        None,
        "another directory"
    );
    assert_eq!(held("agent", None).await, None, "no directory asked about");
    assert_eq!(
        held("another-agent", Some(directory)).await,
        None,
        "another agent"
    );
    lineage::rotate_credentials(&mut conn, "agent")
        .await
        .expect("rotate");
    let survey = lineage::survey_in(&mut conn, context, "agent", Some(directory)).await;
    let survey = survey.expect("survey");
    assert_eq!(survey.generation, 1);
    assert_eq!(
        survey.held, None,
        "a tree under an older generation is not held"
    );
}

#[tokio::test]
async fn rotating_credentials_retires_snapshots_from_reuse() {
    let db = TestDb::new().await;
    let context = Uuid::new_v4();
    let checkpoint = ready_checkpoint(&db.pool, "agent", context).await;
    let mut conn = db.pool.acquire().await.expect("conn");
    lineage::append(&mut conn, context, "agent", None, checkpoint)
        .await
        .expect("append");
    assert_eq!(
        lineage::rotate_credentials(&mut conn, "agent")
            .await
            .expect("rotate"),
        1
    );
    let survey = lineage::survey(&mut conn, context, "agent")
        .await
        .expect("query");
    assert!(survey.restorable.is_none());
    assert_eq!(survey.generation, 1);
    assert_eq!(
        survey.head,
        Some((checkpoint, false)),
        "the head is not usable"
    );
    let (retention, reason): (String, Option<String>) =
        sqlx::query_as("SELECT retention, retire_reason FROM project_snapshots WHERE id = $1")
            .bind(checkpoint)
            .fetch_one(&mut *conn)
            .await
            .expect("row");
    assert_eq!(
        (retention.as_str(), reason.as_deref()),
        ("retired", Some("credentials_rotated"))
    );
}

#[tokio::test]
async fn an_existing_shorter_hold_is_never_extended() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.expect("conn");
    let workspace = Uuid::new_v4();
    sqlx::query("INSERT INTO workspaces (id, agent, backend, state) VALUES ($1, 'agent', 'local', 'running')")
        .bind(workspace)
        .execute(&mut *conn)
        .await
        .expect("workspace");
    let target = HoldTarget {
        workspace_id: workspace,
        run_id: None,
        work_context: None,
        agent: "agent",
    };
    let soon = chrono::Utc::now() + chrono::Duration::minutes(5);
    let first = hold::hold(&mut conn, &target, "handoff", soon)
        .await
        .expect("hold");
    let later = chrono::Utc::now() + chrono::Duration::days(14);
    let second = hold::hold(&mut conn, &target, "pause", later)
        .await
        .expect("hold");
    assert_eq!(first, second, "the active hold is kept");
    let (_, expires) = hold::active(&mut conn, workspace)
        .await
        .expect("active")
        .expect("held");
    assert!(
        expires <= soon + chrono::Duration::seconds(1),
        "not extended"
    );
    // A capture marks the active hold, without extending it either.
    let capture = hold::hold_for_capture(&mut conn, &target, later)
        .await
        .expect("capture hold");
    assert_eq!(capture, first, "a capture marks the active hold");
    let marked = |id: Uuid| {
        sqlx::query_as::<_, (String, bool, chrono::DateTime<chrono::Utc>)>(
            "SELECT reason, capture_in_progress, expires_at FROM holds WHERE id = $1",
        )
        .bind(id)
    };
    let (_, capturing, expires) = marked(first).fetch_one(&mut *conn).await.expect("row");
    assert!(capturing);
    assert!(expires <= soon + chrono::Duration::seconds(1));
    hold::end(&mut conn, first, "released").await.expect("end");
    assert!(hold::active(&mut conn, workspace)
        .await
        .expect("active")
        .is_none());
    // With none active, a capture makes its own.
    let made = hold::hold_for_capture(&mut conn, &target, later)
        .await
        .expect("capture hold");
    assert_ne!(made, first);
    let (reason, capturing, _) = marked(made).fetch_one(&mut *conn).await.expect("row");
    assert_eq!((reason.as_str(), capturing), ("capture", true));
}

/// A capture holds its request row when it registers with its store, so it never waits
/// for the reaper's lock (renewals would block behind it): it is told to try again.
#[tokio::test]
async fn a_capture_never_waits_for_the_reapers_store_lock() {
    let db = TestDb::new().await;
    let store = Uuid::new_v4();
    let mut reaper = db.pool.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(lineage::store_key(store))
        .execute(&mut *reaper)
        .await
        .expect("the reaper's lock");
    let mut capture = db.pool.begin().await.expect("begin");
    let registered = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        lineage::lock_for_capture(&mut capture, "agent", store),
    )
    .await
    .expect("it answers instead of waiting")
    .expect("try");
    assert_eq!(registered, None, "the reaper holds the store");
    capture.rollback().await.expect("rollback");
    reaper.rollback().await.expect("rollback");
    let mut capture = db.pool.begin().await.expect("begin");
    assert_eq!(
        lineage::lock_for_capture(&mut capture, "agent", store)
            .await
            .expect("try"),
        Some(0),
        "the store is free"
    );
}

/// A capture's generation lock: it makes an agent's row at 0 the first time, reads the
/// current generation after a rotation, and holds the row shared until its transaction
/// ends, so that a rotation waits for the capture (and concurrent first captures of a
/// new agent both get the row).
#[tokio::test]
async fn a_capture_locks_the_agents_generation_until_it_commits() {
    let db = TestDb::new().await;
    let agent = format!("agent-{}", Uuid::new_v4().simple());
    let store = Uuid::new_v4();
    let mut firsts = Vec::new();
    for _ in 0..4 {
        let pool = db.pool.clone();
        let agent = agent.clone();
        firsts.push(tokio::spawn(async move {
            let mut tx = pool.begin().await.expect("begin");
            let generation = lineage::lock_for_capture(&mut tx, &agent, store)
                .await
                .expect("lock");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            tx.commit().await.expect("commit");
            generation
        }));
    }
    for first in firsts {
        assert_eq!(
            first.await.expect("join"),
            Some(0),
            "a new agent starts at 0"
        );
    }

    let mut capture = db.pool.begin().await.expect("begin");
    assert_eq!(
        lineage::lock_for_capture(&mut capture, &agent, store)
            .await
            .expect("lock"),
        Some(0)
    );
    let rotating = {
        let pool = db.pool.clone();
        let agent = agent.clone();
        tokio::spawn(async move {
            let mut conn = pool.acquire().await.expect("conn");
            lineage::rotate_credentials(&mut conn, &agent)
                .await
                .expect("rotate");
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !rotating.is_finished(),
        "a rotation waits for the capture holding the generation"
    );
    capture.commit().await.expect("commit");
    rotating
        .await
        .expect("rotation ends once the capture committed");
    let mut conn = db.pool.acquire().await.expect("conn");
    assert_eq!(
        lineage::lock_for_capture(&mut conn, &agent, store)
            .await
            .expect("lock"),
        Some(1),
        "the rotated generation"
    );
}

/// Readiness and the packs a snapshot references land together, and only on a snapshot
/// still being captured: one failed meanwhile (the reaper took it for abandoned) gets
/// neither.
#[tokio::test]
async fn a_snapshot_is_marked_ready_with_its_packs_or_not_at_all() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.expect("conn");
    let packs = [Uuid::new_v4(), Uuid::new_v4()];
    let recorded = |id: Uuid| {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM snapshot_packs WHERE snapshot_id = $1")
            .bind(id)
    };
    let capturing = lineage::create_uploading(
        &mut conn,
        &cairn_common::testing::new_checkpoint("agent", Uuid::new_v4()),
    )
    .await
    .expect("create");
    assert!(lineage::mark_ready(
        &mut conn,
        capturing,
        &lineage::Stored {
            manifest_key: "manifests/a",
            size_bytes: 1,
            tree_digest: "t",
            pack_ids: &packs
        }
    )
    .await
    .expect("ready"));
    assert_eq!(
        recorded(capturing)
            .fetch_one(&mut *conn)
            .await
            .expect("count"),
        2
    );

    let failed = lineage::create_uploading(
        &mut conn,
        &cairn_common::testing::new_checkpoint("agent", Uuid::new_v4()),
    )
    .await
    .expect("create");
    assert!(lineage::set_status(
        &mut conn,
        failed,
        &[SnapshotStatus::Uploading],
        SnapshotStatus::Failed
    )
    .await
    .expect("fail"));
    assert!(!lineage::mark_ready(
        &mut conn,
        failed,
        &lineage::Stored {
            manifest_key: "manifests/b",
            size_bytes: 1,
            tree_digest: "t",
            pack_ids: &packs
        }
    )
    .await
    .expect("not ready"));
    assert_eq!(
        recorded(failed).fetch_one(&mut *conn).await.expect("count"),
        0
    );
}
