//! The workspace janitor removes a tree only when no hold guards it, its grace has
//! passed, no job of this process runs its request, and it is a tree of its directory.

use cairn_common::testing::TestDb;
use cairn_worker::janitor::{ActiveRequests, Janitor};
use std::path::PathBuf;
use std::time::Duration;
use uuid::Uuid;

struct Case {
    label: &'static str,
    host: &'static str,
    state: &'static str,
    /// (ended, expires in seconds from now)
    hold: Option<(bool, i64)>,
    updated_seconds_ago: i64,
    active: bool,
    inside: bool,
    removed: bool,
}

#[tokio::test]
async fn only_trees_no_hold_guards_are_removed() {
    let db = TestDb::new().await;
    let scratch = std::env::temp_dir().join(format!("cairn-janitor-{}", Uuid::new_v4().simple()));
    let base = scratch.join("workspaces");
    let elsewhere = scratch.join("elsewhere");
    std::fs::create_dir_all(&base).expect("base");
    std::fs::create_dir_all(&elsewhere).expect("elsewhere");
    let (mine, theirs) = (Uuid::new_v4(), Uuid::new_v4());
    let directory = |host: &str| if host == "w-test" { mine } else { theirs };
    let janitor = Janitor {
        directory_id: mine,
        workspaces_dir: base.clone(),
        grace: Duration::from_secs(600),
    };
    let active = ActiveRequests::default();
    let cases = [
        Case {
            label: "hold ended",
            host: "w-test",
            state: "stopped",
            hold: Some((true, 3600)),
            updated_seconds_ago: 3600,
            active: false,
            inside: true,
            removed: true,
        },
        Case {
            label: "hold alive",
            host: "w-test",
            state: "stopped",
            hold: Some((false, 3600)),
            updated_seconds_ago: 3600,
            active: false,
            inside: true,
            removed: false,
        },
        Case {
            label: "hold expired past the grace",
            host: "w-test",
            state: "stopped",
            hold: Some((false, -3600)),
            updated_seconds_ago: 3600,
            active: false,
            inside: true,
            removed: true,
        },
        Case {
            label: "hold expired within the grace",
            host: "w-test",
            state: "stopped",
            hold: Some((false, -60)),
            updated_seconds_ago: 3600,
            active: false,
            inside: true,
            removed: false,
        },
        Case {
            label: "left by a dead run of this worker",
            host: "w-test",
            state: "running",
            hold: None,
            updated_seconds_ago: 3600,
            active: false,
            inside: true,
            removed: true,
        },
        Case {
            label: "changed within the grace",
            host: "w-test",
            state: "running",
            hold: None,
            updated_seconds_ago: 60,
            active: false,
            inside: true,
            removed: false,
        },
        Case {
            label: "its request runs here",
            host: "w-test",
            state: "running",
            hold: None,
            updated_seconds_ago: 3600,
            active: true,
            inside: true,
            removed: false,
        },
        Case {
            label: "another directory's",
            host: "w-other",
            state: "stopped",
            hold: Some((true, 3600)),
            updated_seconds_ago: 3600,
            active: false,
            inside: true,
            removed: false,
        },
        Case {
            label: "outside the workspaces directory",
            host: "w-test",
            state: "stopped",
            hold: Some((true, 3600)),
            updated_seconds_ago: 3600,
            active: false,
            inside: false,
            removed: false,
        },
    ];
    let mut trees: Vec<(Uuid, PathBuf)> = Vec::new();
    for case in &cases {
        let request = Uuid::new_v4();
        let path = if case.inside { &base } else { &elsewhere }.join(request.simple().to_string());
        std::fs::create_dir_all(&path).expect("tree");
        std::fs::write(path.join("work.txt"), case.label).expect("file");
        let workspace = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO workspaces (id, agent, backend, state, host, path, updated_at, directory_id)
             VALUES ($1, 'agent', 'local', $2, $3, $4, now() - make_interval(secs => $5), $6)",
        )
        .bind(workspace)
        .bind(case.state)
        .bind(case.host)
        .bind(path.to_string_lossy().as_ref())
        .bind(case.updated_seconds_ago as f64)
        .bind(directory(case.host))
        .execute(&db.pool)
        .await
        .expect("workspace");
        if let Some((ended, expires_in)) = case.hold {
            sqlx::query(
                "INSERT INTO holds (id, workspace_id, agent, reason, expires_at, ended_at)
                 VALUES ($1, $2, 'agent', 'uncaptured tree', now() + make_interval(secs => $3),
                         CASE WHEN $4 THEN now() END)",
            )
            .bind(Uuid::new_v4())
            .bind(workspace)
            .bind(expires_in as f64)
            .bind(ended)
            .execute(&db.pool)
            .await
            .expect("hold");
        }
        if case.active {
            active.enter(request).await;
        }
        trees.push((workspace, path));
    }

    let report = janitor.sweep_once(&db.pool, &active).await.expect("sweep");
    let expected = cases.iter().filter(|c| c.removed).count() as u64;
    assert_eq!(report.removed, expected, "{report:?}");
    for (case, (workspace, path)) in cases.iter().zip(&trees) {
        assert_eq!(!path.exists(), case.removed, "{}: tree", case.label);
        let state: String = sqlx::query_scalar("SELECT state FROM workspaces WHERE id = $1")
            .bind(workspace)
            .fetch_one(&db.pool)
            .await
            .expect("state");
        assert_eq!(
            state == "destroyed",
            case.removed,
            "{}: row is {state}",
            case.label
        );
        if case.removed {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM holds WHERE workspace_id = $1 AND ended_at IS NULL",
            )
            .bind(workspace)
            .fetch_one(&db.pool)
            .await
            .expect("holds");
            assert_eq!(open, 0, "{}: its holds end with it", case.label);
        }
    }
    // Two rows of one path: a stale run of the request, and a later run that left its
    // tree under a live hold. The stale row must not take the guarded tree with it.
    let shared = base.join(Uuid::new_v4().simple().to_string());
    std::fs::create_dir_all(&shared).expect("tree");
    let (stale, guarded) = (Uuid::new_v4(), Uuid::new_v4());
    for (id, state, ago) in [(stale, "running", 7200.0), (guarded, "stopped", 3600.0)] {
        sqlx::query(
            "INSERT INTO workspaces (id, agent, backend, state, host, path, updated_at, directory_id)
             VALUES ($1, 'agent', 'local', $2, 'w-test', $3, now() - make_interval(secs => $4), $5)",
        )
        .bind(id)
        .bind(state)
        .bind(shared.to_string_lossy().as_ref())
        .bind(ago)
        .bind(mine)
        .execute(&db.pool)
        .await
        .expect("workspace");
    }
    sqlx::query(
        "INSERT INTO holds (id, workspace_id, agent, reason, expires_at)
         VALUES ($1, $2, 'agent', 'uncaptured tree', now() + interval '1 hour')",
    )
    .bind(Uuid::new_v4())
    .bind(guarded)
    .execute(&db.pool)
    .await
    .expect("hold");
    let again = janitor.sweep_once(&db.pool, &active).await.expect("sweep");
    assert!(
        shared.exists(),
        "a live hold on the path's later row keeps the tree"
    );
    assert_eq!(again.removed, 0, "a second pass finds nothing more");
    let leftovers: Vec<_> = std::fs::read_dir(&base)
        .expect("base")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains("removed-"))
        .collect();
    assert!(leftovers.is_empty(), "nothing half-removed stays");
    let _ = std::fs::remove_dir_all(&scratch);
}
