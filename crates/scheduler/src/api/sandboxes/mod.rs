//! Sandboxes (the lifecycle seed): create, read, stop, resume, destroy, extend, exec
//! and files.
//!
//! - [`create`]: creation, placed through the queue; `Idempotency-Key`.
//! - [`view`]: one sandbox, a page of them, and its journal of operations.
//! - [`lifecycle`]: stop, resume, destroy and extend, through the transition table.
//! - [`operations`]: exec and file operations, carried out by the sandbox's worker.

pub mod create;
pub mod lifecycle;
pub mod operations;
pub mod view;
