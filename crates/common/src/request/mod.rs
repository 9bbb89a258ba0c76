//! The execution request (the *ticket*): its state, and every write that changes it.
//!
//! One writer for the request's table family (`execution_requests`, the run it mirrors,
//! and the continuation actions that admit it): the scheduler's handlers and sweeper and
//! the worker change a request only through these functions, each inside the caller's
//! transaction, on a row the caller has fenced ([`crate::lease::Lease::fence`]) or
//! locked.
//!
//! - [`state`]: the states and the one function that records a move between them.
//! - [`requeue`]: queuing a request again (a new attempt, a hand-back, a readmission by
//!   a reviewed continuation or an adopted verification) and ending an attempt that has
//!   no result.
//! - [`stop`]: stopping at the last checkpoint.
//! - [`cancel`]: cancellation, requested or immediate.
//! - [`pause`]: pause and resume requests and what the worker records of them.
//! - [`action`]: reviewed continuation actions.
//! - [`resume`]: the resume context a worker records of the tree it acquired.

pub mod action;
pub mod cancel;
pub mod pause;
pub mod requeue;
pub mod resume;
pub mod state;
pub mod stop;

pub use requeue::{end_attempt, fence_out, readmit, requeue, AttemptEnd, Continuation};
pub use state::{set_state, RequestState};
pub use stop::stop_at_checkpoint;
