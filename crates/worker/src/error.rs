//! The worker's job errors: what makes a job give up without recording an outcome.

use crate::custody::CustodyError;
use cairn_common::lease::LeaseError;

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The lease is lost: a newer owner exists, or it expired.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// A custody failure the job had no outcome for.
    #[error(transparent)]
    Custody(Box<CustodyError>),
}

impl From<CustodyError> for JobError {
    fn from(e: CustodyError) -> Self {
        match e {
            CustodyError::Lease(e) => JobError::Lease(e),
            CustodyError::Db(e) => JobError::Db(e),
            other => JobError::Custody(Box::new(other)),
        }
    }
}
