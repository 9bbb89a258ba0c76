//! Cairn's shared library: the concepts every component agrees on.
//!
//! - [`component`]: start-up checks every process shares.
//! - [`config`]: connection settings shared by every binary (clap + `CAIRN_*` env).
//! - [`telemetry`]: tracing setup, pretty or JSON.
//! - [`db`]: PostgreSQL connection (creating the database if missing) and migrations.
//! - [`digest`]: SHA-256 digests over canonical JSON.
//! - [`egress`]: what a step asks of the network, and its destinations' syntax.
//! - [`network_policy`]: a tenant's layer of the step egress policy.
//! - [`run`]: run specifications and job messages.
//! - [`request`]: the execution request (ticket): its states and every write that changes
//!   it (requeue, stop, cancel, pause, continuation actions).
//! - [`journal`]: intents, receipts and other entries; where receipts stand on a tree.
//! - [`report`]: final reports, retained and accepted once.
//! - [`handoff`]: verification handoffs, adoptions and check results.
//! - [`text_enum`]: states stored as text, typed in Rust.
//! - [`policy`]: the saved-work recovery policy.
//! - [`qualification`]: source profiles: the implementations a continuation may run on.
//! - [`publication`]: a completed run's result delivered as a patch; delivery holds.
//! - [`tenant`]: tenants (projects).
//! - [`token`]: API tokens (their hashes).
//! - [`ids`]: the 32-lowercase-hex identifiers of runs, requests and actions.
//! - [`leader`]: single-leader roles through an advisory lock on a dedicated connection.
//! - [`lease`]: finite ownership leases: Postgres epoch (the fence) + Redis liveness key.
//! - [`queue`]: RabbitMQ topology, connections and the manual-ack consumer.
//! - [`outbox`]: the transactional outbox and its confirming relay.
//! - [`sandbox`]: sandboxes (the lifecycle seed): states, transitions and route bodies.
//! - [`lineage`]: snapshot records, checkpoint lineage (compare-and-set appends), restores.
//! - [`hold`]: durable holds on live workspaces.
//! - [`reaper_status`]: the reaper's last sweeps and what waits for repair, for operators.
//! - [`verification`]: frozen checks of a verification handoff, purposes and digests.
//! - [`health`]: `/healthz`, `/readyz` and `/metrics` for every binary.
//! - [`heartbeat`]: worker heartbeats, so a dead worker's requests are taken over early.
//! - [`metrics`]: the Prometheus registry shared by a process.
//! - [`shutdown`]: SIGTERM/SIGINT turned into a cancellation token.
//! - [`redis_conn`]: the Redis connection manager.
//! - `testing` (feature `testing`): isolation helpers for tests against real services.

#[macro_use]
pub mod action_input;
pub mod text_enum;

pub mod component;
pub mod config;
pub mod db;
pub mod digest;
pub mod egress;
pub mod handoff;
pub mod health;
pub mod heartbeat;
pub mod hold;
pub mod ids;
pub mod journal;
pub mod labels;
pub mod leader;
pub mod lease;
pub mod lineage;
pub mod metrics;
pub mod network_policy;
pub mod outbox;
pub mod output;
pub mod overview;
pub mod policy;
pub mod publication;
pub mod qualification;
pub mod queue;
pub mod reaper_status;
pub mod redis_conn;
pub mod report;
pub mod request;
pub mod retry;
pub mod run;
pub mod sandbox;
pub mod secret_files;
pub mod shutdown;
pub mod step_retry;
pub mod telemetry;
pub mod tenant;
#[cfg(feature = "testing")]
pub mod testing;
pub mod token;
pub mod verification;
pub mod workspace;
