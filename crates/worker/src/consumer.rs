//! Consumes a set of queues with slots of its own: a worker has one consumer of
//! `cairn.runs`, `cairn.continuations` and `cairn.verifications` (its job slots) and one
//! of `cairn.sandboxes` (placements, its sandbox slots), so a hosted sandbox never takes
//! a run's slot. At most `concurrency` deliveries of the set run at once, each acked only
//! after its request was claimed durably. Reconnects to RabbitMQ with backoff when the
//! broker goes away.

use crate::context::Worker;
use crate::hosting::{self, Placement};
use crate::job::{self, Claim, JobOutcome};
use cairn_common::health::AmqpStatus;
use cairn_common::queue::{self, JobQueue, Topology};
use cairn_common::retry::Delays;
use cairn_common::run::{JobKind, JobMessage};
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicGetOptions, BasicNackOptions, BasicRejectOptions,
};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Since when the consumer has been waiting, with a free slot, for any delivery: the
/// evidence (reported in each heartbeat) that a request still queued is parked on
/// another worker.
#[derive(Clone, Default)]
pub struct Starving(Arc<Mutex<Option<Instant>>>);

impl Starving {
    /// How long it has been waiting, if it is.
    pub fn waited(&self) -> Option<Duration> {
        self.lock().map(|since| since.elapsed())
    }

    fn set(&self, waiting: bool) {
        let mut since = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *since = waiting.then(Instant::now);
    }

    fn lock(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub struct Consumer {
    pub worker: Arc<Worker>,
    pub amqp_url: String,
    pub topology: Topology,
    /// The queues it takes from ([`JobQueue::JOBS`] or [`JobQueue::SANDBOXES`]).
    pub queues: &'static [JobQueue],
    /// Its slots: deliveries of its queues running at once.
    pub concurrency: usize,
    /// Placements found without the queue (the sandboxes whose volumes are on this
    /// worker's disk, see `hosting::volumes`): taken in the same slots, as deliveries.
    pub local: Option<Local>,
    pub prefetch: u16,
    /// The AMQP heartbeat: a stalled worker's deliveries go back to their queues after
    /// about this long.
    pub heartbeat_seconds: u16,
    pub status: AmqpStatus,
    pub jobs: TaskTracker,
    pub starving: Starving,
}

impl Consumer {
    /// Takes deliveries until `stop_consuming`; running jobs stop early on `drain`.
    pub async fn run(self, stop_consuming: CancellationToken, drain: CancellationToken) {
        let permits = Arc::new(Semaphore::new(self.concurrency));
        let mut backoff = Delays::forever(Duration::from_millis(200), Duration::from_secs(5));
        while !stop_consuming.is_cancelled() {
            match self.session(&permits, &stop_consuming, &drain).await {
                Ok(()) => return,
                Err(e) => {
                    self.status.set(false);
                    tracing::warn!(error = %e, "RabbitMQ consumer stopped; reconnecting");
                    backoff.wait(&stop_consuming).await;
                }
            }
        }
    }

    /// One connection's worth of consuming. `Ok` means stop was requested.
    async fn session(
        &self,
        permits: &Arc<Semaphore>,
        stop: &CancellationToken,
        drain: &CancellationToken,
    ) -> Result<(), String> {
        let (connection, channel) = self.open().await?;
        self.status.set(true);
        tracing::info!(
            concurrency = self.concurrency,
            prefetch = self.prefetch,
            queues = ?self.queues.iter().map(|q| q.routing_key()).collect::<Vec<_>>(),
            "consuming"
        );
        let mut consuming: Option<Consuming> = None;
        // Deliveries a pause kept instead of returning them: they start first.
        let mut held: VecDeque<Delivery> = VecDeque::new();
        let mut next_queue = 0;
        let result = loop {
            let Some(permit) = self
                .slot(permits, (&channel, &mut consuming, &mut held), stop)
                .await
            else {
                break Ok(());
            };
            if let Some(found) = try_local(&self.local) {
                self.start_local(found, permit, stop, drain);
                continue;
            }
            let waiting = match held.pop_front() {
                Some(delivery) => Some(delivery),
                // Out of a pause, a backlog is pulled one message per free slot: pushed
                // deliveries would be returned (and counted) at the next pause.
                None if consuming.is_none() => match self.pull(&channel, &mut next_queue).await {
                    Ok(pulled) => pulled,
                    Err(e) => break Err(e),
                },
                None => None,
            };
            if let Some(delivery) = waiting {
                self.start(delivery, permit, stop, drain);
                continue;
            }
            // Nothing waits: consumers, so that the next message arrives at once.
            let deliveries = match &mut consuming {
                Some(active) => active,
                None => match self.consume(&channel).await {
                    Ok(started) => consuming.insert(started),
                    Err(e) => break Err(e),
                },
            };
            self.starving.set(true);
            let delivery = tokio::select! {
                // A placement only this worker can make first (see `try_local`).
                biased;
                Some(found) = next_local(&self.local) => {
                    self.start_local(found, permit, stop, drain);
                    continue;
                }
                delivery = deliveries.stream.next() => delivery,
                _ = stop.cancelled() => break Ok(()),
            };
            self.starving.set(false);
            match delivery {
                Some(Ok(delivery)) => self.start(delivery, permit, stop, drain),
                Some(Err(e)) => break Err(e.to_string()),
                None => break Err("the broker closed the consumer".into()),
            }
        };
        self.close(connection, channel, consuming, held).await;
        result
    }

    /// Stops taking deliveries; prefetched, unstarted ones (and held ones) return to
    /// their queues when the channel closes. Running jobs acked right after their claim
    /// and need it no more (a job caught between claim and ack is redelivered and found
    /// claimed).
    async fn close(
        &self,
        connection: lapin::Connection,
        channel: lapin::Channel,
        consuming: Option<Consuming>,
        held: VecDeque<Delivery>,
    ) {
        if let Some(active) = consuming {
            active.cancel(&channel).await;
        }
        drop(held);
        self.starving.set(false);
        let _ = connection.close(200, "worker stopping".into()).await;
        self.status.set(false);
    }

    /// A connection and a channel with the topology declared.
    async fn open(&self) -> Result<(lapin::Connection, lapin::Channel), String> {
        let connection = queue::connect_with_heartbeat(&self.amqp_url, self.heartbeat_seconds)
            .await
            .map_err(|e| e.to_string())?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        self.topology
            .declare(&channel)
            .await
            .map_err(|e| e.to_string())?;
        Ok((connection, channel))
    }

    /// Starts a delivery's job in the slot `permit` holds.
    fn start(
        &self,
        delivery: Delivery,
        permit: OwnedSemaphorePermit,
        stop: &CancellationToken,
        drain: &CancellationToken,
    ) {
        let (worker, drain) = (self.worker.clone(), drain.clone());
        self.jobs
            .spawn(process(worker, delivery, permit, stop.clone(), drain));
    }

    /// A free slot first, so a delivery is only taken when it can run at once; `None`
    /// once stopped. With every slot taken the consumers are cancelled: a delivery
    /// RabbitMQ pushed ahead would wait here, where no other worker (a new pod) can
    /// take it, until one of this worker's jobs ended.
    async fn slot(
        &self,
        permits: &Arc<Semaphore>,
        (channel, consuming, held): (
            &lapin::Channel,
            &mut Option<Consuming>,
            &mut VecDeque<Delivery>,
        ),
        stop: &CancellationToken,
    ) -> Option<OwnedSemaphorePermit> {
        match permits.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(TryAcquireError::Closed) => None,
            Err(TryAcquireError::NoPermits) => {
                if let Some(full) = consuming.take() {
                    held.extend(full.pause(channel, self.topology.delivery_limit()).await);
                }
                tokio::select! {
                    permit = permits.clone().acquire_owned() => permit.ok(),
                    _ = stop.cancelled() => None,
                }
            }
        }
    }

    /// Hosts a sandbox placed without the queue in the slot `permit` holds.
    fn start_local(
        &self,
        (sandbox, tenant): (uuid::Uuid, String),
        permit: OwnedSemaphorePermit,
        stop: &CancellationToken,
        drain: &CancellationToken,
    ) {
        self.starving.set(false);
        let (worker, stop, drain) = (self.worker.clone(), stop.clone(), drain.clone());
        self.jobs.spawn(async move {
            let _permit = permit;
            match hosting::claim(&worker, sandbox, &tenant).await {
                Ok(Placement::Host(claimed)) => {
                    let (lease, row) = *claimed;
                    hosting::host(worker, lease, row, stop, drain).await;
                }
                Ok(Placement::Dropped(why)) => {
                    tracing::debug!(sandbox_id = %sandbox.simple(), why, "placement dropped")
                }
                Err(e) => {
                    tracing::warn!(error = %e, sandbox_id = %sandbox.simple(), "placement claim failed; the next look tries again")
                }
            }
        });
    }

    /// Takes one waiting message, trying the queues in turn from `next` (so none waits
    /// behind another's backlog).
    async fn pull(
        &self,
        channel: &lapin::Channel,
        next: &mut usize,
    ) -> Result<Option<Delivery>, String> {
        let queues = self.queues.len();
        for offset in 0..queues {
            let queue = self.queues[(*next + offset) % queues];
            let got = channel
                .basic_get(
                    self.topology.queue(queue).as_str().into(),
                    BasicGetOptions { no_ack: false },
                )
                .await
                .map_err(|e| e.to_string())?;
            if let Some(message) = got {
                *next = (*next + offset + 1) % queues;
                return Ok(Some(message.delivery));
            }
        }
        Ok(None)
    }

    /// Starts one consumer per job queue, each allowed `prefetch` unacked deliveries.
    async fn consume(&self, channel: &lapin::Channel) -> Result<Consuming, String> {
        let mut streams = Vec::with_capacity(self.queues.len());
        let mut tags = Vec::with_capacity(self.queues.len());
        for &queue in self.queues {
            let tag = format!("{}-{}", self.worker.settings.worker_id, queue.routing_key());
            let consumer =
                queue::consume(channel, &self.topology.queue(queue), &tag, self.prefetch)
                    .await
                    .map_err(|e| e.to_string())?;
            streams.push(consumer);
            tags.push(tag);
        }
        Ok(Consuming {
            stream: futures::stream::select_all(streams),
            tags,
        })
    }
}

/// The consumers of one channel, merged.
struct Consuming {
    stream: futures::stream::SelectAll<lapin::Consumer>,
    tags: Vec<String>,
}

/// How long a paused consumer may take to hand back what the broker pushed ahead.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);

impl Consuming {
    async fn cancel(&self, channel: &lapin::Channel) {
        for tag in &self.tags {
            let _ = channel
                .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
                .await;
        }
    }

    /// Cancels the consumers and puts back every delivery they had received and not
    /// handed out, at the head of its queue, for any worker with a free slot. A quorum
    /// queue counts each return against its delivery limit, so one that a return could
    /// dead-letter is kept instead, and returned (to start first when a slot frees).
    /// Each cancelled consumer's stream ends after its last delivery.
    async fn pause(mut self, channel: &lapin::Channel, delivery_limit: u32) -> Vec<Delivery> {
        self.cancel(channel).await;
        let mut kept = Vec::new();
        let requeue = async {
            while let Some(delivery) = self.stream.next().await {
                let Ok(delivery) = delivery else { continue };
                if returns_so_far(&delivery) + 2 >= u64::from(delivery_limit) {
                    kept.push(delivery);
                    continue;
                }
                let _ = delivery
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    })
                    .await;
            }
        };
        if tokio::time::timeout(PAUSE_TIMEOUT, requeue).await.is_err() {
            tracing::warn!(
                "paused consumers did not end; their deliveries return when the channel closes"
            );
        }
        kept
    }
}

/// How often the message was delivered and returned before (`x-delivery-count`, set by
/// a quorum queue on a redelivery).
fn returns_so_far(delivery: &Delivery) -> u64 {
    use lapin::types::AMQPValue;
    let count = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("x-delivery-count"));
    match count {
        Some(AMQPValue::LongLongInt(n)) => u64::try_from(*n).unwrap_or(0),
        Some(AMQPValue::LongInt(n)) => u64::try_from(*n).unwrap_or(0),
        Some(AMQPValue::LongUInt(n)) => u64::from(*n),
        Some(AMQPValue::ShortInt(n)) => u64::try_from(*n).unwrap_or(0),
        Some(AMQPValue::ShortUInt(n)) => u64::from(*n),
        Some(AMQPValue::ShortShortInt(n)) => u64::try_from(*n).unwrap_or(0),
        Some(AMQPValue::ShortShortUInt(n)) => u64::from(*n),
        _ => 0,
    }
}

async fn process(
    worker: Arc<Worker>,
    delivery: Delivery,
    permit: OwnedSemaphorePermit,
    shutdown: CancellationToken,
    drain: CancellationToken,
) {
    let _permit = permit;
    let message: JobMessage = match serde_json::from_slice(&delivery.data) {
        Ok(message) => message,
        Err(e) => {
            tracing::error!(error = %e, "undecodable job message; dead-lettering it");
            let _ = delivery.reject(BasicRejectOptions { requeue: false }).await;
            return;
        }
    };
    if message.kind == JobKind::Sandbox {
        // A running sandbox holds this slot (the permit) until it leaves the worker.
        return place(worker, delivery, message, shutdown, drain).await;
    }
    match job::claim(&worker, &message).await {
        Ok(Claim::Done(outcome)) => {
            if matches!(outcome, JobOutcome::Dropped(_)) {
                worker.metrics.deliveries_dropped.inc();
            }
            tracing::debug!(request_id = %message.request_id.simple(), ?outcome, "delivery handled without running");
            let _ = delivery.ack(BasicAckOptions::default()).await;
        }
        Ok(Claim::Run(claimed)) => {
            // Claimed durably: ack now, so a long job never holds an unacked delivery.
            if let Err(e) = delivery.ack(BasicAckOptions::default()).await {
                tracing::warn!(error = %e, "ack failed after the claim; a redelivery will find the request claimed");
            }
            job::execute(worker.clone(), claimed, drain).await;
        }
        Ok(Claim::Later) => {
            tracing::debug!(request_id = %message.request_id.simple(), "the request is being claimed; the delivery comes back");
            redeliver_after(delivery, Duration::from_millis(200)).await;
        }
        Err(e) => {
            tracing::warn!(error = %e, request_id = %message.request_id.simple(), "claim failed; requeueing the delivery");
            redeliver_after(delivery, Duration::from_millis(500)).await;
        }
    }
}

/// A sandbox placement: claimed under the sandbox's lease, acked, then hosted.
async fn place(
    worker: Arc<Worker>,
    delivery: Delivery,
    message: JobMessage,
    shutdown: CancellationToken,
    drain: CancellationToken,
) {
    let sandbox_id = message.request_id;
    match hosting::claim(&worker, sandbox_id, message.tenant()).await {
        Ok(Placement::Dropped(why)) => {
            tracing::debug!(sandbox_id = %sandbox_id.simple(), why, "placement dropped");
            worker.metrics.deliveries_dropped.inc();
            let _ = delivery.ack(BasicAckOptions::default()).await;
        }
        Ok(Placement::Host(claimed)) => {
            if let Err(e) = delivery.ack(BasicAckOptions::default()).await {
                tracing::warn!(error = %e, "ack failed after the claim; a redelivery will find the sandbox held");
            }
            let (lease, row) = *claimed;
            hosting::host(worker, lease, row, shutdown, drain).await;
        }
        Err(e) => {
            tracing::warn!(error = %e, sandbox_id = %sandbox_id.simple(), "placement claim failed; requeueing the delivery");
            redeliver_after(delivery, Duration::from_millis(500)).await;
        }
    }
}

/// The receiving end of placements found without the queue.
pub type Local = Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<(uuid::Uuid, String)>>>;

/// The next placement found without the queue; never, where there are none.
async fn next_local(local: &Option<Local>) -> Option<(uuid::Uuid, String)> {
    match local {
        Some(local) => local.lock().await.recv().await,
        None => std::future::pending().await,
    }
}

/// A placement found without the queue, if one waits now: a sandbox only this worker
/// can place comes before the queues' backlog, which any worker can take.
fn try_local(local: &Option<Local>) -> Option<(uuid::Uuid, String)> {
    local.as_ref()?.try_lock().ok()?.try_recv().ok()
}

/// Nothing was claimed: RabbitMQ redelivers after `wait` (its delivery limit bounds
/// the loop).
async fn redeliver_after(delivery: Delivery, wait: Duration) {
    tokio::time::sleep(wait).await;
    let _ = delivery
        .nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await;
}
