//! Which queued requests the sweeper announces again as parked on a worker, against
//! the real PostgreSQL.

use cairn_common::heartbeat;
use cairn_common::testing::{self, ServiceLock, TestDb};
use cairn_scheduler::parked;
use std::time::Duration;

/// A backlog waiting while every worker is busy is not parked anywhere: announcing it
/// again would only add a duplicate message per request at each sweep. Once a worker
/// has waited for work, with a free slot, long after the announcement, it is.
#[tokio::test]
async fn only_a_waiting_worker_makes_a_queued_request_parked() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let _services = ServiceLock::shared().await;
    let (_, request) = testing::insert_request(&pool).await;
    publish_announcements(&pool).await;
    sqlx::query(
        "UPDATE execution_requests SET updated_at = clock_timestamp() - interval '10 seconds'
          WHERE id = $1",
    )
    .bind(request)
    .execute(&pool)
    .await
    .expect("announced 10 s ago");

    heartbeat::beat(&pool, "busy-worker", true, None)
        .await
        .expect("beat");
    assert_eq!(
        parked::announce_again(&pool, 100).await.expect("sweep"),
        0,
        "a worker with every slot taken is no evidence that a delivery is parked"
    );

    heartbeat::beat(&pool, "idle-worker", true, Some(Duration::from_secs(5)))
        .await
        .expect("beat");
    assert_eq!(
        parked::announce_again(&pool, 100).await.expect("sweep"),
        1,
        "a worker waiting since well after the announcement got nothing: parked"
    );
}

/// Sends the outbox's pending announcements through the real relay, to a topology of
/// this test's own (deleted after): a request whose announcement is still pending is
/// never taken for parked.
async fn publish_announcements(pool: &sqlx::PgPool) {
    use cairn_common::health::AmqpStatus;
    use cairn_common::metrics::OutboxMetrics;
    use cairn_common::outbox::{self, Relay};
    use cairn_common::queue::{self, Topology};
    let connection = queue::connect(&testing::amqp_url()).await.expect("amqp");
    let topology = Topology::new(&testing::unique_prefix("parked"), 5);
    let relay = Relay::new(
        pool.clone(),
        &testing::amqp_url(),
        topology.clone(),
        OutboxMetrics::default(),
        AmqpStatus::default(),
    );
    let channel = relay.open_channel(&connection).await.expect("channel");
    relay.publish_batch(&channel).await.expect("published");
    assert_eq!(outbox::pending(pool).await.expect("pending"), 0);
    let _ = topology.delete(&channel).await;
    let _ = connection.close(200, "done".into()).await;
}
