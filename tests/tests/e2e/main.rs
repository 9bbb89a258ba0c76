//! Every end-to-end test, in one binary: one compile and link instead of one per file.
//! Each module is what a file of its own was before. The tests start Cairn's real
//! binaries against the real services (`scripts/services`); run them with
//! `cargo nextest run --workspace -E 'binary(e2e)' [MODULE::]` (or `cargo test --workspace
//! --test e2e`) after `cargo build --workspace --bins`.

mod binaries;
mod bulk;
mod cli;
mod cli_newcomer;
mod console;
mod custody;
mod deployment;
mod faults;
mod finishing;
mod flow_control;
mod history;
mod output;
mod pause;
mod reaper;
mod reconciliation;
mod reuse;
mod sandbox;
mod sandbox_copies;
mod sandbox_durability;
mod sandbox_output;
mod sandbox_previews;
mod sandbox_terminal;
mod sandbox_volumes;
mod sandboxes;
mod scale_down;
mod state_machine;
mod step_retry;
mod structure;
mod verification;
mod worker;
mod workspace;
