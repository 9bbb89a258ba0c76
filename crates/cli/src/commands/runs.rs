//! `cairnctl runs`: submit, list, show, watch, pause and cancel runs, and read their
//! requests and journal.

use super::bulk::{self, BulkArgs};
use super::logs::{self, Stream};
use super::run_view::{label_selector, run_row, show_run, RunState, RUN_HEADER};
use super::watch;
use crate::client::{exit, CallError, Client};
use crate::{id, output, read_document, usage};
use cairn_common::run::RunSpec;
use clap::{Subcommand, ValueEnum};
use reqwest::Method;
use serde_json::Value;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Submit a run described in a YAML or JSON file (`-` for stdin).
    Submit {
        /// The run file: `agent`, `steps` (at least one), optional `repository`, `ref`,
        /// `budgets`, `deadline`, `max_attempts` (see "A run" in the README).
        file: PathBuf,
        /// Same key and body: the same run; same key, other body: refused.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// List runs, newest first.
    List {
        /// Only runs in this state (`executing` is accepted for `running`).
        #[arg(long, value_enum)]
        state: Option<RunState>,
        /// Only runs of this agent.
        #[arg(long)]
        agent: Option<String>,
        /// Only runs with this label (`KEY=VALUE`, repeatable: all must match).
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Runs per page.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// The `next_cursor` of the previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Show one run.
    Show {
        /// The run's id (32 lowercase hex characters).
        run: String,
    },
    /// Follow a run until it ends: one line per step (state, time, executed or reused),
    /// then its stop reason; exit 0 when it completed, 8 failed, 9 cancelled, 10 when it
    /// needs a person.
    Watch {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// Seconds between two reads of the run (0.1 to 60).
        #[arg(long, default_value_t = 1.0)]
        interval_seconds: f64,
        /// Say why after the run has waited this many seconds queued, unclaimed.
        #[arg(long, default_value_t = 10)]
        unclaimed_seconds: u64,
    },
    /// Start a new run from this run's spec, linked to it (`rerun_of`).
    Rerun {
        /// The run's id (32 lowercase hex characters).
        run: String,
    },
    /// Cancel or retry (rerun) every run a filter matches. Without --yes it only counts
    /// and lists them.
    Bulk(BulkArgs),
    /// Cancel a run: a running step is stopped, and its receipt keeps its output so far.
    Cancel {
        /// The run's id (32 lowercase hex characters).
        run: String,
    },
    /// Pause a running run: its step's processes stop and a checkpoint is captured
    /// before the paused reply. Pausing a paused run shows its pause again.
    Pause {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// Seconds to wait for the worker's capture (0 to 60).
        #[arg(long, default_value_t = 30)]
        wait_seconds: u64,
    },
    /// Resume a paused run: its step's processes continue.
    Resume {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// Seconds to wait for the worker (0 to 60).
        #[arg(long, default_value_t = 30)]
        wait_seconds: u64,
    },
    /// Print a step's output (every started step's, in order, without STEP): stdout to
    /// stdout, stderr to stderr, as the step printed it.
    Logs {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// The step's key; without it, every step of the run in plan order.
        step: Option<String>,
        /// Keep printing as the steps print, until the run ends (like `kubectl logs -f`).
        #[arg(long, short)]
        follow: bool,
        /// Only this stream.
        #[arg(long, value_enum)]
        stream: Option<Stream>,
    },
    /// Show a run's journal: every step's intent and receipt.
    Journal {
        /// The run's id (32 lowercase hex characters).
        run: String,
    },
    /// Show a run's execution requests.
    Requests {
        /// The run's id (32 lowercase hex characters).
        run: String,
    },
}

pub async fn runs(client: &Client, command: RunsCommand, json: bool) -> Result<u8, CallError> {
    match command {
        RunsCommand::Submit {
            file,
            idempotency_key,
        } => submit(client, file, idempotency_key, json).await,
        RunsCommand::List {
            state,
            agent,
            labels,
            limit,
            cursor,
        } => {
            let state = state.and_then(|s| s.to_possible_value());
            let labels = label_selector(&labels)?;
            let filter = Filter {
                state: state.as_ref().map(|s| s.get_name()),
                agent: agent.as_deref(),
                labels: labels.as_deref(),
                limit,
                cursor: cursor.as_deref(),
            };
            list(client, &filter, json).await
        }
        RunsCommand::Show { run } => {
            let run = of_run(client, &run, "").await?;
            if json {
                output::json(&run)
            } else {
                show_run(&run)
            }
            Ok(exit::OK)
        }
        RunsCommand::Watch {
            run,
            interval_seconds,
            unclaimed_seconds,
        } => watch::watch(client, &run, interval_seconds, unclaimed_seconds, json).await,
        RunsCommand::Cancel { run } => cancel(client, run, json).await,
        RunsCommand::Rerun { run } => bulk::rerun(client, &run, json).await,
        RunsCommand::Bulk(args) => bulk::bulk(client, args, json).await,
        RunsCommand::Pause { run, wait_seconds } => pause(client, run, wait_seconds, json).await,
        RunsCommand::Resume { run, wait_seconds } => resume(client, run, wait_seconds, json).await,
        RunsCommand::Logs {
            run,
            step,
            follow,
            stream,
        } => logs::logs(client, &run, step, follow, stream).await,
        RunsCommand::Journal { run } => journal(client, run, json).await,
        RunsCommand::Requests { run } => requests(client, run, json).await,
    }
}

async fn submit(
    client: &Client,
    file: PathBuf,
    idempotency_key: Option<String>,
    json: bool,
) -> Result<u8, CallError> {
    let text = read_document(&file)?;
    let spec: RunSpec = serde_norway::from_str(&text)
        .map_err(|e| CallError::new(exit::REJECTED, format!("{}: {e}", file.display())))?;
    // Validate before transport: a bad file never reaches the server.
    spec.validate("", chrono::Utc::now()).map_err(|e| {
        CallError::new(
            exit::REJECTED,
            format!("{}: {}: {}", file.display(), e.field, e.message),
        )
    })?;
    let body = serde_json::to_value(&spec).map_err(|e| usage(e.to_string()))?;
    let headers: Vec<(&str, &str)> = idempotency_key
        .as_deref()
        .map(|k| vec![("idempotency-key", k)])
        .unwrap_or_default();
    let answer = client
        .call(Method::POST, "/api/v1/runs", Some(&body), &headers)
        .await?;
    if json {
        output::json(&answer.body);
    } else {
        let replay = if answer.status.as_u16() == 200 {
            " (replayed: this key was used before)"
        } else {
            ""
        };
        println!(
            "submitted run {}{replay}",
            output::text(&answer.body["run_id"])
        );
        show_run(&answer.body);
    }
    Ok(exit::OK)
}

/// What `runs list` asks for.
pub struct Filter<'a> {
    pub state: Option<&'a str>,
    pub agent: Option<&'a str>,
    /// `key=value[,key=value…]`.
    pub labels: Option<&'a str>,
    pub limit: u32,
    pub cursor: Option<&'a str>,
}

async fn list(client: &Client, filter: &Filter<'_>, json: bool) -> Result<u8, CallError> {
    let mut query = format!("?limit={}", filter.limit);
    for (name, value) in [
        ("state", filter.state),
        ("agent", filter.agent),
        ("label", filter.labels),
        ("cursor", filter.cursor),
    ] {
        if let Some(value) = value {
            let value: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
            query.push_str(&format!("&{name}={value}"));
        }
    }
    let page = client.get(&format!("/api/v1/runs{query}")).await?;
    if json {
        output::json(&page);
    } else {
        let rows: Vec<Vec<String>> = page["runs"]
            .as_array()
            .map(|r| r.iter().map(run_row).collect())
            .unwrap_or_default();
        output::table(&RUN_HEADER, &rows);
        if let Some(next) = page["next_cursor"].as_str() {
            println!("more: --cursor {next}");
        }
    }
    Ok(exit::OK)
}

async fn cancel(client: &Client, run: String, json: bool) -> Result<u8, CallError> {
    let run = id(&run, "RUN")?;
    let answer = client
        .call(
            Method::POST,
            &format!("/api/v1/runs/{run}/cancel"),
            None,
            &[],
        )
        .await?;
    if json {
        output::json(&answer.body);
    } else if answer.status.as_u16() == 202 {
        println!(
            "cancel requested: the worker holding run {run} stops it within one lease renewal"
        );
    } else {
        println!("run {run} is {}", output::text(&answer.body["state"]));
    }
    Ok(exit::OK)
}

async fn pause(
    client: &Client,
    run: String,
    wait_seconds: u64,
    json: bool,
) -> Result<u8, CallError> {
    let run = id(&run, "RUN")?;
    let answer = asked(client, &run, "pause", wait_seconds).await?;
    if json {
        output::json(&answer.body);
    } else if answer.status.as_u16() == 202 {
        println!("pausing: the worker has not recorded the pause yet; run this again to see it");
    } else {
        let checkpoint = &answer.body["checkpoint"];
        println!(
            "run {run} paused at {}; checkpoint {}{}; it stops at its checkpoint at {} unless resumed",
            output::text(&answer.body["paused_at"]),
            output::text(&checkpoint["snapshot_id"]),
            if checkpoint["capture_failed"] == true {
                " (this capture failed: a hold keeps the live tree)"
            } else {
                ""
            },
            output::text(&checkpoint["expires_at"]),
        );
    }
    Ok(exit::OK)
}

async fn resume(
    client: &Client,
    run: String,
    wait_seconds: u64,
    json: bool,
) -> Result<u8, CallError> {
    let run = id(&run, "RUN")?;
    let answer = asked(client, &run, "resume", wait_seconds).await?;
    if json {
        output::json(&answer.body);
    } else if answer.status.as_u16() == 202 {
        println!("resuming: the worker has not continued the step yet");
    } else {
        println!("run {run} is running again");
    }
    Ok(exit::OK)
}

async fn journal(client: &Client, run: String, json: bool) -> Result<u8, CallError> {
    let journal = of_run(client, &run, "/journal").await?;
    if json {
        output::json(&journal);
    } else {
        let rows = output::rows(&journal["steps"], |s| {
            let mut row = output::cells(
                s,
                &[
                    "step_key",
                    "status",
                    "exit_code",
                    "limit",
                    "wall_ms",
                    "intent_epoch",
                ],
            );
            row.extend(output::cells(s, &["receipt_epoch", "tree_tier"]));
            // The snapshot holding the step's effects.
            row.push(
                s["snapshot_id"]
                    .as_str()
                    .map(|id| id.chars().take(12).collect())
                    .unwrap_or_else(|| "-".into()),
            );
            row.push(last_line(s));
            row
        });
        output::table(
            &[
                "step",
                "status",
                "exit",
                "limit",
                "wall_ms",
                "intent_epoch",
                "receipt_epoch",
                "tree",
                "snapshot",
                "output (last line)",
            ],
            &rows,
        );
        println!("(a step's whole output: cairnctl runs logs {run} STEP)");
        for entry in journal["entries"].as_array().into_iter().flatten() {
            println!(
                "{}  {}  {}",
                output::text(&entry["created_at"]),
                output::text(&entry["entry_kind"]),
                entry["body"]
            );
        }
    }
    Ok(exit::OK)
}

async fn requests(client: &Client, run: String, json: bool) -> Result<u8, CallError> {
    let list = client
        .get(&format!(
            "/api/v1/runs/{}/execution-requests",
            id(&run, "RUN")?
        ))
        .await?;
    if json {
        output::json(&list);
    } else {
        let fields = [
            "request_id",
            "kind",
            "state",
            "attempt",
            "lease_epoch",
            "lease_owner",
        ];
        let rows = output::rows(&list["execution_requests"], |e| output::cells(e, &fields));
        output::table(
            &["request", "kind", "state", "attempt", "epoch", "owner"],
            &rows,
        );
    }
    Ok(exit::OK)
}

/// The last line a step printed (stdout, else stderr), from its receipt's tail, cut to
/// 40 characters; `-` when it printed nothing.
fn last_line(step: &Value) -> String {
    let last = ["stdout_tail", "stderr_tail"].iter().find_map(|tail| {
        step[*tail]
            .as_str()?
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
    });
    match last {
        Some(line) if line.chars().count() > 40 => {
            format!("{}…", line.chars().take(39).collect::<String>())
        }
        Some(line) => line.to_string(),
        None => "-".into(),
    }
}

/// Reads `/api/v1/runs/{run}{suffix}`.
async fn of_run(client: &Client, run: &str, suffix: &str) -> Result<Value, CallError> {
    client
        .get(&format!("/api/v1/runs/{}{suffix}", id(run, "RUN")?))
        .await
}

/// Asks the API to pause or resume a run (`verb`), waiting up to `wait_seconds`.
async fn asked(
    client: &Client,
    run: &str,
    verb: &str,
    wait_seconds: u64,
) -> Result<crate::client::Answer, CallError> {
    let path = format!("/api/v1/runs/{run}/{verb}?wait_seconds={wait_seconds}");
    client.call(Method::POST, &path, None, &[]).await
}
