//! Tracing setup: `RUST_LOG` filters (default `info`), `CAIRN_LOG_FORMAT` picks the format.

use crate::config::LogFormat;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; a second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,lapin=warn,sqlx=warn"));
    // A failed write to stderr (a closed pipe) is dropped: the subscriber's default
    // reports it with `eprintln!`, which panics on that same stderr, in whichever task
    // logged, the signal handler included, and shutdown would never start.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    let _ = match format {
        // Colour codes only for a person at a terminal, never into a file or a pipe.
        LogFormat::Pretty => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
