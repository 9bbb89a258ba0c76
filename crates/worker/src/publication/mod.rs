//! Publishing a completed run: its final tree (the snapshot its last receipt stands on)
//! against the tree it started from (a fresh clone of its repository at its ref, or the
//! empty tree), as a patch in the artifact store, with a delivery receipt. Nothing of
//! the run runs again: the trees are restored and compared by the worker, and the
//! patch is written by Cairn, not by a program of the run's.
//!
//! The holds ([`publication::holds`]) are checked when the job starts and again in the
//! transaction that records the delivery: a delivery hold set meanwhile keeps the
//! publication for a person (`needs_reconciliation`, `delivery_held: …`).

mod patch;

use crate::custody::Restore;
use crate::error::JobError;
use crate::job::durable;
use crate::job::ending;
use crate::job::handle::{Job, JobOutcome};
use crate::keeper::Reason;
use crate::workspace::{self, Workspace};
use bytes::Bytes;
use cairn_common::journal;
use cairn_common::publication::{self, Delivered, Hold, Standing, ARTIFACT_PREFIX};
use cairn_common::request::{self, RequestEvent};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use uuid::Uuid;

/// Runs a claimed publication.
pub async fn run(job: &Job) -> Result<JobOutcome, JobError> {
    let mut conn = job.worker.pool.acquire().await?;
    let standing = publication::standing(&mut conn, job.claimed.run_id).await?;
    drop(conn);
    let Some(standing) = standing else {
        return fail(job, "the run is gone").await;
    };
    let holds = publication::holds(&standing);
    if !holds.is_empty() {
        return held(job, &holds).await;
    }
    let made = make(job, &standing).await;
    let (patch, snapshot, base) = match made {
        Ok(made) => made,
        Err(message) => return fail(job, &message).await,
    };
    // Each lease's own key: a stale owner can never overwrite what a receipt names.
    let key = format!(
        "{ARTIFACT_PREFIX}{}-{}.patch",
        job.request_id().simple(),
        job.lease().epoch
    );
    if job.stopped() {
        return stopped(job).await;
    }
    let store = &job.worker.custody.settings.store;
    let bytes = Bytes::from(patch.text.into_bytes());
    let sha256 = hex::encode(Sha256::digest(&bytes));
    if let Err(e) = store.store().put(&key, bytes.clone()).await {
        return fail(job, &format!("the patch could not be stored: {e}")).await;
    }
    let delivered = Delivered {
        artifact_key: &key,
        store_url: store.url(),
        sha256: &sha256,
        bytes: i64::try_from(bytes.len()).unwrap_or(i64::MAX),
        files_changed: i32::try_from(patch.files_changed).unwrap_or(i32::MAX),
        base: &base,
        final_snapshot_id: snapshot,
    };
    let write = || record(job, &delivered);
    durable::until_landed(job, "the delivery", write, || durable::ended(job)).await
}

/// Restores the final tree and prepares the base, then compares them: the patch, the
/// final snapshot and what the base is.
async fn make(job: &Job, s: &Standing) -> Result<(patch::Patch, Uuid, String), String> {
    let (Some(snapshot), Some(store_url)) = (s.final_snapshot, s.final_store_url.as_deref()) else {
        return Err("the run's final tree is not recorded".into());
    };
    let recorded = s.final_manifest_key.as_deref();
    let custody = &job.worker.custody;
    let request = job.request_id();
    let after = Workspace::for_request(&custody.disk, request, custody.run_disk_mb);
    // The base's own directory, next to the final tree's.
    let base_id = Uuid::from_u128(request.as_u128() ^ 1);
    let base = Workspace::for_request(&custody.disk, base_id, custody.run_disk_mb);
    let made = async {
        after.reset().await.map_err(|e| e.to_string())?;
        base.reset().await.map_err(|e| e.to_string())?;
        custody
            .restore_snapshot((snapshot, store_url, recorded), &after)
            .await
            .map_err(|e| match e {
                Restore::Unusable(why) | Restore::Unavailable(why) => {
                    format!("the run's final tree could not be restored: {why}")
                }
            })?;
        workspace::cold(&base, s.repository.as_deref(), base_ref(s))
            .await
            .map_err(|e| format!("the base could not be prepared: {e}"))?;
        // What a capture keeps of the base: the final tree was restored from one.
        let rules = &custody.settings.rules;
        let kept: HashSet<String> = cairn_snapshot::scan(&base.root, rules)
            .await
            .map_err(|e| format!("the base could not be read: {e}"))?
            .paths()
            .map(str::to_string)
            .collect();
        let (base_root, after_root) = (base.root.clone(), after.root.clone());
        tokio::task::spawn_blocking(move || {
            patch::between(&base_root, &after_root, |p| kept.contains(p))
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the trees could not be compared: {e}"))
    }
    .await;
    workspace::remove(&after).await;
    workspace::remove(&base).await;
    let description = match &s.repository {
        Some(repository) => format!("{repository}@{}", base_ref(s).unwrap_or("HEAD")),
        None => "empty".to_string(),
    };
    made.map(|patch| (patch, snapshot, description))
}

/// What the base is checked out at: the commit the run's tree was at when its request
/// last acquired it (so a branch that moved since adds nothing), else the run's ref.
fn base_ref(s: &Standing) -> Option<&str> {
    s.base_commit.as_deref().or(s.git_ref.as_deref())
}

/// The delivery, in one fenced transaction: the holds checked again, then the receipt,
/// its journal entry and the request's completion, and the lease let go.
async fn record(job: &Job, d: &Delivered<'_>) -> Result<JobOutcome, JobError> {
    let mut tx = job.begin().await?;
    publication::lock_for_delivery(&mut tx, job.claimed.run_id).await?;
    let standing = publication::standing(&mut tx, job.claimed.run_id).await?;
    let holds = standing.as_ref().map_or_else(Vec::new, publication::holds);
    if !holds.is_empty() {
        drop(tx);
        return held(job, &holds).await;
    }
    publication::record_delivery(&mut tx, job.request_id(), d).await?;
    journal::entry(
        &mut tx,
        job.lease(),
        "delivery_receipt",
        &json!({
            "artifact_key": d.artifact_key,
            "sha256": d.sha256,
            "bytes": d.bytes,
            "files_changed": d.files_changed,
            "base": d.base,
            "final_snapshot_id": d.final_snapshot_id.simple().to_string(),
            "worker": job.worker.settings.worker_id,
        }),
    )
    .await?;
    request::transition(
        &mut tx,
        job.request_id(),
        RequestEvent::Complete,
        None,
        None,
    )
    .await?;
    job.worker.leases.release_in(&mut tx, job.lease()).await?;
    tx.commit().await?;
    job.worker.leases.clear_liveness(job.lease());
    tracing::info!(
        artifact = d.artifact_key,
        files = d.files_changed,
        "published"
    );
    Ok(JobOutcome::Completed)
}

/// A publication something holds: a person decides.
async fn held(job: &Job, holds: &[Hold]) -> Result<JobOutcome, JobError> {
    let reasons: Vec<String> = holds.iter().map(|h| h.message.clone()).collect();
    let reason = format!("delivery_held: {}", reasons.join("; "));
    ending::finish(job, RequestEvent::Reconcile, Some(&reason), None).await?;
    Ok(JobOutcome::NeedsReconciliation(reason))
}

/// A publication stopped before its delivery: cancelled with its run's cancel never
/// (a publication is not cancelled), drained (queued again), or fenced (nothing
/// written).
async fn stopped(job: &Job) -> Result<JobOutcome, JobError> {
    match job.cause() {
        Some(Reason::Drain) => {
            let mut tx = job.begin().await?;
            request::requeue(&mut tx, job.request_id(), false).await?;
            tx.commit().await?;
            job.worker.leases.clear_liveness(job.lease());
            Ok(JobOutcome::HandedBack)
        }
        _ => {
            job.worker.metrics.self_fenced.inc();
            Ok(JobOutcome::Fenced)
        }
    }
}

async fn fail(job: &Job, message: &str) -> Result<JobOutcome, JobError> {
    let reason = format!("publication_failed: {message}");
    ending::finish(job, RequestEvent::Fail, Some(&reason), None).await?;
    Ok(JobOutcome::Failed(reason))
}
