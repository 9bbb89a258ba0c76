//! The outbox and its relay against the real PostgreSQL and RabbitMQ.

use cairn_common::health::AmqpStatus;
use cairn_common::metrics::OutboxMetrics;
use cairn_common::outbox::{self, Relay};
use cairn_common::queue::{self, JobQueue, Topology};
use cairn_common::testing::{self, ServiceLock, TestDb};
use futures::StreamExt;
use lapin::options::{BasicGetOptions, BasicNackOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection};
use serde_json::json;
use sqlx::PgPool;
use std::collections::HashSet;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

struct Broker {
    connection: Connection,
    channel: Channel,
    topology: Topology,
}

impl Broker {
    async fn new(label: &str, delivery_limit: u32) -> Broker {
        let connection = queue::connect(&testing::amqp_url()).await.expect("connect");
        let channel = connection.create_channel().await.expect("channel");
        let topology = Topology::new(&testing::unique_prefix(label), delivery_limit);
        topology.declare(&channel).await.expect("declare");
        Broker {
            connection,
            channel,
            topology,
        }
    }

    async fn cleanup(self) {
        let channel = match self.channel.status().connected() {
            true => self.channel,
            false => {
                let connection = queue::connect(&testing::amqp_url())
                    .await
                    .expect("reconnect");
                connection.create_channel().await.expect("channel")
            }
        };
        let _ = self.topology.delete(&channel).await;
        let _ = self.connection.close(200, "done".into()).await;
    }

    fn relay(&self, pool: &PgPool) -> Relay {
        Relay::new(
            pool.clone(),
            &testing::amqp_url(),
            self.topology.clone(),
            OutboxMetrics::default(),
            AmqpStatus::default(),
        )
    }
}

async fn enqueue(pool: &PgPool, routing_key: &str, n: usize) -> Vec<uuid::Uuid> {
    let mut ids = Vec::new();
    let mut tx = pool.begin().await.expect("begin");
    for i in 0..n {
        ids.push(
            outbox::enqueue(&mut tx, routing_key, &json!({"n": i}))
                .await
                .expect("enqueue"),
        );
    }
    tx.commit().await.expect("commit");
    ids
}

async fn published(pool: &PgPool, id: uuid::Uuid) -> bool {
    sqlx::query_scalar("SELECT published_at IS NOT NULL FROM outbox WHERE message_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("read outbox")
}

#[tokio::test]
async fn an_outbox_row_commits_or_rolls_back_with_its_state() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let (run_id, _) = testing::insert_request(&pool).await;
    // The admission's own announcement.
    let admitted = outbox::pending(&pool).await.expect("pending");
    assert_eq!(admitted, 1);
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("UPDATE runs SET state = 'cancelled' WHERE id = $1")
        .bind(run_id)
        .execute(&mut *tx)
        .await
        .expect("update");
    outbox::enqueue(&mut tx, "runs", &json!({"run": run_id}))
        .await
        .expect("enqueue");
    tx.rollback().await.expect("rollback");
    assert_eq!(outbox::pending(&pool).await.expect("pending"), admitted);

    enqueue(&pool, "runs", 1).await;
    assert_eq!(outbox::pending(&pool).await.expect("pending"), admitted + 1);
}

/// Rows are marked published only once the broker confirmed them: a nacked or
/// unroutable message stays pending and goes out on a later batch.
#[tokio::test]
async fn only_confirmed_messages_are_marked_published() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let _services = ServiceLock::shared().await;
    let broker = Broker::new("confirm", 5).await;
    // A queue that holds one message and makes the broker nack the next publish.
    let full_queue = format!("{}full", broker.topology.exchange());
    let mut args = FieldTable::default();
    args.insert(ShortString::from("x-max-length"), AMQPValue::LongLongInt(1));
    args.insert(
        ShortString::from("x-overflow"),
        AMQPValue::LongString("reject-publish".into()),
    );
    broker
        .channel
        .queue_declare(
            full_queue.as_str().into(),
            QueueDeclareOptions::default(),
            args,
        )
        .await
        .expect("declare full queue");
    broker
        .channel
        .queue_bind(
            full_queue.as_str().into(),
            broker.topology.exchange().as_str().into(),
            "full".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");

    let relay = broker.relay(&pool).with_batch_size(1);
    let connection = queue::connect(&testing::amqp_url()).await.expect("connect");
    let channel = relay.open_channel(&connection).await.expect("channel");

    let fits = enqueue(&pool, "full", 1).await[0];
    assert_eq!(relay.publish_batch(&channel).await.expect("batch"), 1);
    assert!(published(&pool, fits).await);

    let nacked = enqueue(&pool, "full", 1).await[0];
    assert_eq!(
        relay.publish_batch(&channel).await.expect("batch"),
        0,
        "broker nacked it"
    );
    assert!(
        !published(&pool, nacked).await,
        "a nacked message stays pending"
    );

    // Make room: the same row goes out on the next batch.
    let got = broker
        .channel
        .basic_get(full_queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .expect("get");
    assert!(got.is_some());
    assert_eq!(relay.publish_batch(&channel).await.expect("batch"), 1);
    assert!(published(&pool, nacked).await);

    // Unroutable: confirmed by the exchange but returned, so not published.
    let unroutable = enqueue(&pool, "nowhere", 1).await[0];
    assert_eq!(relay.publish_batch(&channel).await.expect("batch"), 0);
    assert!(
        !published(&pool, unroutable).await,
        "a returned message stays pending"
    );

    let _ = broker
        .channel
        .queue_delete(full_queue.as_str().into(), Default::default())
        .await;
    let _ = connection.close(200, "done".into()).await;
    broker.cleanup().await;
}

/// The relay keeps running across `rabbitmqctl stop_app` / `start_app` and every
/// admitted message reaches the queue (duplicates allowed).
#[tokio::test]
async fn the_relay_loses_nothing_across_a_broker_restart() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let _services = ServiceLock::exclusive().await;
    let broker = Broker::new("restart", 5).await;
    let shutdown = CancellationToken::new();
    let relay = broker
        .relay(&pool)
        .with_batch_size(20)
        .with_poll_interval(Duration::from_millis(50));
    let relay_task = tokio::spawn(relay.run(shutdown.clone()));

    let mut expected = HashSet::new();
    for round in 0..30 {
        expected.extend(enqueue(&pool, JobQueue::Runs.routing_key(), 10).await);
        if round == 10 {
            tokio::task::spawn_blocking(|| testing::rabbitmqctl(&["stop_app"]))
                .await
                .expect("stop_app");
        }
        if round == 20 {
            tokio::task::spawn_blocking(|| {
                testing::rabbitmqctl(&["start_app"]);
                testing::rabbitmqctl(&["await_startup"]);
            })
            .await
            .expect("start_app");
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let drained = testing::eventually(Duration::from_secs(60), || async {
        (outbox::pending(&pool).await.ok()? == 0).then_some(())
    })
    .await;
    assert!(
        drained.is_some(),
        "the relay published everything after the restart"
    );
    shutdown.cancel();
    relay_task.await.expect("relay task");

    let connection = queue::connect(&testing::amqp_url()).await.expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    let mut seen = HashSet::new();
    while let Some(message) = channel
        .basic_get(
            broker.topology.queue(JobQueue::Runs).as_str().into(),
            BasicGetOptions { no_ack: true },
        )
        .await
        .expect("get")
    {
        let id = message
            .delivery
            .properties
            .message_id()
            .clone()
            .expect("message id");
        seen.insert(uuid::Uuid::parse_str(id.as_str()).expect("uuid"));
    }
    let missing: Vec<_> = expected.difference(&seen).collect();
    assert!(
        missing.is_empty(),
        "{} admitted messages lost: {missing:?}",
        missing.len()
    );
    let _ = connection.close(200, "done".into()).await;
    broker.cleanup().await;
}

/// A message that keeps failing is dead-lettered after the queue's delivery limit.
#[tokio::test]
async fn a_poison_message_lands_in_the_dead_letter_queue() {
    let _services = ServiceLock::shared().await;
    let broker = Broker::new("poison", 2).await;
    let publisher = broker.connection.create_channel().await.expect("channel");
    publisher
        .basic_publish(
            broker.topology.exchange().as_str().into(),
            JobQueue::Runs.routing_key().into(),
            Default::default(),
            b"{\"poison\":true}",
            lapin::BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");

    let consumer_channel = broker.connection.create_channel().await.expect("channel");
    let mut consumer = queue::consume(
        &consumer_channel,
        &broker.topology.queue(JobQueue::Runs),
        "poison-test",
        1,
    )
    .await
    .expect("consume");
    let mut deliveries = 0;
    let dead = loop {
        if let Some(dead) = broker
            .channel
            .basic_get(
                broker.topology.dead_queue().as_str().into(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .expect("get dead")
        {
            break dead;
        }
        match tokio::time::timeout(Duration::from_millis(500), consumer.next()).await {
            Ok(Some(Ok(delivery))) => {
                deliveries += 1;
                delivery
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    })
                    .await
                    .expect("nack");
            }
            Ok(other) => panic!("consumer ended: {other:?}"),
            Err(_) => {}
        }
        assert!(
            deliveries <= 10,
            "never dead-lettered after {deliveries} deliveries"
        );
    };
    assert_eq!(dead.delivery.data, b"{\"poison\":true}");
    assert!(
        deliveries >= 2,
        "delivered up to the limit first ({deliveries})"
    );
    broker.cleanup().await;
}
