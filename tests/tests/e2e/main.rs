//! Every end-to-end test, in one binary: one compile and link instead of one per file.
//! Each module is what a file of its own was before. The tests start Cairn's real
//! binaries against the real services (`scripts/services`); run them with
//! `cargo test -p cairn-e2e --test e2e [MODULE::]` after `cargo build --workspace --bins`.

mod binaries;
mod cli;
mod console;
mod custody;
mod deployment;
mod faults;
mod output;
mod pause;
mod reaper;
mod reuse;
mod sandbox;
mod sandbox_copies;
mod sandboxes;
mod scale_down;
mod state_machine;
mod structure;
mod verification;
mod worker;
mod workspace;
