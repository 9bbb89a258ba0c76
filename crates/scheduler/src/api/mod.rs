//! The scheduler's HTTP API (JSON, bearer tokens).
//!
//! - [`error`]: the error body every route shares.
//! - [`json`]: the strict JSON extractor.
//! - [`idempotency`]: the `Idempotency-Key` header.
//! - [`query`]: the query string extractor with the API's error body.
//! - [`auth`]: tokens, roles and tenants.
//! - [`tenancy`]: the guard that answers another tenant's ids as unknown ones.
//! - [`runs`], [`pause`], [`policy`], [`continuation`], [`verification`], [`tokens`],
//!   [`credentials`], [`tenants`], [`network_policy`], [`qualification`], [`publication`]: the routes. Continuations and verification handoffs each have a
//!   pure `candidate` module: their rules as a function of facts and policy.
//! - [`sandboxes`]: sandboxes (the lifecycle seed).
//! - [`session`], [`workers`], [`reaper`], [`overview`]: who is calling; workers and
//!   their leases; the reaper's last sweeps; the fleet over time (the console reads
//!   these).
//! - [`state`]: what every handler shares (the pool, the counters).
//! - [`openapi`]: the generated OpenAPI document.
//! - [`router`]: every route, in groups; [`path`]: path ids; [`poll`]: the long poll of a
//!   route that waits for a worker.

pub mod auth;
pub mod continuation;
pub mod credentials;
pub mod cursor;
pub mod error;
pub mod error_codes;
pub mod idempotency;
pub mod json;
pub mod live_output;
pub mod network_policy;
pub mod openapi;
pub mod overview;
pub mod path;
pub mod pause;
pub mod policy;
pub mod poll;
pub mod publication;
pub mod qualification;
pub mod query;
pub mod queues;
pub mod reaper;
pub mod router;
pub mod runs;
pub mod sandboxes;
pub mod session;
pub mod state;
pub mod tenancy;
pub mod tenants;
pub mod tokens;
pub mod verification;
pub mod workers;

pub use path::path_id;
pub use router::router;
pub use state::{ApiMetrics, AppState};
