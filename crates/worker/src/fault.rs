//! Crash points for tests of timing-sensitive windows (a kill during a capture, during a
//! restore, between an adoption and its first capture).
//!
//! In a debug build, `CAIRN_FAULT_POINTS=name[@n][,…]` makes the process SIGKILL itself
//! (or cut its database connection, at a [`cut`] point) the `n`th time (default: the
//! first) it reaches a named point. Release builds compile
//! the points away: the variable is never read.

/// A point between a capture's hold and snapshot row and its commit.
pub const DURING_CAPTURE: &str = "during_capture";
/// A point after a restore wrote the tree and before it was recorded.
pub const DURING_RESTORE: &str = "during_restore";
/// A point after a step's intent committed and before its process started.
pub const AFTER_INTENT: &str = "after_intent";
/// A point after an adoption committed and before anything was captured.
pub const AFTER_ADOPT: &str = "after_adopt";

/// A point after every step's receipt (and the retained final report) committed, before
/// the completion's transaction: the worker dies having answered, unaccepted.
pub const BEFORE_COMPLETION: &str = "before_completion";
/// A point after a verification's checks passed and its worker let the request go,
/// before any worker's finishing round.
pub const AFTER_CHECKS_PASSED: &str = "after_checks_passed";

/// A point inside a claim's transaction, after it took the lease, before its commit.
pub const INSIDE_CLAIM: &str = "inside_claim";

/// A point after a tree's record in use committed: its reply is lost ([`lost_reply`]).
pub const IN_USE_REPLY: &str = "in_use_reply";
/// A point after a seal committed (a capture's, or an unchanged tree's with no
/// capture): its reply is lost.
pub const SEAL_REPLY: &str = "seal_reply";
/// A point where custody reads back a seal whose commit failed: it never answers.
pub const SEAL_UNANSWERED: &str = "seal_unanswered";
/// A point after a step's intent committed in a transaction of its own (every intent
/// but a fresh request's first when it commits with the tree's record): its reply is
/// lost.
pub const INTENT_REPLY: &str = "intent_reply";
/// A point where a job reads back whether a step's intent landed: the read is not
/// answered ([`unanswered`]).
pub const INTENT_READ_BACK: &str = "intent_read_back";

/// A point inside a completion's transaction, before its commit.
pub const BEFORE_COMPLETION_COMMIT: &str = "before_completion_commit";

/// Kills this process if `name` is armed for this pass (debug builds only).
pub fn point(name: &str) {
    if armed(name) {
        tracing::warn!(point = name, "fault injection: this process kills itself");
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
    }
}

/// Cuts the database connection under `conn` if `name` is armed for this pass (debug
/// builds only), as a restart would: the next statement on it fails with a lost
/// connection.
pub async fn cut(name: &str, conn: &mut sqlx::PgConnection) {
    if armed(name) {
        tracing::warn!(point = name, "fault injection: this connection is cut");
        let _ = sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
            .execute(conn)
            .await;
    }
}

/// A commit's reply lost after it landed, if `name` is armed for this pass (debug
/// builds only): the caller sees a lost connection, as after a restart between the
/// commit and its acknowledgement.
pub fn lost_reply<E: From<sqlx::Error>>(name: &str) -> Result<(), E> {
    let lost = std::io::ErrorKind::ConnectionReset;
    injected(name, "a commit's reply is lost", lost)
}

/// A read that is not answered, if `name` is armed for this pass (debug builds only):
/// the caller sees a refused connection, as while the database restarts.
pub fn unanswered<E: From<sqlx::Error>>(name: &str) -> Result<(), E> {
    let refused = std::io::ErrorKind::ConnectionRefused;
    injected(name, "a read-back is not answered", refused)
}

/// An I/O error of `kind` in place of a database's answer, if `name` is armed.
fn injected<E: From<sqlx::Error>>(
    name: &str,
    what: &str,
    kind: std::io::ErrorKind,
) -> Result<(), E> {
    if !armed(name) {
        return Ok(());
    }
    tracing::warn!(point = name, "fault injection: {what}");
    let error = std::io::Error::new(kind, format!("fault injection: {what}"));
    Err(sqlx::Error::Io(error).into())
}

/// Whether `name` is armed in `CAIRN_FAULT_POINTS` for this pass of it.
fn armed(name: &str) -> bool {
    #[cfg(debug_assertions)]
    {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock, PoisonError};
        static PASSES: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
        let armed = std::env::var("CAIRN_FAULT_POINTS").unwrap_or_default();
        let Some(at) = armed.split(',').find_map(|p| {
            let (point, at) = p.trim().split_once('@').unwrap_or((p.trim(), "1"));
            (point == name).then(|| at.parse::<u32>().unwrap_or(1))
        }) else {
            return false;
        };
        let mut passes = PASSES
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let pass = passes.entry(name.to_string()).or_default();
        *pass += 1;
        *pass == at
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = name;
        false
    }
}
