//! Sandboxes (the lifecycle seed): a workspace with a lifecycle of its own, placed through
//! the queue and owned by one worker at a time under a fenced lease.
//!
//! - [`state`]: the six states, what the API asks of the owner, and the transition
//!   table (the seed's diagram).
//! - [`spec`]: create, exec and file bodies, and the defaults and bounds of each.
//! - [`record`]: state moves, placements and fencing, for every component.
//! - [`ask`]: what the API and sweepers ask of the owner (`desired`, stop reasons, disk,
//!   timeout, placing again).
//! - [`owner`]: the moves of the worker holding its lease (running, paused, failed,
//!   destroyed, stopped).
//! - [`operations`]: operations recorded for the owner, and idempotency keys.
//! - [`template`]: templates, immutable versions of a named snapshot.
//! - [`preview`]: the headers of a preview's hop from the scheduler to the worker.
//! - [`service`]: commands started in the background on every start and resume.
//! - [`identity`]: the machine id, host name and SSH host key a sandbox keeps for its life.
//! - [`volume`]: storage on one worker's disk that a sandbox attaches, kept across its
//!   restarts and never snapshotted.

pub mod ask;
pub mod identity;
pub mod operations;
pub mod owner;
pub mod preview;
pub mod record;
pub mod service;
pub mod spec;
pub mod state;
pub mod template;
pub mod volume;

pub use spec::{
    valid_metadata_key, CreateSpec, ExecSpec, FileSpec, ForkSpec, Operation, SnapshotSpec,
};
pub use state::{Desired, SandboxEvent, SandboxState};
