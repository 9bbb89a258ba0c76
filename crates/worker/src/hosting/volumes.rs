//! What only this worker may do for volumes on its disk: find the sandboxes that
//! attach them (in the database, never on the shared queue: another worker could not
//! mount them) for its sandbox consumer to place, and remove the data of volumes
//! deleted.

use super::HostError;
use crate::context::Worker;
use cairn_common::sandbox::volume;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::Sender;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How often the database is asked: a resume of such a sandbox waits at most this long
/// for its worker to notice it.
const EVERY: Duration = Duration::from_millis(500);

/// Finds and deletes until `stop`; the sandboxes found go to `placements`, which the
/// sandbox consumer takes in its own slots, as it takes deliveries.
pub async fn run(worker: Arc<Worker>, placements: Sender<(Uuid, String)>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = stop.cancelled() => return,
        }
        if let Err(e) = remove_deleted(&worker).await {
            tracing::warn!(error = %e, "removing deleted volumes failed; trying again");
        }
        if let Err(e) = remove_staged(&worker).await {
            tracing::warn!(error = %e, "removing staged fork trees failed; trying again");
        }
        if let Err(e) = find(&worker, &placements).await {
            tracing::warn!(error = %e, "looking for sandboxes with volumes here failed; trying again");
        }
    }
}

/// Hands the consumer the sandboxes waiting for this worker, as many as it has room
/// for (one it takes twice is dropped at its claim: a live worker holds it).
async fn find(worker: &Worker, placements: &Sender<(Uuid, String)>) -> Result<(), HostError> {
    let directory = worker.custody.directory.id;
    let waiting = volume::waiting(&mut *worker.pool.acquire().await?, directory).await?;
    for found in waiting {
        match placements.try_send(found) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Closed(_)) => break,
        }
    }
    Ok(())
}

/// Removes the staged fork trees no fork of their capture waits for any more (a fork
/// handed to every worker may still come back here to start from it). One that cannot
/// be removed is tried again next time; the rest go on.
async fn remove_staged(worker: &Worker) -> Result<(), HostError> {
    let disk = worker.custody.disk.clone();
    let staged = tokio::task::spawn_blocking(move || disk.staged())
        .await
        .map_err(|e| HostError::Transient(e.to_string()))?;
    for id in staged {
        let waited: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sandboxes
                             WHERE source_snapshot_id = $1 AND state = 'creating')",
        )
        .bind(id)
        .fetch_one(&worker.pool)
        .await?;
        if !waited {
            let disk = worker.custody.disk.clone();
            let removed = tokio::task::spawn_blocking(move || disk.remove_staged(id)).await;
            if let Ok(Err(e)) | Err(e) = removed.map_err(std::io::Error::other) {
                tracing::warn!(error = %e, staged = %id.simple(), "a staged tree could not be removed; trying again");
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
