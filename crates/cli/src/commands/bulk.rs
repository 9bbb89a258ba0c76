//! `cairnctl runs rerun` and `cairnctl runs bulk`: a new run from an earlier one's spec,
//! and cancel or retry every run a filter matches, counted first.

use super::run_view::{label_selector, show_run, RunState};
use crate::client::{exit, CallError, Client};
use crate::{id, output, usage};
use clap::{Args, ValueEnum};
use reqwest::Method;
use serde_json::{json, Value};

/// What a bulk action does to each matching run.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BulkAction {
    /// Cancel it.
    Cancel,
    /// Rerun it: a new run from its spec, linked to it.
    Retry,
}

#[derive(Debug, Args)]
pub struct BulkArgs {
    /// What to do to each matching run.
    #[arg(value_enum)]
    pub action: BulkAction,
    /// Only runs in this state.
    #[arg(long, value_enum)]
    pub state: Option<RunState>,
    /// Only runs of this agent.
    #[arg(long)]
    pub agent: Option<String>,
    /// Only runs with this label (`KEY=VALUE`, repeatable: all must match).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Only runs created within this long before now: `90s`, `30m`, `1h`, `7d`.
    #[arg(long)]
    pub since: Option<String>,
    /// Act. Without it, only count and list what would be acted on.
    #[arg(long)]
    pub yes: bool,
}

/// `90s`, `30m`, `1h`, `7d` (or plain seconds) in seconds.
pub fn duration_seconds(text: &str) -> Result<u32, String> {
    let (number, unit) = match text.char_indices().last() {
        Some((at, c)) if c.is_ascii_alphabetic() => (&text[..at], c),
        _ => (text, 's'),
    };
    let scale = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(format!("{text:?}: the unit is s, m, h or d")),
    };
    number
        .parse::<u32>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|s| *s > 0)
        .ok_or_else(|| format!("{text:?} is not a duration like 90s, 30m, 1h or 7d"))
}

pub async fn rerun(client: &Client, run: &str, json: bool) -> Result<u8, CallError> {
    let run = id(run, "RUN")?;
    let path = format!("/api/v1/runs/{run}/rerun");
    let answer = client.call(Method::POST, &path, None, &[]).await?;
    if json {
        output::json(&answer.body);
    } else {
        println!(
            "rerun of {run}: run {}",
            output::text(&answer.body["run_id"])
        );
        show_run(&answer.body);
    }
    Ok(exit::OK)
}

pub async fn bulk(client: &Client, args: BulkArgs, json: bool) -> Result<u8, CallError> {
    let mut filter = json!({});
    if let Some(state) = args.state.and_then(|s| s.to_possible_value()) {
        filter["state"] = json!(state.get_name());
    }
    if let Some(agent) = &args.agent {
        filter["agent"] = json!(agent);
    }
    if let Some(selector) = label_selector(&args.labels)? {
        let labels =
            cairn_common::labels::selector(&selector).map_err(|why| usage(why.to_string()))?;
        filter["labels"] = json!(labels);
    }
    if let Some(since) = &args.since {
        let seconds = duration_seconds(since).map_err(|e| usage(format!("--since {e}")))?;
        filter["created_within_seconds"] = json!(seconds);
    }
    let action = match args.action {
        BulkAction::Cancel => "cancel",
        BulkAction::Retry => "retry",
    };
    // Always counted first; acted on only when asked to.
    let counted = send(client, action, &filter, true).await?;
    let matched = counted["matched"].as_i64().unwrap_or(0);
    if !args.yes {
        if json {
            output::json(&counted);
        } else {
            println!("{matched} runs match; would {action} them (a dry run: nothing was changed)");
            for run in counted["run_ids"].as_array().into_iter().flatten().take(20) {
                println!("  {}", output::text(run));
            }
            if matched > 20 {
                println!("  … and {} more", matched - 20);
            }
            if matched > 0 {
                println!("to {action} them: the same command with --yes");
            }
        }
        return Ok(exit::OK);
    }
    let done = send(client, action, &filter, false).await?;
    if json {
        output::json(&done);
    } else {
        let rows = output::rows(&done["outcomes"], |o| {
            output::cells(o, &["run_id", "outcome", "new_run_id"])
        });
        output::table(&["run", "outcome", "new run"], &rows);
        println!("{action}: {} runs", rows.len());
    }
    Ok(exit::OK)
}

async fn send(
    client: &Client,
    action: &str,
    filter: &Value,
    dry_run: bool,
) -> Result<Value, CallError> {
    let body = json!({"action": action, "filter": filter, "dry_run": dry_run});
    let answer = client
        .call(Method::POST, "/api/v1/runs/bulk", Some(&body), &[])
        .await?;
    Ok(answer.body)
}

#[cfg(test)]
mod tests {
    use super::duration_seconds;

    #[test]
    fn since_takes_seconds_minutes_hours_and_days() {
        assert_eq!(duration_seconds("90s"), Ok(90));
        assert_eq!(duration_seconds("30m"), Ok(1800));
        assert_eq!(duration_seconds("1h"), Ok(3600));
        assert_eq!(duration_seconds("7d"), Ok(604_800));
        assert_eq!(duration_seconds("45"), Ok(45));
        assert!(duration_seconds("0h").is_err());
        assert!(duration_seconds("1w").is_err());
        assert!(duration_seconds("h").is_err());
        assert!(duration_seconds("99999999d").is_err());
    }
}
