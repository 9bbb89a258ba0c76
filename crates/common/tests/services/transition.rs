//! The transition table against the real database: random event sequences move rows
//! only as the table allows and never out of a terminal state; every state write in the
//! code goes through it; an interrupted step's wall time is charged once.

use cairn_common::handoff::{AdoptionStatus, HandoffState};
use cairn_common::journal;
use cairn_common::lease::Lease;
use cairn_common::request::action::ActionStatus;
use cairn_common::request::table::{self, Machine};
use cairn_common::request::{self, RequestEvent, RequestState};
use cairn_common::testing::{self, ServiceLock, TestDb};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// Sequences per machine, and the longest sequence.
const SEQUENCES: usize = 150;
const LONGEST: usize = 12;

/// The seed of this run: `CAIRN_TABLE_SEED` replays a failure.
fn seed() -> u64 {
    std::env::var("CAIRN_TABLE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

async fn state_of<M: Machine>(conn: &mut PgConnection, id: Uuid) -> M {
    let text: String = sqlx::query_scalar(&format!(
        "SELECT {} FROM {} WHERE id = $1",
        M::COLUMN,
        M::TABLE
    ))
    .bind(id)
    .fetch_one(conn)
    .await
    .expect("read state");
    M::parse_state(&text).expect("a known state")
}

async fn reset<M: Machine>(conn: &mut PgConnection, id: Uuid, initial: M) {
    sqlx::query(&format!(
        "UPDATE {} SET {} = $2 WHERE id = $1",
        M::TABLE,
        M::COLUMN
    ))
    .bind(id)
    .bind(initial.to_string())
    .execute(&mut *conn)
    .await
    .expect("reset state");
    // A run mirrors its request: reset it too, or a sequence whose every move is refused
    // leaves the run where the previous sequence took it.
    if M::TABLE == "execution_requests" {
        sqlx::query(
            "UPDATE runs SET state = $2 WHERE id = (SELECT run_id FROM execution_requests WHERE id = $1)",
        )
        .bind(id)
        .bind(initial.to_string())
        .execute(conn)
        .await
        .expect("reset the run");
    }
}

/// Applies random events to one row through `apply` and checks each result against the
/// table: an allowed move lands on its target, any other changes nothing and is refused,
/// and once a state of `terminal` (declared here, not read from the table) is reached
/// the row never moves again.
async fn walk<M, F>(
    pool: &PgPool,
    id: Uuid,
    (initial, terminal): (M, &[M]),
    seed: u64,
    mut apply: F,
) where
    M: Machine,
    M::Event: std::fmt::Display,
    F: for<'c> FnMut(
        &'c mut PgConnection,
        Uuid,
        M::Event,
    ) -> futures::future::BoxFuture<'c, Result<M, request::Error>>,
{
    let mut rng = StdRng::seed_from_u64(seed);
    let mut conn = pool.acquire().await.expect("conn");
    for sequence in 0..SEQUENCES {
        reset(&mut conn, id, initial).await;
        let mut terminal_reached = false;
        for _ in 0..rng.random_range(1..=LONGEST) {
            let event = M::EVENTS[rng.random_range(0..M::EVENTS.len())];
            let before: M = state_of(&mut conn, id).await;
            let result = apply(&mut conn, id, event).await;
            let after: M = state_of(&mut conn, id).await;
            let context = format!(
                "{} seed {seed} sequence {sequence}: {before} + {event}",
                M::NAME
            );
            match before.next(event) {
                Some(target) => {
                    assert_eq!(result.ok(), Some(target), "{context}");
                    assert_eq!(after, target, "{context}");
                }
                None => {
                    let refused = result.expect_err(&context);
                    assert!(refused.refused().is_some(), "{context}: {refused}");
                    assert_eq!(after, before, "{context}: a refused move changed nothing");
                }
            }
            if terminal_reached {
                assert_eq!(after, before, "{context}: a terminal state was left");
            }
            terminal_reached |= terminal.contains(&after);
        }
    }
}

struct Rows {
    run_id: Uuid,
    request_id: Uuid,
    action_id: Uuid,
    handoff_id: Uuid,
    adoption_id: Uuid,
}

async fn rows(pool: &PgPool) -> Rows {
    let (run_id, request_id) = testing::insert_request(pool).await;
    let action_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO continuation_actions (id, kind, run_id, request_id, checkpoint_ref, input, input_digest,
                candidate_digest, witness_digest, admission_seal, valid_for_seconds, window_ends_at, status)
         VALUES ($1, 'checkpoint_continuation', $2, $3, 'checkpoint:1', '{}', 'x', 'x', 'x', 'x', 60,
                 now() + interval '60 seconds', 'queued')",
    )
    .bind(action_id)
    .bind(run_id)
    .bind(request_id)
    .execute(pool)
    .await
    .expect("action");
    let handoff_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO verification_handoffs (id, run_id, request_id, commands, commands_digest, state)
         VALUES ($1, $2, $3, '[]', 'x', 'pending')",
    )
    .bind(handoff_id)
    .bind(run_id)
    .bind(request_id)
    .execute(pool)
    .await
    .expect("handoff");
    let adoption_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO verification_adoptions (id, run_id, handoff_id, execution_request_id, input, input_digest, status)
         VALUES ($1, $2, $3, $4, '{}', 'x', 'queued')",
    )
    .bind(adoption_id)
    .bind(run_id)
    .bind(handoff_id)
    .bind(request_id)
    .execute(pool)
    .await
    .expect("adoption");
    Rows {
        run_id,
        request_id,
        action_id,
        handoff_id,
        adoption_id,
    }
}

#[tokio::test]
async fn random_event_sequences_follow_the_table_and_never_leave_a_terminal_state() {
    let _services = ServiceLock::shared().await;
    let db = TestDb::new().await;
    let r = rows(&db.pool).await;
    let seed = seed();
    println!("CAIRN_TABLE_SEED={seed}");

    walk(
        &db.pool,
        r.request_id,
        (
            RequestState::Queued,
            &[
                RequestState::Completed,
                RequestState::Failed,
                RequestState::Cancelled,
            ],
        ),
        seed,
        |c, id, e| Box::pin(request::transition(c, id, e, Some("test"), None)),
    )
    .await;
    // The run mirrors its request through every move.
    let (request_state, run_state): (String, String) = sqlx::query_as(
        "SELECT e.state, r.state FROM execution_requests e JOIN runs r ON r.id = e.run_id WHERE e.id = $1",
    )
    .bind(r.request_id)
    .fetch_one(&db.pool)
    .await
    .expect("states");
    let request_state = RequestState::parse(&request_state).expect("state");
    assert_eq!(run_state, request_state.run_state(), "run {}", r.run_id);

    walk(
        &db.pool,
        r.action_id,
        (
            ActionStatus::Queued,
            &[
                ActionStatus::Completed,
                ActionStatus::Failed,
                ActionStatus::NeedsReconciliation,
                ActionStatus::Expired,
            ],
        ),
        seed,
        |c, id, e| Box::pin(request::action::transition(c, id, e)),
    )
    .await;
    walk(
        &db.pool,
        r.adoption_id,
        (
            AdoptionStatus::Queued,
            &[
                AdoptionStatus::Completed,
                AdoptionStatus::Failed,
                AdoptionStatus::Cancelled,
            ],
        ),
        seed,
        |c, id, e| Box::pin(cairn_common::handoff::adoption_transition(c, id, e, None)),
    )
    .await;
    walk(
        &db.pool,
        r.handoff_id,
        (
            HandoffState::Pending,
            &[HandoffState::Passed, HandoffState::Failed],
        ),
        seed,
        |c, id, e| Box::pin(table::apply::<HandoffState>(c, id, e)),
    )
    .await;
}

#[tokio::test]
async fn a_move_on_a_row_that_does_not_exist_is_an_error_not_a_refusal() {
    let _services = ServiceLock::shared().await;
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.expect("conn");
    let missing = Uuid::new_v4();
    let error = request::transition(&mut conn, missing, RequestEvent::Cancel, None, None)
        .await
        .expect_err("no such request");
    assert!(error.refused().is_none(), "{error}");
}

/// Where the code writes a state or status column of the request family's tables: an
/// `UPDATE` of one of them whose `SET` list (up to `WHERE`, `FROM` or `RETURNING`)
/// assigns `state` or `status`.
fn state_writes(source: &str) -> Vec<String> {
    let tables = [
        "execution_requests",
        "runs",
        "continuation_actions",
        "verification_adoptions",
        "verification_handoffs",
    ];
    let mut found = Vec::new();
    for table in tables {
        let needle = format!("UPDATE {table}");
        for (at, _) in source.match_indices(&needle) {
            let rest = &source[at + needle.len()..];
            if !rest.starts_with(|c: char| c.is_whitespace()) {
                continue;
            }
            let sql = rest.split('"').next().unwrap_or("");
            let Some(set) = sql.find("SET") else { continue };
            let list = &sql[set + 3..];
            let end = ["WHERE", "FROM", "RETURNING"]
                .iter()
                .filter_map(|k| list.find(k))
                .min()
                .unwrap_or(list.len());
            let list = &list[..end];
            let assigns = list
                .split(',')
                .filter_map(|a| a.split('=').next())
                .any(|column| matches!(column.trim(), "state" | "status"));
            if assigns {
                found.push(format!(
                    "{needle}{}",
                    &sql[..set + 3 + end].replace('\n', " ")
                ));
            }
        }
    }
    found
}

#[test]
fn every_state_write_goes_through_the_transition_table() {
    let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The two writers the table guards: the request's and the generic one.
    let allowed = ["common/src/request/state.rs", "common/src/request/table.rs"];
    let mut offenders = Vec::new();
    let mut files = vec![crates.clone()];
    while let Some(path) = files.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let rel = path
                .strip_prefix(&crates)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                if !rel.ends_with("target") && !rel.contains("/tests") {
                    files.push(path);
                }
                continue;
            }
            if !rel.contains("/src/") || !rel.ends_with(".rs") || allowed.contains(&rel.as_str()) {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap_or_default();
            for write in state_writes(&source) {
                offenders.push(format!("{rel}: {write}"));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "state written outside the transition table:\n{}",
        offenders.join("\n")
    );
    // The scan finds what it looks for, and only that.
    let sample = "\"UPDATE runs SET updated_at = now(), state = 'queued' WHERE id = $1\"";
    assert_eq!(state_writes(sample).len(), 1);
    let guarded = "\"UPDATE execution_requests SET paused_at = now() WHERE state = 'executing'\"";
    assert!(state_writes(guarded).is_empty());
}

#[tokio::test]
async fn an_interrupted_step_is_charged_once_up_to_its_owners_deadline() {
    let _services = ServiceLock::shared().await;
    let db = TestDb::new().await;
    let (_, request_id) = testing::insert_request(&db.pool).await;
    let lease = Lease {
        of: cairn_common::lease::Leased::Request,
        request_id,
        owner: "w1".into(),
        epoch: 0,
        deadline: chrono::Utc::now(),
    };
    let mut conn = db.pool.acquire().await.expect("conn");
    journal::write_intent(&mut conn, &lease, 1, "s1", 0, true, None)
        .await
        .expect("intent");
    // The step started 5 s ago; its owner's lease ran out 3 s after it started.
    let started: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "UPDATE journal_intents SET started_at = now() - interval '5 seconds'
          WHERE request_id = $1 RETURNING started_at",
    )
    .bind(request_id)
    .fetch_one(&mut *conn)
    .await
    .expect("backdate");
    let deadline = started + chrono::Duration::seconds(3);
    let charged = journal::charge_interrupted(&mut conn, request_id, Some(deadline))
        .await
        .expect("charge");
    assert_eq!(charged, 3000, "from the intent's start to the deadline");
    let again = journal::charge_interrupted(&mut conn, request_id, None)
        .await
        .expect("charge again");
    assert_eq!(again, 0, "an interval is charged once");
    let used: i64 = sqlx::query_scalar("SELECT used_wall_ms FROM execution_requests WHERE id = $1")
        .bind(request_id)
        .fetch_one(&mut *conn)
        .await
        .expect("usage");
    assert_eq!(used, 3000);

    // Run again and receipted: the receipt charges what it measured, and the intent is
    // closed, so nothing more is charged as interrupted.
    journal::write_intent(&mut conn, &lease, 2, "s1", 0, true, None)
        .await
        .expect("intent again");
    let outcome = cairn_common::testing::exited_zero(700, 10);
    let receipt = journal::Receipt {
        step_key: "s1",
        attempt: 2,
        outcome: &outcome,
        tier: None,
    };
    journal::record_receipt(&mut conn, &lease, &receipt, None)
        .await
        .expect("receipt");
    let after = journal::charge_interrupted(&mut conn, request_id, None)
        .await
        .expect("nothing open");
    assert_eq!(after, 0);
    let used: i64 = sqlx::query_scalar("SELECT used_wall_ms FROM execution_requests WHERE id = $1")
        .bind(request_id)
        .fetch_one(&mut *conn)
        .await
        .expect("usage");
    assert_eq!(used, 3700);
}

/// A run that fails or is cancelled retires its lineage in the move's own transaction,
/// whichever path moves it (a worker's failure, a cancel of a queued or stopped run):
/// no continuation can take it further.
#[tokio::test]
async fn a_failed_or_cancelled_run_retires_its_lineage_with_the_move() {
    let _services = ServiceLock::shared().await;
    let db = TestDb::new().await;
    let cases = [
        (RequestEvent::Fail, Some("task_failed")),
        (RequestEvent::Cancel, Some("task_cancelled")),
        (RequestEvent::Claim, None),
    ];
    for (event, reason) in cases {
        let (run_id, request_id) = testing::insert_request(&db.pool).await;
        let mut conn = db.pool.acquire().await.expect("conn");
        testing::commit_tree(&mut conn, request_id, "tree").await;
        request::transition(&mut conn, request_id, event, None, None)
            .await
            .expect("moved");
        let (head_retired, snapshot_reason): (bool, Option<String>) = sqlx::query_as(
            "SELECT h.retired_at IS NOT NULL, s.retire_reason
               FROM lineage_heads h JOIN project_snapshots s ON s.id = h.head_id
              WHERE h.work_context_id = $1",
        )
        .bind(run_id)
        .fetch_one(&mut *conn)
        .await
        .expect("the head");
        assert_eq!(
            (head_retired, snapshot_reason.as_deref()),
            (reason.is_some(), reason),
            "{event:?}"
        );
    }
}

/// A job's last move releases its lease in the same statement, only for the holder of
/// the lease; a holder that no longer holds it moves the request alone (its release then
/// reports why), and a refused move changes nothing.
#[tokio::test]
async fn a_completion_releases_only_its_holders_lease_with_the_move() {
    let _services = ServiceLock::shared().await;
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.expect("conn");
    // Completed by w1 at epoch 1: of its own lease, and of one w2 took at epoch 2.
    let mut completed = Vec::new();
    for (epoch, owner) in [(1, "w1"), (2, "w2")] {
        let (_, request_id) = testing::insert_request(&db.pool).await;
        held_by(&mut conn, request_id, epoch, owner).await;
        let released =
            request::transition_releasing(&mut conn, request_id, RequestEvent::Complete, (1, "w1"))
                .await
                .expect("moved");
        let row: (String, Option<String>, bool) = sqlx::query_as(
            "SELECT state, lease_owner, lease_deadline IS NULL FROM execution_requests WHERE id = $1",
        )
        .bind(request_id)
        .fetch_one(&mut *conn)
        .await
        .expect("row");
        completed.push((request_id, released, row));
    }
    let [(mine, released, row), (_, moved, taken)] = completed.as_slice() else {
        unreachable!("two requests")
    };
    assert_eq!(*released, request::Released::Both(RequestState::Completed));
    assert_eq!(*row, ("completed".to_string(), None, true));
    assert_eq!(
        *moved,
        request::Released::MovedOnly(RequestState::Completed)
    );
    assert_eq!(
        *taken,
        ("completed".to_string(), Some("w2".to_string()), false),
        "another holder's lease stays"
    );
    let mine = *mine;

    let refused =
        request::transition_releasing(&mut conn, mine, RequestEvent::Complete, (1, "w1")).await;
    assert!(
        matches!(refused, Err(request::Error::Refused(_))),
        "a completed request completes once: {refused:?}"
    );
}

/// A claimed request whose lease `owner` holds at `epoch`.
async fn held_by(conn: &mut PgConnection, request_id: Uuid, epoch: i64, owner: &str) {
    request::transition(&mut *conn, request_id, RequestEvent::Claim, None, None)
        .await
        .expect("claimed");
    sqlx::query(
        "UPDATE execution_requests SET lease_epoch = $2, lease_owner = $3,
                lease_deadline = now() + interval '1 minute' WHERE id = $1",
    )
    .bind(request_id)
    .bind(epoch)
    .bind(owner)
    .execute(conn)
    .await
    .expect("leased");
}
