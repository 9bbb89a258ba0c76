//! One module per `cairnctl` command.

pub mod bulk;
pub mod continuation;
pub mod credentials;
pub mod logs;
pub mod migrate;
pub mod policy;
pub mod publication;
pub mod qualification;
pub mod queues;
pub mod reaper;
pub mod reconciliation;
pub mod run_view;
pub mod runs;
pub mod sandbox;
pub mod snapshot;
pub mod template;
pub mod tokens;
pub mod verification;
pub mod volume;
pub mod watch;
