//! How `cairnctl` shows a run (a table row, its fields) and the filters that pick runs
//! (`--state`, `--label`), shared by `runs` and `runs bulk`.

use crate::client::CallError;
use crate::{output, usage};
use clap::ValueEnum;
use serde_json::Value;

/// The states a run shows, as `--state` takes them.
#[derive(Debug, Clone, Copy, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum RunState {
    Queued,
    #[value(alias = "executing")]
    Running,
    /// Running, its step's processes stopped by a pause.
    Paused,
    AwaitingVerification,
    StoppedAtCheckpoint,
    NeedsReconciliation,
    Completed,
    Failed,
    Cancelled,
}

/// Repeated `--label KEY=VALUE` as one selector (`None` when there is none); a pair
/// that is not one is a usage error.
pub fn label_selector(given: &[String]) -> Result<Option<String>, CallError> {
    if given.is_empty() {
        return Ok(None);
    }
    let joined = given.join(",");
    cairn_common::labels::selector(&joined).map_err(|why| usage(format!("--label: {why}")))?;
    Ok(Some(joined))
}

/// A run's labels as `key=value` pairs, comma-separated.
fn labels_cell(run: &Value) -> String {
    run["labels"]
        .as_object()
        .map(|labels| {
            labels
                .iter()
                .map(|(k, v)| format!("{k}={}", output::text(v)))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

pub fn run_row(run: &Value) -> Vec<String> {
    vec![
        output::text(&run["run_id"]),
        output::text(&run["state"]),
        output::text(&run["agent"]),
        format!(
            "{}/{}",
            output::text(&run["attempt"]),
            output::text(&run["max_attempts"])
        ),
        format!(
            "{}/{}",
            output::text(&run["usage"]["commands"]),
            output::text(&run["budgets"]["max_commands"])
        ),
        output::text(&run["created_at"]),
        labels_cell(run),
    ]
}

pub const RUN_HEADER: [&str; 7] = [
    "run", "state", "agent", "attempt", "commands", "created", "labels",
];

pub fn show_run(run: &Value) {
    output::fields(
        run,
        &[
            "run_id",
            "request_id",
            "state",
            "agent",
            "repository",
            "ref",
            "attempt",
            "max_attempts",
            "deadline",
            "stop_reason",
            "reconciliation_step",
            "cancel_requested_at",
            "created_at",
            "finished_at",
        ],
    );
    let labels = labels_cell(run);
    if !labels.is_empty() {
        println!("labels               {labels}");
    }
    println!(
        "usage         {} commands of {}, {} ms wall of {} s, {} ms cpu",
        output::text(&run["usage"]["commands"]),
        output::text(&run["budgets"]["max_commands"]),
        output::text(&run["usage"]["wall_ms"]),
        output::text(&run["budgets"]["max_wall_seconds"]),
        output::text(&run["usage"]["cpu_ms"]),
    );
    let steps: Vec<Vec<String>> = run["steps"]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .map(|s| {
                    vec![
                        output::text(&s["key"]),
                        s["argv"]
                            .as_array()
                            .map(|a| a.iter().map(output::text).collect::<Vec<_>>().join(" "))
                            .unwrap_or_default(),
                        output::text(&s["idempotent"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    if !steps.is_empty() {
        println!();
        output::table(&["step", "command", "idempotent"], &steps);
    }
}
