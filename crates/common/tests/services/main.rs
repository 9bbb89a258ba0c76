//! `cairn-common` against the real PostgreSQL, Redis and RabbitMQ: one test binary (one
//! link), one module per owner.

mod db;
mod gate;
mod lease;
mod lineage;
mod outbox;
mod reconciliation;
mod transition;
