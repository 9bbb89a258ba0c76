//! Crash points for tests of timing-sensitive windows (a kill during a capture, during a
//! restore, between an adoption and its first capture).
//!
//! In a debug build, `CAIRN_FAULT_POINTS=name[,name…]` makes the process SIGKILL itself
//! the first time it reaches a named point. Release builds compile the points away: the
//! variable is never read.

/// A point between a capture's hold and snapshot row and its commit.
pub const DURING_CAPTURE: &str = "during_capture";
/// A point after a restore wrote the tree and before it was recorded.
pub const DURING_RESTORE: &str = "during_restore";
/// A point after an adoption committed and before anything was captured.
pub const AFTER_ADOPT: &str = "after_adopt";

/// Kills this process if `name` is armed (debug builds only).
pub fn point(name: &str) {
    #[cfg(debug_assertions)]
    {
        let armed = std::env::var("CAIRN_FAULT_POINTS").unwrap_or_default();
        if armed.split(',').any(|p| p.trim() == name) {
            tracing::warn!(point = name, "fault injection: this process kills itself");
            let _ =
                nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}
