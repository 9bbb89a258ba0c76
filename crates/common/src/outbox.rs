//! The transactional outbox.
//!
//! State changes that must be announced write an outbox row in the same transaction
//! ([`enqueue`]), so a message exists if and only if the state it announces committed.
//! The [`Relay`] publishes pending rows in batches on a confirm-mode channel and marks a
//! row published only after the broker confirmed it (and did not return it as
//! unroutable). A crash or broker restart between publish and mark re-publishes the row:
//! delivery is at least once, and consumers make duplicates harmless.

use crate::health::AmqpStatus;
use crate::metrics::OutboxMetrics;
use crate::queue::{self, JobQueue, QueueError, Topology};
use crate::run::{JobKind, JobMessage};
use backon::{BackoffBuilder, ExponentialBuilder};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Connection};
use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The PostgreSQL notification channel the outbox trigger signals on.
pub const NOTIFY_CHANNEL: &str = "cairn_outbox";

#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("RabbitMQ error: {0}")]
    Amqp(#[from] lapin::Error),
    #[error("payload could not be encoded: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Writes a message to the outbox inside the caller's transaction. Returns its id,
/// which travels as the AMQP `message_id`.
pub async fn enqueue(
    conn: &mut PgConnection,
    routing_key: &str,
    payload: &serde_json::Value,
) -> Result<Uuid, sqlx::Error> {
    let message_id = Uuid::new_v4();
    sqlx::query("INSERT INTO outbox (message_id, routing_key, payload) VALUES ($1, $2, $3)")
        .bind(message_id)
        .bind(routing_key)
        .bind(payload)
        .execute(conn)
        .await?;
    Ok(message_id)
}

/// Announces work, in the caller's transaction: the message goes to the queue its kind
/// is for, stamped with the tenant of its run or sandbox as the database has it. A
/// message that cannot be encoded, or whose run or sandbox is not there, is an error
/// (nothing is announced).
pub async fn announce(conn: &mut PgConnection, message: &JobMessage) -> Result<Uuid, sqlx::Error> {
    announce_many(conn, message.kind, std::slice::from_ref(message))
        .await
        .map(|ids| ids[0])
}

/// Announces many messages of one kind at once (a batch admission), each stamped with
/// its tenant.
pub async fn announce_many(
    conn: &mut PgConnection,
    kind: JobKind,
    messages: &[JobMessage],
) -> Result<Vec<Uuid>, sqlx::Error> {
    let payloads = messages
        .iter()
        .map(|m| {
            if m.kind != kind {
                return Err(sqlx::Error::Protocol(format!(
                    "a {:?} message among {kind:?} messages",
                    m.kind
                )));
            }
            let unstamped = JobMessage {
                tenant: None,
                ..m.clone()
            };
            serde_json::to_value(unstamped).map_err(|e| sqlx::Error::Encode(Box::new(e)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let owners: Vec<Uuid> = messages.iter().map(|m| m.run_id).collect();
    let ids: Vec<Uuid> = messages.iter().map(|_| Uuid::new_v4()).collect();
    // A sandbox placement names the sandbox as its run.
    let table = if kind == JobKind::Sandbox {
        "sandboxes"
    } else {
        "runs"
    };
    let written = sqlx::query(&format!(
        "INSERT INTO outbox (message_id, routing_key, payload)
         SELECT t.id, $2, t.payload || jsonb_build_object('tenant', o.tenant_id)
           FROM UNNEST($1::uuid[], $3::jsonb[], $4::uuid[]) WITH ORDINALITY AS t(id, payload, owner, n)
           JOIN {table} o ON o.id = t.owner
          ORDER BY t.n"
    ))
    .bind(&ids)
    .bind(JobQueue::of(kind).routing_key())
    .bind(&payloads)
    .bind(&owners)
    .execute(conn)
    .await?;
    if written.rows_affected() != messages.len() as u64 {
        return Err(sqlx::Error::Protocol(format!(
            "an announcement whose {table} row is not there"
        )));
    }
    Ok(ids)
}

pub async fn pending(pool: &PgPool) -> Result<i64, sqlx::Error> {
    let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        .fetch_one(pool)
        .await?;
    Ok(count)
}

#[derive(sqlx::FromRow)]
struct PendingRow {
    id: i64,
    message_id: Uuid,
    routing_key: String,
    payload: serde_json::Value,
}

/// Publishes the outbox to RabbitMQ.
#[derive(Clone)]
pub struct Relay {
    pool: PgPool,
    amqp_url: String,
    topology: Topology,
    batch_size: i64,
    poll_interval: Duration,
    metrics: OutboxMetrics,
    status: AmqpStatus,
}

impl Relay {
    pub fn new(
        pool: PgPool,
        amqp_url: &str,
        topology: Topology,
        metrics: OutboxMetrics,
        status: AmqpStatus,
    ) -> Self {
        Relay {
            pool,
            amqp_url: amqp_url.to_string(),
            topology,
            batch_size: 500,
            poll_interval: Duration::from_millis(500),
            metrics,
            status,
        }
    }

    pub fn with_batch_size(mut self, batch_size: i64) -> Self {
        self.batch_size = batch_size.max(1);
        self
    }

    pub fn with_poll_interval(mut self, poll_interval: Duration) -> Self {
        self.poll_interval = poll_interval;
        self
    }

    /// Opens a confirm-mode channel with the topology declared.
    pub async fn open_channel(&self, connection: &Connection) -> Result<Channel, OutboxError> {
        let channel = connection.create_channel().await?;
        self.topology.declare(&channel).await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(channel)
    }

    /// Publishes one batch of pending rows and marks the confirmed ones. Returns how
    /// many were confirmed. Rows stay pending on nack, return, or a lost channel.
    pub async fn publish_batch(&self, channel: &Channel) -> Result<usize, OutboxError> {
        let mut tx = self.pool.begin().await?;
        // SKIP LOCKED lets several scheduler replicas relay side by side.
        let rows: Vec<PendingRow> = sqlx::query_as(
            "SELECT id, message_id, routing_key, payload FROM outbox
              WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(self.batch_size)
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(0);
        }
        let exchange = self.topology.exchange();
        let mut confirms = Vec::with_capacity(rows.len());
        for row in &rows {
            let body = serde_json::to_vec(&row.payload)?;
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into())
                .with_message_id(row.message_id.simple().to_string().as_str().into());
            let confirm = channel
                .basic_publish(
                    exchange.as_str().into(),
                    row.routing_key.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    &body,
                    properties,
                )
                .await?;
            confirms.push((row.id, confirm));
        }
        let mut confirmed = Vec::with_capacity(rows.len());
        let mut failed = Vec::new();
        for (id, confirm) in confirms {
            let confirmation = confirm.await?;
            // A returned message was acked by the exchange but reached no queue.
            if confirmation.is_ack() && confirmation.take_message().is_none() {
                confirmed.push(id);
            } else {
                failed.push(id);
            }
        }
        sqlx::query(
            "UPDATE outbox SET published_at = now(), attempts = attempts + 1 WHERE id = ANY($1)",
        )
        .bind(&confirmed)
        .execute(&mut *tx)
        .await?;
        if !failed.is_empty() {
            sqlx::query(
                "UPDATE outbox SET attempts = attempts + 1,
                        last_error = 'not confirmed by the broker (nack or unroutable)'
                  WHERE id = ANY($1)",
            )
            .bind(&failed)
            .execute(&mut *tx)
            .await?;
            self.metrics.publish_failures.inc_by(failed.len() as u64);
            tracing::warn!(
                count = failed.len(),
                "outbox messages not confirmed; will retry"
            );
        }
        tx.commit().await?;
        self.metrics.published.inc_by(confirmed.len() as u64);
        self.metrics.batches.inc();
        Ok(confirmed.len())
    }

    /// Relays until `shutdown` is cancelled, reconnecting to RabbitMQ with backoff.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut listener = match PgListener::connect_with(&self.pool).await {
            Ok(mut listener) => match listener.listen(NOTIFY_CHANNEL).await {
                Ok(()) => Some(listener),
                Err(e) => {
                    tracing::warn!(error = %e, "outbox notifications unavailable; polling");
                    None
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "outbox notifications unavailable; polling");
                None
            }
        };
        let mut backoff = reconnect_backoff();
        let mut link: Option<(Connection, Channel)> = None;
        while !shutdown.is_cancelled() {
            let channel = match &link {
                Some((connection, channel))
                    if connection.status().connected() && channel.status().connected() =>
                {
                    channel.clone()
                }
                _ => {
                    self.status.set(false);
                    link = None;
                    match self.connect().await {
                        Ok(pair) => {
                            self.status.set(true);
                            backoff = reconnect_backoff();
                            let channel = pair.1.clone();
                            link = Some(pair);
                            channel
                        }
                        Err(e) => {
                            let wait = backoff.next().unwrap_or(Duration::from_secs(5));
                            tracing::warn!(error = %e, ?wait, "outbox relay cannot reach RabbitMQ");
                            sleep_or_cancel(wait, &shutdown).await;
                            continue;
                        }
                    }
                }
            };
            match self.publish_batch(&channel).await {
                Ok(n) if n as i64 >= self.batch_size => continue,
                Ok(_) => self.wait_for_work(&mut listener, &shutdown).await,
                Err(e) => {
                    tracing::warn!(error = %e, "outbox batch not published; retrying");
                    if matches!(e, OutboxError::Amqp(_) | OutboxError::Queue(_)) {
                        link = None;
                    }
                    let wait = backoff.next().unwrap_or(Duration::from_secs(5));
                    sleep_or_cancel(wait, &shutdown).await;
                }
            }
        }
        if let Some((connection, _)) = link {
            let _ = connection.close(200, "shutdown".into()).await;
        }
        self.status.set(false);
    }

    async fn connect(&self) -> Result<(Connection, Channel), OutboxError> {
        let connection = queue::connect_once(&self.amqp_url).await?;
        let channel = self.open_channel(&connection).await?;
        Ok((connection, channel))
    }

    async fn wait_for_work(&self, listener: &mut Option<PgListener>, shutdown: &CancellationToken) {
        let poll = tokio::time::sleep(self.poll_interval);
        match listener {
            Some(l) => {
                tokio::select! {
                    _ = poll => {}
                    _ = shutdown.cancelled() => {}
                    notified = l.recv() => {
                        if let Err(e) = notified {
                            tracing::debug!(error = %e, "outbox listener reconnecting");
                        }
                    }
                }
            }
            None => {
                tokio::select! {
                    _ = poll => {}
                    _ = shutdown.cancelled() => {}
                }
            }
        }
    }
}

fn reconnect_backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .without_max_times()
        .build()
}

async fn sleep_or_cancel(wait: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(wait) => {}
        _ = shutdown.cancelled() => {}
    }
}
