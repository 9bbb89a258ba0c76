//! Leases against the real PostgreSQL and Redis.

use cairn_common::lease::{Lease, LeaseError, Leases};
use cairn_common::testing::{self, ServiceLock, TestDb};
use sqlx::PgPool;
use std::time::Duration;

async fn leases(pool: &PgPool, ttl: Duration) -> Leases {
    let redis = cairn_common::redis_conn::connect(&testing::redis_url())
        .await
        .expect("redis");
    Leases::new(pool.clone(), redis, &testing::unique_prefix("lease"), ttl)
}

/// A fenced durable write, as a worker makes one: a journal entry under the lease.
async fn fenced_write(pool: &PgPool, lease: &Lease, note: &str) -> Result<(), LeaseError> {
    let mut tx = lease.begin_fenced(pool).await?;
    sqlx::query(
        "INSERT INTO journal_entries (request_id, entry_kind, lease_epoch, body)
         VALUES ($1, 'test', $2, jsonb_build_object('note', $3::text))",
    )
    .bind(lease.request_id)
    .bind(lease.epoch)
    .bind(note)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

async fn committed_notes(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT body->>'note' FROM journal_entries ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("read journal")
}

#[tokio::test]
async fn of_two_contenders_exactly_one_wins() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let _services = ServiceLock::shared().await;
    let leases = leases(&pool, Duration::from_secs(30)).await;
    for _ in 0..20 {
        let (_, request) = testing::insert_request(&pool).await;
        let (a, b) = tokio::join!(
            leases.claim(request, "worker-a"),
            leases.claim(request, "worker-b")
        );
        let winners = [a.expect("claim a"), b.expect("claim b")]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>();
        assert_eq!(winners.len(), 1, "exactly one contender wins");
        assert_eq!(winners[0].epoch, 1);
        let (epoch, owner) = leases.liveness(request).await.expect("liveness key set");
        assert_eq!((epoch, owner.as_str()), (1, winners[0].owner.as_str()));
    }
}

#[tokio::test]
async fn after_expiry_a_new_owner_fences_out_the_old_one() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let _services = ServiceLock::shared().await;
    let leases = leases(&pool, Duration::from_millis(400)).await;
    let (_, request) = testing::insert_request(&pool).await;
    let old = leases
        .claim(request, "old")
        .await
        .expect("claim")
        .expect("free");
    fenced_write(&pool, &old, "old-before-expiry")
        .await
        .expect("owner writes");
    assert!(
        leases.claim(request, "new").await.expect("claim").is_none(),
        "held lease"
    );

    tokio::time::sleep(Duration::from_millis(600)).await;
    let new = leases
        .claim(request, "new")
        .await
        .expect("claim")
        .expect("expired lease");
    assert!(new.epoch > old.epoch, "the epoch grows with every claim");
    // The new owner's short lease must outlast the checks below on a loaded machine: its
    // deadline is moved an hour on (its epoch, which is what fences, stays).
    sqlx::query(
        "UPDATE execution_requests SET lease_deadline = now() + interval '1 hour' WHERE id = $1",
    )
    .bind(request)
    .execute(&pool)
    .await
    .expect("extend");

    match fenced_write(&pool, &old, "old-after-takeover").await {
        Err(LeaseError::StaleOwner {
            held_epoch,
            current_epoch,
            ..
        }) => {
            assert_eq!((held_epoch, current_epoch), (old.epoch, new.epoch));
        }
        other => panic!("stale write must be rejected, got {other:?}"),
    }
    fenced_write(&pool, &new, "new")
        .await
        .expect("new owner writes");
    assert_eq!(committed_notes(&pool).await, ["old-before-expiry", "new"]);
    // The old owner cannot clear the new owner's lease either.
    assert!(matches!(
        leases.release(&old).await,
        Err(LeaseError::StaleOwner { .. })
    ));
    assert_eq!(leases.liveness(request).await.map(|l| l.0), Some(new.epoch));
}

#[tokio::test]
async fn renewal_after_expiry_fails() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let _services = ServiceLock::shared().await;
    // 900 ms of slack for "in time" on a loaded machine; the second sleep outlasts it.
    let leases = leases(&pool, Duration::from_millis(1000)).await;
    let (_, request) = testing::insert_request(&pool).await;
    let mut lease = leases
        .claim(request, "w")
        .await
        .expect("claim")
        .expect("free");
    let first_deadline = lease.deadline;
    tokio::time::sleep(Duration::from_millis(100)).await;
    leases.renew(&mut lease).await.expect("renew in time");
    assert!(
        lease.deadline > first_deadline,
        "renewal moves the deadline"
    );

    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(matches!(
        leases.renew(&mut lease).await,
        Err(LeaseError::Expired { .. })
    ));
    // Expired without a new owner: writes are refused all the same.
    assert!(matches!(
        fenced_write(&pool, &lease, "late").await,
        Err(LeaseError::Expired { .. })
    ));
    let next = leases
        .claim(request, "w2")
        .await
        .expect("claim")
        .expect("expired");
    assert!(matches!(
        leases.renew(&mut lease).await,
        Err(LeaseError::StaleOwner { .. })
    ));
    assert_eq!(next.epoch, lease.epoch + 1);
}

#[tokio::test]
async fn release_lets_another_claim_at_once() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let _services = ServiceLock::shared().await;
    let leases = leases(&pool, Duration::from_secs(30)).await;
    let (_, request) = testing::insert_request(&pool).await;
    let lease = leases
        .claim(request, "a")
        .await
        .expect("claim")
        .expect("free");
    leases.release(&lease).await.expect("release");
    leases.settle().await;
    assert_eq!(leases.liveness(request).await, None, "liveness key deleted");
    assert!(matches!(
        fenced_write(&pool, &lease, "after-release").await,
        Err(LeaseError::Expired { .. })
    ));
    let next = leases
        .claim(request, "b")
        .await
        .expect("claim")
        .expect("released");
    assert_eq!(next.epoch, 2);
}

/// Redis keeps nothing on disk and may lose every key: `FLUSHALL` mid-lease must never
/// let two owners both commit.
#[tokio::test]
async fn flushall_mid_lease_never_yields_two_committing_owners() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let _services = ServiceLock::exclusive().await;
    let leases = leases(&pool, Duration::from_millis(800)).await;
    let (_, request) = testing::insert_request(&pool).await;
    let mut first = leases
        .claim(request, "first")
        .await
        .expect("claim")
        .expect("free");

    let mut redis = cairn_common::redis_conn::connect(&testing::redis_url())
        .await
        .expect("redis");
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut redis)
        .await
        .expect("FLUSHALL");
    assert_eq!(
        leases.liveness(request).await,
        None,
        "Redis forgot the lease"
    );

    // Redis forgot, PostgreSQL did not: nobody else can claim while the lease is live.
    assert!(leases
        .claim(request, "second")
        .await
        .expect("claim")
        .is_none());
    // The holder's renewal restores its liveness key.
    leases.renew(&mut first).await.expect("renew");
    assert_eq!(
        leases.liveness(request).await.map(|l| l.0),
        Some(first.epoch)
    );

    // Flush again and let the lease lapse: a second owner claims, and from then on only
    // one of the two can commit.
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut redis)
        .await
        .expect("FLUSHALL");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let second = leases
        .claim(request, "second")
        .await
        .expect("claim")
        .expect("lapsed");
    let (a, b) = tokio::join!(
        fenced_write(&pool, &first, "first"),
        fenced_write(&pool, &second, "second")
    );
    assert!(a.is_err(), "the lapsed owner cannot commit");
    b.expect("the new owner commits");
    assert_eq!(committed_notes(&pool).await, ["second"]);
}

/// A restarted worker that keeps its name (a StatefulSet pod, a fixed CAIRN_WORKER_ID)
/// is a new owner: only the epoch tells its new lease from its old one.
#[tokio::test]
async fn the_epoch_alone_fences_an_older_lease_of_the_same_owner_name() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let _services = ServiceLock::shared().await;
    let leases = leases(&pool, Duration::from_millis(300)).await;
    let (_, request) = testing::insert_request(&pool).await;
    let before = leases
        .claim(request, "worker-0")
        .await
        .expect("claim")
        .expect("free");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = leases
        .claim(request, "worker-0")
        .await
        .expect("claim")
        .expect("lapsed");
    assert_eq!(after.epoch, before.epoch + 1);
    match fenced_write(&pool, &before, "before-restart").await {
        Err(LeaseError::StaleOwner { .. }) => {}
        other => panic!("the older lease must be fenced out by its epoch, got {other:?}"),
    }
    fenced_write(&pool, &after, "after-restart")
        .await
        .expect("current lease writes");
    assert_eq!(committed_notes(&pool).await, ["after-restart"]);
}

/// A delivery for a request that is no longer queued (a duplicate, or one the sweeper
/// announced again) takes no lease: a lapsed owner's lease stays for the sweeper to
/// find (released, the request would sit `executing` with no owner), and an ended
/// request keeps its epoch and claim time.
#[tokio::test]
async fn a_request_that_is_not_queued_is_never_claimed() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let _services = ServiceLock::shared().await;
    let leases = leases(&pool, Duration::from_secs(30)).await;
    let (_, request) = testing::insert_request(&pool).await;
    let lease = leases
        .claim(request, "owner")
        .await
        .expect("claim")
        .expect("free");
    let row = |pool: PgPool| async move {
        sqlx::query_as::<_, (i64, Option<String>, Option<chrono::DateTime<chrono::Utc>>)>(
            "SELECT lease_epoch, lease_owner, claimed_at FROM execution_requests WHERE id = $1",
        )
        .bind(request)
        .fetch_one(&pool)
        .await
        .expect("row")
    };
    // The owner started it, then died: its lease lapsed.
    sqlx::query(
        "UPDATE execution_requests
            SET state = 'executing', lease_deadline = clock_timestamp() - interval '1 second'
          WHERE id = $1",
    )
    .bind(request)
    .execute(&pool)
    .await
    .expect("lapse");
    let before = row(pool.clone()).await;
    assert!(
        leases
            .claim(request, "stale")
            .await
            .expect("claim")
            .is_none(),
        "an executing request is never claimed by a delivery"
    );
    assert_eq!(row(pool.clone()).await, before);
    assert_eq!(before.0, lease.epoch);
    assert_eq!(before.1.as_deref(), Some("owner"));

    // Ended and released: a late duplicate claims nothing either.
    sqlx::query(
        "UPDATE execution_requests
            SET state = 'completed', lease_owner = NULL, lease_deadline = NULL
          WHERE id = $1",
    )
    .bind(request)
    .execute(&pool)
    .await
    .expect("complete");
    let ended = row(pool.clone()).await;
    assert!(leases
        .claim(request, "late")
        .await
        .expect("claim")
        .is_none());
    assert_eq!(row(pool.clone()).await, ended);
}

/// The fence is checked in the BEGIN's round trip: a refusal must leave the connection
/// idle for its next user (not in an aborted transaction), and a pass must hold the row
/// lock until the commit, so that a claimant waits for everything the writer commits.
#[tokio::test]
async fn a_fenced_begin_holds_the_row_and_a_refusal_leaves_its_connection_clean() {
    let db = TestDb::new().await;
    let _services = ServiceLock::shared().await;
    // One connection: whatever a refusal leaves on it, the next transaction meets.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .expect("pool");
    let leases = leases(&db.pool, Duration::from_secs(30)).await;
    let backend = || async {
        sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .expect("backend")
    };
    let session = backend().await;
    for owner in ["worker-a", "o'brien; drop table x"] {
        let (_, request) = testing::insert_request(&db.pool).await;
        let held = leases
            .claim(request, owner)
            .await
            .expect("claim")
            .expect("free");
        let stale = Lease {
            epoch: held.epoch - 1,
            ..held.clone()
        };
        let other = Lease {
            owner: "someone-else".into(),
            ..held.clone()
        };
        let missing = Lease {
            request_id: uuid::Uuid::new_v4(),
            ..held.clone()
        };
        for (lease, refused) in [
            (&stale, "stale"),
            (&other, "expired"),
            (&missing, "missing"),
        ] {
            let got = fenced_write(&pool, lease, refused).await;
            let kind = match got {
                Err(LeaseError::StaleOwner { current_epoch, .. }) => {
                    assert_eq!(current_epoch, held.epoch);
                    "stale"
                }
                Err(LeaseError::Expired { .. }) => "expired",
                Err(LeaseError::NotFound(_)) => "missing",
                other => panic!("{refused} lease of {owner:?} must be refused, got {other:?}"),
            };
            assert_eq!(kind, refused, "owner {owner:?}");
        }
        fenced_write(&pool, &held, owner)
            .await
            .expect("the holder writes on the same connection after three refusals");
        assert_eq!(
            backend().await,
            session,
            "the refused session was kept, not replaced"
        );

        let tx = held.begin_fenced(&pool).await.expect("fenced begin");
        let locked: bool = sqlx::query_scalar(
            "SELECT NOT EXISTS (SELECT 1 FROM execution_requests WHERE id = $1 FOR UPDATE SKIP LOCKED)",
        )
        .bind(request)
        .fetch_one(&db.pool)
        .await
        .expect("probe the row lock");
        assert!(locked, "the fenced transaction holds the request's row");
        tx.rollback().await.expect("rollback");
    }
    assert_eq!(
        committed_notes(&db.pool).await,
        ["worker-a", "o'brien; drop table x"]
    );
}

/// A database fault in the fenced begin (here: the check cannot run at all) is the
/// database's error, retried within the lease as a fault, never taken for a lost lease.
#[tokio::test]
async fn a_fenced_begin_that_cannot_check_is_a_database_error_not_fencing() {
    let db = TestDb::new().await;
    let _services = ServiceLock::shared().await;
    let leases = leases(&db.pool, Duration::from_secs(30)).await;
    let (_, request) = testing::insert_request(&db.pool).await;
    let plain = leases
        .claim(request, "worker-a")
        .await
        .expect("claim")
        .expect("free");
    // The other path: an owner written as a parameter, not into the query's text.
    let quoted = Lease {
        owner: "o'brien".into(),
        ..plain.clone()
    };
    let held = [plain, quoted];
    sqlx::query("DROP FUNCTION cairn_fence")
        .execute(&db.pool)
        .await
        .expect("drop the check");
    for lease in &held {
        match lease.begin_fenced(&db.pool).await {
            Err(LeaseError::Db(_)) => {}
            other => panic!("owner {:?}: a database error, got {other:?}", lease.owner),
        }
    }
}
