//! The execution request (the *ticket*): its state, and every write that changes it.
//!
//! One writer for the request's table family (`execution_requests`, the run it mirrors,
//! and the continuation actions that admit it): the scheduler's handlers and sweeper and
//! the worker change a request only through these functions, each inside the caller's
//! transaction, on a row the caller has fenced ([`crate::lease::Lease::fence`]) or
//! locked.
//!
//! - [`admit`]: admission of new runs and their tickets.
//! - [`table`]: the transition table of requests, actions, adoptions and handoffs: for
//!   each typed event, the states it may leave and the one it enters.
//! - [`states`]: the states the table moves (requests', actions', handoffs',
//!   adoptions'), apart from their writers.
//! - [`state`]: the request states and [`transition`], the one function that moves a
//!   request (guarded by the table).
//! - [`requeue`]: queuing a request again (a new attempt, a hand-back, a readmission by
//!   a reviewed continuation or an adopted verification) and ending an attempt that has
//!   no result.
//! - [`fence`]: fencing a request's holder out (the epoch moves on).
//! - [`gate`]: flow control: releasing held runs as their concurrency key, rate limit,
//!   priority and the workers' free slots allow.
//! - [`stop`]: stopping at the last checkpoint.
//! - [`limits`]: the cancel, window, deadline and budgets, checked at claim, at every
//!   intent and at completion, and how a request ends when one is reached.
//! - [`cancel`]: cancellation, requested or immediate.
//! - [`pause`]: pause and resume requests and what the worker records of them.
//! - [`action`]: reviewed continuation actions.
//! - [`reconciliation`]: a person's decisions on the uncertain steps of a run that
//!   needs one.
//! - [`resume`]: the resume context a worker records of the tree it acquired.
//! - [`marks`]: what is recorded beside the state (output reclaimed, announced again).

pub mod action;
pub mod admit;
pub mod cancel;
pub mod fence;
pub mod gate;
pub mod limits;
pub mod marks;
pub mod pause;
pub mod reconciliation;
pub mod requeue;
pub mod resume;
pub mod state;
pub mod states;
pub mod stop;
pub mod table;

pub use fence::fence_out;
pub use requeue::{
    end_attempt, job_kind_of, queue_finishing_round, readmit, requeue, AttemptEnd, Continuation,
};
pub use state::{state_of, transition, transition_releasing, Released, RequestState};
pub use stop::stop_at_checkpoint;
pub use table::{ActionEvent, AdoptionEvent, Error, HandoffEvent, RequestEvent};
