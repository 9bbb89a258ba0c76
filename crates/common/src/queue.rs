//! RabbitMQ topology and connections.
//!
//! Exchange `cairn.jobs` (direct) routes to four durable quorum queues, `cairn.runs`,
//! `cairn.continuations`, `cairn.verifications` and `cairn.sandboxes` (placements), each with a delivery limit past which
//! RabbitMQ dead-letters a message through `cairn.dead` into the queue `cairn.dead`.
//! Every name takes a configurable prefix so installations and tests isolate themselves.

use crate::run::JobKind;
use backon::{ExponentialBuilder, Retryable};
use lapin::options::{
    BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, Consumer, ExchangeKind};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("invalid AMQP URL: {0}")]
    InvalidUrl(String),
    #[error("RabbitMQ error: {0}")]
    Amqp(#[from] lapin::Error),
}

/// The kinds of job queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobQueue {
    Runs,
    Continuations,
    Verifications,
    Sandboxes,
}

impl JobQueue {
    pub const ALL: [JobQueue; 4] = [
        JobQueue::Runs,
        JobQueue::Continuations,
        JobQueue::Verifications,
        JobQueue::Sandboxes,
    ];

    /// The queues of jobs, which take a worker's job slots.
    pub const JOBS: [JobQueue; 3] = [
        JobQueue::Runs,
        JobQueue::Continuations,
        JobQueue::Verifications,
    ];

    /// The queue of sandbox placements, which take a worker's sandbox slots.
    pub const SANDBOXES: [JobQueue; 1] = [JobQueue::Sandboxes];

    /// The queue that carries messages of a kind.
    pub fn of(kind: JobKind) -> JobQueue {
        match kind {
            JobKind::Run => JobQueue::Runs,
            JobKind::CheckpointContinuation | JobKind::FinalOutcomeContinuation => {
                JobQueue::Continuations
            }
            // The stages after a report's acceptance share a queue.
            JobKind::Verification | JobKind::Publication => JobQueue::Verifications,
            JobKind::Sandbox => JobQueue::Sandboxes,
        }
    }

    /// The routing key on `cairn.jobs` that reaches this queue.
    pub fn routing_key(self) -> &'static str {
        match self {
            JobQueue::Runs => "runs",
            JobQueue::Continuations => "continuations",
            JobQueue::Verifications => "verifications",
            JobQueue::Sandboxes => "sandboxes",
        }
    }
}

/// Names and arguments of the declared topology.
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
    delivery_limit: u32,
}

impl Topology {
    pub fn new(prefix: &str, delivery_limit: u32) -> Self {
        Topology {
            prefix: prefix.to_string(),
            delivery_limit,
        }
    }

    pub fn exchange(&self) -> String {
        format!("{}cairn.jobs", self.prefix)
    }

    pub fn dead_exchange(&self) -> String {
        format!("{}cairn.dead", self.prefix)
    }

    pub fn dead_queue(&self) -> String {
        format!("{}cairn.dead", self.prefix)
    }

    pub fn queue(&self, queue: JobQueue) -> String {
        format!("{}cairn.{}", self.prefix, queue.routing_key())
    }

    pub fn delivery_limit(&self) -> u32 {
        self.delivery_limit
    }

    /// Declares exchanges, queues and bindings; idempotent.
    pub async fn declare(&self, channel: &Channel) -> Result<(), QueueError> {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                self.exchange().as_str().into(),
                ExchangeKind::Direct,
                durable,
                FieldTable::default(),
            )
            .await?;
        channel
            .exchange_declare(
                self.dead_exchange().as_str().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await?;
        let queue_options = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .queue_declare(
                self.dead_queue().as_str().into(),
                queue_options,
                quorum_args(None),
            )
            .await?;
        channel
            .queue_bind(
                self.dead_queue().as_str().into(),
                self.dead_exchange().as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        for queue in JobQueue::ALL {
            let mut args = quorum_args(Some(self.delivery_limit));
            args.insert(
                ShortString::from("x-dead-letter-exchange"),
                AMQPValue::LongString(self.dead_exchange().into()),
            );
            channel
                .queue_declare(self.queue(queue).as_str().into(), queue_options, args)
                .await?;
            channel
                .queue_bind(
                    self.queue(queue).as_str().into(),
                    self.exchange().as_str().into(),
                    queue.routing_key().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        Ok(())
    }

    /// Deletes everything [`Topology::declare`] created (tests clean up with this).
    pub async fn delete(&self, channel: &Channel) -> Result<(), QueueError> {
        for queue in JobQueue::ALL {
            channel
                .queue_delete(
                    self.queue(queue).as_str().into(),
                    QueueDeleteOptions::default(),
                )
                .await?;
        }
        channel
            .queue_delete(
                self.dead_queue().as_str().into(),
                QueueDeleteOptions::default(),
            )
            .await?;
        channel
            .exchange_delete(
                self.exchange().as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await?;
        channel
            .exchange_delete(
                self.dead_exchange().as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await?;
        Ok(())
    }
}

fn quorum_args(delivery_limit: Option<u32>) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString("quorum".into()),
    );
    if let Some(limit) = delivery_limit {
        args.insert(
            ShortString::from("x-delivery-limit"),
            AMQPValue::LongLongInt(i64::from(limit)),
        );
    }
    args
}

/// Checks an AMQP URL without connecting.
pub fn validate_url(url: &str) -> Result<(), QueueError> {
    url.parse::<lapin::uri::AMQPUri>()
        .map(|_| ())
        .map_err(QueueError::InvalidUrl)
}

/// Connects once.
pub async fn connect_once(url: &str) -> Result<Connection, QueueError> {
    validate_url(url)?;
    Ok(Connection::connect(url, ConnectionProperties::default()).await?)
}

/// Connects once with an AMQP heartbeat of `seconds`, unless the URL sets one: RabbitMQ
/// drops a peer that stops answering (a stalled process) after about that long, and
/// returns the deliveries it held to their queues.
pub async fn connect_with_heartbeat(url: &str, seconds: u16) -> Result<Connection, QueueError> {
    let mut uri: lapin::uri::AMQPUri = url.parse().map_err(QueueError::InvalidUrl)?;
    uri.query.heartbeat.get_or_insert(seconds);
    Ok(Connection::connect_uri(uri, ConnectionProperties::default()).await?)
}

/// Connects with bounded exponential backoff.
pub async fn connect(url: &str) -> Result<Connection, QueueError> {
    validate_url(url)?;
    let connection = (|| connect_once(url))
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(5))
                .with_max_times(12),
        )
        .when(|e| !matches!(e, QueueError::InvalidUrl(_)))
        .notify(|e, wait| tracing::warn!(error = %e, ?wait, "RabbitMQ not answering, retrying"))
        .await?;
    Ok(connection)
}

/// A manual-ack consumer with a prefetch bound: at most `prefetch` unacked deliveries
/// are in flight on this channel.
pub async fn consume(
    channel: &Channel,
    queue: &str,
    tag: &str,
    prefetch: u16,
) -> Result<Consumer, QueueError> {
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    let consumer = channel
        .basic_consume(
            queue.into(),
            tag.into(),
            BasicConsumeOptions {
                no_ack: false,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok(consumer)
}

/// Keeps a connection to RabbitMQ with the topology declared, reporting its state in
/// `status` for `/readyz`, until `shutdown`; reconnects with backoff when it drops.
pub async fn maintain(
    url: &str,
    topology: &Topology,
    status: &crate::health::AmqpStatus,
    shutdown: &tokio_util::sync::CancellationToken,
) {
    use backon::BackoffBuilder;
    let mut backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(5))
        .without_max_times()
        .build();
    while !shutdown.is_cancelled() {
        let attempt = async {
            let connection = connect_once(url).await?;
            let channel = connection.create_channel().await?;
            topology.declare(&channel).await?;
            Ok::<_, QueueError>(connection)
        };
        match attempt.await {
            Ok(connection) => {
                status.set(true);
                tracing::info!("connected to RabbitMQ");
                while connection.status().connected() && !shutdown.is_cancelled() {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                        _ = shutdown.cancelled() => {}
                    }
                }
                status.set(false);
                if shutdown.is_cancelled() {
                    let _ = connection.close(200, "shutdown".into()).await;
                    return;
                }
                tracing::warn!("lost the RabbitMQ connection; reconnecting");
            }
            Err(e) => {
                let wait = backoff.next().unwrap_or(Duration::from_secs(5));
                tracing::warn!(error = %e, ?wait, "RabbitMQ not answering, retrying");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled() => {}
                }
            }
        }
    }
}
