//! Reconciliation decisions against the real database: which steps a person must
//! decide, and what a decision leaves in the journal for the next claim.

use cairn_common::journal::{self, Standing};
use cairn_common::lease::{Lease, Leased};
use cairn_common::request::reconciliation::{self, NewDecision, Verdict};
use cairn_common::request::{self, RequestEvent};
use cairn_common::testing::{self, ServiceLock, TestDb};
use sqlx::PgConnection;
use uuid::Uuid;

fn lease(request_id: Uuid) -> Lease {
    Lease {
        of: Leased::Request,
        request_id,
        owner: "w1".into(),
        epoch: 0,
        deadline: chrono::Utc::now(),
    }
}

/// Moves the request to `needs_reconciliation`, stopped on `step`.
async fn stop_on(conn: &mut PgConnection, request_id: Uuid, step: &str) {
    for event in [RequestEvent::Claim, RequestEvent::Reconcile] {
        let step = (event == RequestEvent::Reconcile).then_some(step);
        request::transition(&mut *conn, request_id, event, Some("unknown_outcome"), step)
            .await
            .expect("move");
    }
}

#[tokio::test]
async fn only_plan_steps_that_cannot_run_again_wait_for_a_person() {
    let _services = ServiceLock::shared().await;
    let db = TestDb::new().await;
    let (_, request_id) = testing::insert_request(&db.pool).await;
    let mut conn = db.pool.acquire().await.expect("conn");
    let lease = lease(request_id);
    for (key, index, idempotent) in [
        ("build", 0, true),
        ("deploy", 1, false),
        ("verify:a:0", 2, false),
    ] {
        journal::write_intent(&mut conn, &lease, 1, key, index, idempotent, None)
            .await
            .expect("intent");
    }
    let undecided = journal::undecided(&mut conn, request_id, Some("deploy"))
        .await
        .expect("read");
    assert_eq!(
        undecided,
        ["deploy"],
        "an idempotent step runs again by itself; a check is not a plan step"
    );
    let stopped_on_build = journal::undecided(&mut conn, request_id, Some("build"))
        .await
        .expect("read");
    assert_eq!(stopped_on_build, ["build", "deploy"]);
}

#[tokio::test]
async fn a_step_marked_done_counts_until_it_is_receipted_again_and_can_be_decided_anew() {
    let _services = ServiceLock::shared().await;
    let db = TestDb::new().await;
    let (run_id, request_id) = testing::insert_request(&db.pool).await;
    let mut conn = db.pool.acquire().await.expect("conn");
    let lease = lease(request_id);
    journal::write_intent(&mut conn, &lease, 1, "s1", 0, false, None)
        .await
        .expect("intent");
    stop_on(&mut conn, request_id, "s1").await;
    let decision = NewDecision {
        id: Uuid::new_v4(),
        run_id,
        step_key: "s1",
        decision: Verdict::MarkDone,
        reason: "done by hand",
        decided_by: Uuid::new_v4(),
    };
    let (saved, fresh) = reconciliation::decide(&mut conn, &decision)
        .await
        .expect("decide");
    assert!(fresh);
    assert_eq!(saved.decided_by_name, "unknown token");
    let standings = journal::standings(&mut conn, request_id, None)
        .await
        .expect("standings");
    assert_eq!(standings.get("s1"), Some(&Standing::MarkedDone));
    assert!(
        reconciliation::undecided(&mut conn, request_id)
            .await
            .expect("read")
            .is_empty(),
        "decided, and the request is queued again"
    );
    let (again, fresh) = reconciliation::decide(&mut conn, &decision)
        .await
        .expect("repeat");
    assert!(
        !fresh && again.id == saved.id,
        "the same id and body: the same decision"
    );

    // Stopped on it again (an earlier step ran again first): a person decides it anew.
    request::transition(&mut conn, request_id, RequestEvent::Claim, None, None)
        .await
        .expect("claim");
    request::transition(
        &mut conn,
        request_id,
        RequestEvent::Reconcile,
        Some("tree_behind_journal"),
        Some("s1"),
    )
    .await
    .expect("stop");
    let undecided = reconciliation::undecided(&mut conn, request_id)
        .await
        .expect("read");
    assert_eq!(
        undecided,
        ["s1"],
        "a marked-done step the run stopped on again is decided anew"
    );

    // A worker's own receipt replaces the person's: it no longer stands as marked done.
    let outcome = testing::exited_zero(10, 1);
    let receipt = journal::Receipt {
        step_key: "s1",
        attempt: 1,
        outcome: &outcome,
        tier: None,
    };
    journal::record_receipt(&mut conn, &lease, &receipt, None)
        .await
        .expect("receipt");
    let standings = journal::standings(&mut conn, request_id, None)
        .await
        .expect("standings");
    assert_eq!(
        standings.get("s1"),
        Some(&Standing::Behind { snapshot: None })
    );
}
