//! `cairnctl runs watch RUN`: the run's progress until it ends. On a terminal, one line
//! per step (its state, a spinner and its elapsed time while it runs, whether it was
//! executed or reused from a receipt), redrawn in place; elsewhere, a plain line per
//! change. Then the stop reason. A run that waits queued with no worker alive to take
//! it says so. Exit 0 when it completed, 8 when it failed, 9 when it was cancelled, 10
//! when it needs a person.

use super::logs::ENDED;
use crate::client::{exit, CallError, Client};
use crate::{id, output};
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::io::{IsTerminal, Write};
use std::time::Duration;

const SPINNER: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

/// One step as the watcher shows it.
#[derive(Debug, Clone, PartialEq)]
struct StepLine {
    key: String,
    /// `pending`, `running`, `completed`, `failed`, `cancelled`, `unknown_outcome`.
    state: String,
    /// `executed` or `reused`, once it has a receipt.
    how: Option<&'static str>,
    epoch: Option<i64>,
    detail: String,
    started_at: Option<DateTime<Utc>>,
    wall_ms: Option<i64>,
}

impl StepLine {
    /// What a plain line says (no clock, so it changes only when the step does).
    fn plain(&self) -> String {
        let mut line = format!("step {}: {}", self.key, self.state);
        line.push_str(&self.how_and_epoch(", ", " "));
        if let Some(ms) = self.wall_ms.filter(|_| self.how.is_some()) {
            line.push_str(&format!(" in {}", seconds(ms)));
        }
        if !self.detail.is_empty() {
            line.push_str(&format!(" ({})", self.detail));
        }
        line
    }

    /// "executed at epoch 3", "reused from its receipt of epoch 1", or the epoch alone.
    fn how_and_epoch(&self, before_how: &str, before_epoch: &str) -> String {
        match (self.how, self.epoch) {
            (Some("reused"), Some(epoch)) => {
                format!("{before_how}reused from its receipt of epoch {epoch}")
            }
            (Some(how), Some(epoch)) => format!("{before_how}{how} at epoch {epoch}"),
            (None, Some(epoch)) => format!("{before_epoch}at epoch {epoch}"),
            _ => String::new(),
        }
    }

    /// What a terminal line says: a mark, the state, the time it has run.
    fn live(&self, tick: usize, now: DateTime<Utc>) -> String {
        let mark = match self.state.as_str() {
            "running" => SPINNER[tick % SPINNER.len()],
            "completed" => "✓",
            "pending" => "·",
            _ => "✗",
        };
        let elapsed = match (self.state.as_str(), self.started_at, self.wall_ms) {
            ("running", Some(at), _) => seconds((now - at).num_milliseconds().max(0)),
            (_, _, Some(ms)) => seconds(ms),
            _ => String::new(),
        };
        let how = self.how_and_epoch("", "");
        let detail = if self.detail.is_empty() {
            String::new()
        } else {
            format!("  {}", self.detail)
        };
        format!(
            "  {mark} {:<20} {:<16} {:>8}  {how}{detail}",
            self.key, self.state, elapsed
        )
    }
}

fn seconds(ms: i64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

/// Each planned step, from the run, its journal and its request's resume context.
fn step_lines(run: &Value, journal: &Value, request: &Value) -> Vec<StepLine> {
    let request_id = &run["request_id"];
    let executing = run["state"] == "running";
    let epoch_now = request["lease_epoch"].as_i64();
    let reused: Vec<&str> = request["resume_context"]["receipts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["standing"] == "on_tree")
        .filter_map(|r| r["step_key"].as_str())
        .collect();
    let steps = run["steps"].as_array().cloned().unwrap_or_default();
    steps
        .iter()
        .filter_map(|s| s["key"].as_str())
        .map(|key| {
            let entry = journal["steps"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|j| j["step_key"] == key && &j["request_id"] == request_id);
            let Some(entry) = entry else {
                return StepLine {
                    key: key.into(),
                    state: "pending".into(),
                    how: None,
                    epoch: None,
                    detail: String::new(),
                    started_at: None,
                    wall_ms: None,
                };
            };
            let status = entry["status"].as_str().unwrap_or("unknown_outcome");
            let intent_epoch = entry["intent_epoch"].as_i64();
            let running = status == "unknown_outcome" && executing && intent_epoch == epoch_now;
            let receipted = entry["receipt_epoch"].as_i64();
            let detail = match status {
                "failed" => match (&entry["exit_code"], &entry["signal"], &entry["limit"]) {
                    (_, _, Value::String(limit)) => format!("passed its {limit}"),
                    (_, Value::Number(signal), _) => format!("signal {signal}"),
                    _ if entry["timed_out"] == true => "timed out".into(),
                    (Value::Number(code), _, _) => format!("exit {code}"),
                    _ => String::new(),
                },
                "unknown_outcome" if !running => {
                    "started, its end not recorded: a person decides unless it is idempotent".into()
                }
                _ => String::new(),
            };
            StepLine {
                key: key.into(),
                state: if running {
                    "running".into()
                } else {
                    status.into()
                },
                how: receipted.map(|_| {
                    if reused.contains(&key) {
                        "reused"
                    } else {
                        "executed"
                    }
                }),
                epoch: receipted.or(intent_epoch),
                detail,
                started_at: entry["started_at"].as_str().and_then(|t| t.parse().ok()),
                wall_ms: entry["wall_ms"].as_i64(),
            }
        })
        .collect()
}

/// Reads `path`; a transient failure is `None` (the next poll tries again).
async fn read(client: &Client, path: &str) -> Result<Option<Value>, CallError> {
    match client.get(path).await {
        Ok(value) => Ok(Some(value)),
        Err(e) if e.transient => {
            eprintln!("watch: {e}; retrying");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Why a queued run is not taken, once it has waited `unclaimed` with nobody alive.
async fn waiting_hint(
    client: &Client,
    run: &Value,
    request: &Value,
    unclaimed: Duration,
) -> Result<Option<String>, CallError> {
    if run["state"] != "queued" {
        return Ok(None);
    }
    let since = request["claimed_at"]
        .as_str()
        .or(request["admitted_at"].as_str())
        .and_then(|t| t.parse::<DateTime<Utc>>().ok());
    let Some(since) = since else {
        return Ok(None);
    };
    let waited = (Utc::now() - since).to_std().unwrap_or_default();
    if waited < unclaimed {
        return Ok(None);
    }
    let workers = match read(client, "/api/v1/workers").await {
        Ok(Some(workers)) => workers,
        // A scheduler without the route gives no hint; the watch goes on.
        Ok(None) | Err(_) => return Ok(None),
    };
    let alive = workers["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["alive"] == true)
        .count();
    // Worded without the running time, so a plain line is said once.
    let over = unclaimed.as_secs();
    Ok(Some(if alive == 0 {
        format!(
            "queued, unclaimed for over {over}s, and no worker is alive to take it: start cairn-worker (with the scheduler's CAIRN_DATABASE_URL and CAIRN_AMQP_URL)"
        )
    } else {
        format!(
            "queued, unclaimed for over {over}s; {alive} worker(s) alive, all busy or not consuming this queue"
        )
    }))
}

pub async fn watch(
    client: &Client,
    run: &str,
    interval: f64,
    unclaimed_seconds: u64,
    json: bool,
) -> Result<u8, CallError> {
    let run = id(run, "RUN")?;
    let interval = Duration::from_secs_f64(interval.clamp(0.1, 60.0));
    let unclaimed = Duration::from_secs(unclaimed_seconds);
    let terminal = std::io::stdout().is_terminal() && !json;
    let mut drawn = 0;
    let mut said: Vec<String> = Vec::new();
    let mut last_json = Value::Null;
    for tick in 0.. {
        let view = read(client, &format!("/api/v1/runs/{run}")).await?;
        let journal = read(client, &format!("/api/v1/runs/{run}/journal")).await?;
        let requests = read(client, &format!("/api/v1/runs/{run}/execution-requests")).await?;
        let (Some(view), Some(journal), Some(requests)) = (view, journal, requests) else {
            tokio::time::sleep(interval).await;
            continue;
        };
        let request = requests["execution_requests"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["request_id"] == view["request_id"])
            .cloned()
            .unwrap_or_default();
        let state = output::text(&view["state"]);
        let ended = ENDED.contains(&state.as_str());
        let hint = waiting_hint(client, &view, &request, unclaimed).await?;
        if json {
            if view != last_json {
                println!("{view}");
                last_json = view.clone();
            }
        } else {
            let steps = step_lines(&view, &journal, &request);
            let header = format!(
                "run {run} {state}, attempt {}/{}, commands {}/{}",
                output::text(&view["attempt"]),
                output::text(&view["max_attempts"]),
                output::text(&view["usage"]["commands"]),
                output::text(&view["budgets"]["max_commands"]),
            );
            let mut lines = vec![header.clone()];
            if terminal {
                let now = Utc::now();
                lines.extend(steps.iter().map(|s| s.live(tick, now)));
                lines.extend(hint.clone());
                redraw(&lines, &mut drawn);
            } else {
                let mut now_said = vec![header];
                now_said.extend(steps.iter().map(StepLine::plain));
                now_said.extend(hint.clone());
                for line in &now_said {
                    if !said.contains(line) {
                        println!("{}  {line}", Utc::now().format("%H:%M:%S"));
                    }
                }
                said = now_said;
            }
        }
        if ended {
            return Ok(say_ended(&view, &state, json));
        }
        tokio::time::sleep(interval).await;
    }
    Ok(exit::OK)
}

/// Says how the run ended (unless the output is JSON); its exit code.
fn say_ended(view: &Value, state: &str, json: bool) -> u8 {
    if !json {
        match view["stop_reason"].as_str() {
            Some(reason) if state != "completed" => println!("run {state}: {reason}"),
            _ => println!("run {state}"),
        }
    }
    match state {
        "completed" => exit::OK,
        "cancelled" => exit::CANCELLED,
        "failed" => exit::NOT_COMPLETED,
        _ => exit::NEEDS_PERSON,
    }
}

/// Replaces the `drawn` lines printed last with `lines`, each cut to the terminal's
/// width (`COLUMNS`, else the terminal's, else 100): a wrapped line would shift every
/// later redraw.
fn redraw(lines: &[String], drawn: &mut usize) {
    let width = output::width().filter(|w| *w >= 20).unwrap_or(100);
    let mut out = std::io::stdout().lock();
    if *drawn > 0 {
        let _ = write!(out, "\x1b[{drawn}A");
    }
    for line in lines {
        let cut: String = line.chars().take(width - 1).collect();
        let _ = writeln!(out, "\x1b[2K{cut}");
    }
    // Lines left from a longer drawing are cleared.
    for _ in lines.len()..*drawn {
        let _ = writeln!(out, "\x1b[2K");
    }
    *drawn = lines.len().max(*drawn);
    let _ = out.flush();
}
