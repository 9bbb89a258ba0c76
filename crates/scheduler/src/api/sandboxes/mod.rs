//! Sandboxes (the lifecycle seed): create, read, stop, resume, destroy, extend, exec
//! and files.
//!
//! - [`create`]: creation, placed through the queue; `Idempotency-Key`.
//! - [`view`]: one sandbox, a page of them, and its journal of operations.
//! - [`lifecycle`]: stop, resume, destroy and extend, through the transition table.
//! - [`operations`]: exec and file operations, carried out by the sandbox's worker.
//! - [`output`]: an exec's output, as it is printed.
//! - [`snapshots`]: snapshots as resources: create, list, inspect, delete, restore.
//! - [`fork`]: one capture, many new sandboxes.
//! - [`templates`]: named snapshots published as immutable versions to start from.
//! - [`services`]: set (a deploy) and delete a sandbox's services.
//! - [`preview`]: requests to an exposed port, through its worker; waking it first.
//! - [`volumes`]: storage on one worker's disk that a sandbox attaches.
//! - [`control`]: a running exec's input, terminal size and end, through its worker.

pub mod control;
pub mod create;
pub mod fork;
pub mod lifecycle;
pub mod operations;
pub mod output;
pub mod preview;
pub mod services;
pub mod snapshots;
pub mod templates;
pub mod view;
pub mod volumes;
