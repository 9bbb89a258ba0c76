//! The worker's job errors: what makes a job give up without recording an outcome.

use crate::custody::CustodyError;
use cairn_common::lease::LeaseError;
use cairn_common::request::table::Refused;

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The lease is lost: a newer owner exists, or it expired. Only this is fencing.
    #[error(transparent)]
    Lease(LeaseError),
    /// The database failed (a lost connection, a pool timeout): a transient fault,
    /// never fencing (invariant 11).
    #[error("database error: {0}")]
    Db(sqlx::Error),
    /// The transition table refused a move: the request is no longer where this job
    /// thought it was, and nothing was changed.
    #[error(transparent)]
    Refused(Refused),
    /// A custody failure the job had no outcome for.
    #[error(transparent)]
    Custody(Box<CustodyError>),
}

impl From<sqlx::Error> for JobError {
    fn from(e: sqlx::Error) -> Self {
        JobError::Db(e)
    }
}

impl From<LeaseError> for JobError {
    fn from(e: LeaseError) -> Self {
        match e {
            // A database error while checking the fence says nothing about ownership.
            LeaseError::Db(e) => JobError::Db(e),
            other => JobError::Lease(other),
        }
    }
}

impl From<cairn_common::request::Error> for JobError {
    fn from(e: cairn_common::request::Error) -> Self {
        match e {
            cairn_common::request::Error::Db(e) => JobError::Db(e),
            cairn_common::request::Error::Refused(r) => JobError::Refused(r),
        }
    }
}

impl From<CustodyError> for JobError {
    fn from(e: CustodyError) -> Self {
        match e {
            CustodyError::Lease(e) => JobError::from(e),
            CustodyError::Db(e) => JobError::Db(e),
            other => JobError::Custody(Box::new(other)),
        }
    }
}
