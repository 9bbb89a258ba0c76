//! A plan's own writes committed in custody's transactions, one fenced commit instead
//! of two each time:
//!
//! - [`FirstIntent`]: the first step's intent with the tree's record in use, for a
//!   request claimed with an empty journal;
//! - [`WithReceipt`]: the completion and the tree's release with the last step's receipt
//!   and checkpoint.
//!
//! Whatever would make either anything but the plain case (an adopted tree, a pause or
//! a stop asked for, a limit reached, a report to accept, a continuation's action to
//! move, a refused move) leaves it to its own transaction, which writes it as before.

use super::durable;
use super::handle::Job;
use crate::custody::{
    Committed, Completion, CustodyError, Opened, Opening, Subject, Tier, TreeAfter,
};
use crate::error::JobError;
use crate::fault;
use cairn_common::report;
use cairn_common::request::limits::{self, Moment};
use cairn_common::request::{self, RequestEvent};
use sqlx::PgConnection;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use uuid::Uuid;

/// The completion of the plan's last step, written with its receipt when it can be.
pub struct WithReceipt<'j> {
    job: &'j Job,
    subject: &'j Subject,
    workspace_id: Uuid,
    /// Whether the last seal that ran wrote the completion.
    written: AtomicBool,
    /// Whether any seal wrote it: one whose commit's reply was lost may have landed.
    tried: AtomicBool,
}

impl<'j> WithReceipt<'j> {
    /// For the last step of a plan, when nothing it commits asks for more than a plain
    /// completion: no report is retained with it and no continuation's action admitted
    /// it. `None` otherwise.
    pub fn of(
        job: &'j Job,
        subject: &'j Subject,
        workspace_id: Uuid,
        retains_report: bool,
    ) -> Option<WithReceipt<'j>> {
        (!retains_report && job.claimed.action_id.is_none()).then(|| WithReceipt {
            job,
            subject,
            workspace_id,
            written: AtomicBool::new(false),
            tried: AtomicBool::new(false),
        })
    }

    /// Whether the completion landed with the step's commit. After a read-back of the
    /// receipt (`Committed::read_back`), a fence that refused a later try (the
    /// completion had released the lease), or a failure once a seal wrote it (its reply
    /// may have been lost), which try landed is not known: the request's state says. A
    /// clean commit, or one custody read back as this try's, is this try's flag.
    pub async fn landed(
        &self,
        committed: &Result<Committed, CustodyError>,
    ) -> Result<bool, JobError> {
        if !self.tried.load(Ordering::Acquire) {
            return Ok(false);
        }
        match committed {
            Ok(committed) if !committed.read_back => Ok(self.written.load(Ordering::Acquire)),
            _ => self.read_back().await,
        }
    }

    /// Whether this lease completed the request: completed, and the lease let go at
    /// this epoch (a takeover or a fence moves the epoch, and a successor's completion
    /// is not this job's). Read through database faults within the lease.
    async fn read_back(&self) -> Result<bool, JobError> {
        let lease = self.job.lease();
        let mut delays = durable::within_the_lease(self.job);
        loop {
            let completed: Result<Option<bool>, sqlx::Error> = sqlx::query_scalar(
                "SELECT state = 'completed' AND lease_epoch = $2 AND lease_owner IS NULL
                   FROM execution_requests WHERE id = $1",
            )
            .bind(lease.request_id)
            .bind(lease.epoch)
            .fetch_optional(&self.job.worker.pool)
            .await;
            match completed {
                Ok(completed) => return Ok(completed == Some(true)),
                Err(e) => match delays.next() {
                    Some(delay) => tokio::time::sleep(delay).await,
                    None => return Err(e.into()),
                },
            }
        }
    }
}

impl Completion for WithReceipt<'_> {
    async fn complete(&self, conn: &mut PgConnection, at: Uuid) -> Result<TreeAfter, CustodyError> {
        self.written.store(false, Ordering::Release);
        let job = self.job;
        let request_id = job.request_id();
        let current = limits::read(&mut *conn, request_id, job.claimed.continuation).await?;
        if current.breach(Moment::Completion).is_some() {
            return Ok(TreeAfter::Stays);
        }
        // A report is retained only with a last step's receipt, after its intent: a
        // request claimed with an empty journal has none (this commit retains none).
        let retire = match job.claimed.journaled {
            false => true,
            true => {
                let report = report::standing(&mut *conn, request_id).await?;
                if report.awaits_acceptance {
                    return Ok(TreeAfter::Stays);
                }
                !report.asks_for_more
            }
        };
        let lease = job.lease();
        let held = (lease.epoch, lease.owner.as_str());
        let completed =
            request::transition_releasing(&mut *conn, request_id, RequestEvent::Complete, held)
                .await;
        let released = match completed {
            Ok(released) => released,
            // Nothing was written: the completion's own transaction meets the refusal
            // again, and reports it.
            Err(request::Error::Refused(_)) => return Ok(TreeAfter::Stays),
            Err(request::Error::Db(e)) => return Err(e.into()),
        };
        let custody = &job.worker.custody;
        custody
            .ended_rows(
                &mut *conn,
                self.subject,
                (self.workspace_id, Some(at)),
                retire,
            )
            .await?;
        if let request::Released::MovedOnly(_) = released {
            job.worker.leases.release_in(&mut *conn, lease).await?;
        }
        fault::cut(fault::BEFORE_COMPLETION_COMMIT, &mut *conn).await;
        self.written.store(true, Ordering::Release);
        self.tried.store(true, Ordering::Release);
        Ok(TreeAfter::Ended)
    }
}

/// The plan's first intent, written with its tree's record in use when it can be.
pub struct FirstIntent<'j> {
    job: &'j Job,
    /// The wall time the contract left, when the opening wrote the intent.
    written: Mutex<Option<i64>>,
}

impl<'j> FirstIntent<'j> {
    /// For a plan claimed with an empty journal: its first step has no standing to be
    /// decided on, so it runs on whatever tree is acquired.
    pub fn of(job: &'j Job) -> FirstIntent<'j> {
        FirstIntent {
            job,
            written: Mutex::new(None),
        }
    }

    /// The wall time left, when the first step's intent committed with the tree.
    pub fn written(&self) -> Option<i64> {
        *self.written.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Opening for FirstIntent<'_> {
    async fn open(
        &self,
        conn: &mut PgConnection,
        tier: Tier,
        resume_context: &serde_json::Value,
    ) -> Result<Opened, CustodyError> {
        // A try whose transaction did not land wrote nothing.
        *self.written.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let job = self.job;
        let claimed = &job.claimed;
        let Some(step) = claimed.steps.first() else {
            return Ok(Opened::Nothing);
        };
        // An adopted tree is decided on before anything runs; a pause, a stop or a drain
        // asked for meanwhile is carried out before any intent.
        let settings = &job.worker.settings;
        let hands_back = settings.hand_back_at_step_boundary && job.worker.draining.is_cancelled();
        let waits = crate::pause::requested(job) || job.stopped() || hands_back;
        if claimed.journaled || tier == Tier::Adopt || waits {
            return Ok(Opened::Nothing);
        }
        // A limit reached leaves the step to its own intent, which meets it again.
        match super::intent::write(conn, job, step, (0, Some(resume_context))).await? {
            Ok(wall_left_ms) => {
                *self.written.lock().unwrap_or_else(PoisonError::into_inner) = Some(wall_left_ms);
                Ok(Opened::WithResumeContext)
            }
            Err(_) => Ok(Opened::Nothing),
        }
    }
}
