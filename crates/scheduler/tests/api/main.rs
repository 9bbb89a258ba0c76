//! The admission API against a real PostgreSQL, through the real router.
//!
//! One module per feature; `harness` holds the API under test.

mod auth;
mod continuation;
mod credentials;
mod harness;
mod lifecycle;
mod live;
mod openapi;
mod operations;
mod parked;
mod policy;
mod publication;
mod runs;
mod sandboxes;
mod tenants;
mod verification;
