//! What only this worker may do for volumes on its disk: place the sandboxes that
//! attach them (found in the database, never on the shared queue: another worker could
//! not mount them) in its sandbox slots, and remove the data of volumes deleted.

use super::{claim, host, HostError, Placement};
use crate::context::Worker;
use cairn_common::sandbox::volume;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often the database is asked: a resume of such a sandbox waits at most this long
/// for its worker to notice it.
const EVERY: Duration = Duration::from_millis(500);

/// Places and deletes until `stop`; hosted sandboxes take a slot of `slots` (the sandbox
/// consumer's) and stop early on `drain`.
pub async fn run(
    worker: Arc<Worker>,
    slots: Arc<Semaphore>,
    jobs: TaskTracker,
    stop: CancellationToken,
    drain: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = stop.cancelled() => return,
        }
        if let Err(e) = remove_deleted(&worker).await {
            tracing::warn!(error = %e, "removing deleted volumes failed; trying again");
        }
        if let Err(e) = place(&worker, &slots, &jobs, &stop, &drain).await {
            tracing::warn!(error = %e, "placing sandboxes with volumes here failed; trying again");
        }
    }
}

async fn place(
    worker: &Arc<Worker>,
    slots: &Arc<Semaphore>,
    jobs: &TaskTracker,
    stop: &CancellationToken,
    drain: &CancellationToken,
) -> Result<(), HostError> {
    let directory = worker.custody.directory.id;
    let waiting = volume::waiting(&mut *worker.pool.acquire().await?, directory).await?;
    for (id, tenant) in waiting {
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            return Ok(());
        };
        match claim(worker, id, &tenant).await? {
            Placement::Dropped(why) => {
                tracing::debug!(sandbox_id = %id.simple(), why, "placement dropped")
            }
            Placement::Host(claimed) => {
                let (lease, row) = *claimed;
                let (worker, stop, drain) = (worker.clone(), stop.clone(), drain.clone());
                jobs.spawn(async move {
                    // The slot is the sandbox's until it leaves this worker.
                    let _permit = permit;
                    host(worker, lease, row, stop, drain).await;
                });
            }
        }
    }
    Ok(())
}

async fn remove_deleted(worker: &Worker) -> Result<(), HostError> {
    let directory = worker.custody.directory.id;
    let mut conn = worker.pool.acquire().await?;
    for id in volume::deleting(&mut conn, directory).await? {
        let disk = worker.custody.disk.clone();
        tokio::task::spawn_blocking(move || disk.remove_volume(id))
            .await
            .map_err(|e| HostError::Transient(e.to_string()))?
            .map_err(|e| HostError::Transient(format!("removing volume {}: {e}", id.simple())))?;
        volume::removed(&mut conn, id).await?;
        tracing::info!(volume_id = %id.simple(), "volume deleted");
    }
    Ok(())
}
