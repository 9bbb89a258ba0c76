//! A job's durable writes through database faults. A lost connection or a restart is
//! transient (invariant 11): the write is tried again within the lease instead of the
//! job giving up and leaving its request to a person. Its commit may have landed before
//! the connection broke, so what it wrote is read back before each retry.

use super::handle::{Job, JobOutcome};
use crate::error::JobError;
use crate::keeper::Reason;
use cairn_common::request::{self, RequestState};
use cairn_common::retry::{self, Delays};
use std::future::Future;
use std::time::Duration;

/// Runs `write` until it lands, through database faults, for up to one lease TTL
/// unless the keeper fenced the job meanwhile: [`retry::until_landed`]. After a fault,
/// `landed` reads back whether it did (`Some` with its result); the write is tried again
/// only once it reads back as not landed. A lost lease refuses the fenced begin, so a
/// retry never writes for a stale owner.
pub async fn until_landed<T, W, WF, L, LF>(
    job: &Job,
    what: &str,
    write: W,
    landed: L,
) -> Result<T, JobError>
where
    W: FnMut() -> WF,
    WF: Future<Output = Result<T, JobError>>,
    L: FnMut() -> LF,
    LF: Future<Output = Result<Option<T>, JobError>>,
{
    let transient = |e: &JobError| matches!(e, JobError::Db(_));
    let fenced = || job.cause() == Some(Reason::Fenced);
    let delays = within_the_lease(job);
    retry::until_landed(delays, what, (transient, fenced), write, landed).await
}

/// The read-back of a write that releases or moves the lease (every way a job ends):
/// once the lease is no longer this job's, the write landed. Another owner can only
/// have taken it after the lease lapsed, and then nothing more is this job's to write.
pub async fn released(job: &Job) -> Result<Option<()>, JobError> {
    let held = job.lease().still_held(&job.worker.pool).await?;
    Ok((!held).then_some(()))
}

/// The read-back of an ending that releases or moves the lease: once it landed, the
/// outcome is what the request's committed state says.
pub async fn ended(job: &Job) -> Result<Option<JobOutcome>, JobError> {
    if released(job).await?.is_none() {
        return Ok(None);
    }
    let mut conn = job.worker.pool.acquire().await?;
    let (state, reason) = match request::state_of(&mut conn, job.request_id()).await? {
        Some((state, reason)) => (state, reason.unwrap_or_default()),
        None => return Ok(Some(JobOutcome::Fenced)),
    };
    Ok(Some(match state {
        RequestState::Completed => JobOutcome::Completed,
        RequestState::AwaitingVerification => JobOutcome::AwaitingVerification,
        RequestState::NeedsReconciliation => JobOutcome::NeedsReconciliation(reason),
        RequestState::StoppedAtCheckpoint => JobOutcome::StoppedAtCheckpoint,
        RequestState::Cancelled => JobOutcome::Cancelled,
        RequestState::Failed => JobOutcome::Failed(reason),
        RequestState::Queued => JobOutcome::HandedBack,
        // Another owner holds it: nothing more is this job's.
        RequestState::Executing => JobOutcome::Fenced,
    }))
}

/// The delays between retries of a durable write: growing, for up to one lease TTL.
pub fn within_the_lease(job: &Job) -> Delays {
    let (min, max) = (Duration::from_millis(100), Duration::from_secs(2));
    Delays::within(min, max, job.worker.leases.ttl())
}
