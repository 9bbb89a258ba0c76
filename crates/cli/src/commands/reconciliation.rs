//! `cairnctl reconciliation`: what a run that needs a person is waiting for (each
//! uncertain step, what is known of it, its output so far), and a decision on each step,
//! its id and body saved locally before the one POST.

use crate::client::{exit, CallError, Client};
use crate::{actions, id, output};
use clap::{Subcommand, ValueEnum};
use reqwest::Method;
use serde_json::{json, Value};
use std::path::PathBuf;

/// What the operator decides about a step.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Verdict {
    /// The effect happened: record a receipt by a person; the run goes on after it.
    MarkDone,
    /// The effect did not happen: the step runs again, once, on the same request.
    MarkNotDone,
    /// The run fails here.
    FailRun,
}

impl Verdict {
    fn wire(self) -> &'static str {
        match self {
            Verdict::MarkDone => "mark_done",
            Verdict::MarkNotDone => "mark_not_done",
            Verdict::FailRun => "fail_run",
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum ReconciliationCommand {
    /// Show what a run needs a person for: each uncertain step (its intent, what is known
    /// of its effect, the end of its output) and the decisions taken.
    Show {
        /// The run's id (32 lowercase hex characters).
        run: String,
    },
    /// Decide one uncertain step. The decision's id and body are saved locally before the
    /// one POST: after a lost answer, read it back with `decision`, never decide again.
    Decide {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// The step's key.
        step: String,
        /// What you decide.
        #[arg(value_enum)]
        verdict: Verdict,
        /// Why: the journal keeps it with your token's name (1 to 2000 characters).
        #[arg(long)]
        reason: String,
        /// Your decision id (32 lowercase hex); a new one when omitted, printed and saved.
        #[arg(long)]
        decision_id: Option<String>,
        /// Where decision records are kept (default: $XDG_STATE_HOME/cairn/actions).
        #[arg(long, env = "CAIRN_STATE_DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Read one decision back.
    Decision {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// The decision's id (32 lowercase hex characters).
        decision: String,
    },
}

pub async fn reconciliation(
    client: &Client,
    command: ReconciliationCommand,
    json: bool,
) -> Result<u8, CallError> {
    match command {
        ReconciliationCommand::Show { run } => show(client, &id(&run, "RUN")?, json).await,
        ReconciliationCommand::Decide {
            run,
            step,
            verdict,
            reason,
            decision_id,
            state_dir,
        } => {
            let run = id(&run, "RUN")?;
            let decision = match decision_id {
                Some(given) => id(&given, "--decision-id")?,
                None => cairn_common::ids::Id::new().to_string(),
            };
            let body = json!({"step_key": step, "decision": verdict.wire(), "reason": reason});
            let dir = actions::state_dir(state_dir.as_deref());
            let hint = format!("cairnctl reconciliation decision {run} {decision}");
            let record = actions::SavedAction::unsubmitted(
                "reconciliation_decision",
                &run,
                "",
                &decision,
                body,
            );
            let path = format!("/api/v1/runs/{run}/reconciliation/decisions/{decision}");
            let (answer, saved) = actions::submit_once(client, &dir, record, &path, &hint).await?;
            if json {
                output::json(&answer.body);
            } else {
                print_decision(&answer.body);
                println!("record: {}", saved.display());
            }
            Ok(exit::OK)
        }
        ReconciliationCommand::Decision { run, decision } => {
            let path = format!(
                "/api/v1/runs/{}/reconciliation/decisions/{}",
                id(&run, "RUN")?,
                id(&decision, "DECISION")?
            );
            let answer = client.get(&path).await?;
            if json {
                output::json(&answer);
            } else {
                print_decision(&answer);
            }
            Ok(exit::OK)
        }
    }
}

fn print_decision(decision: &Value) {
    println!(
        "decision {}: step {} {} by {} — the run {}",
        output::text(&decision["decision_id"]),
        output::text(&decision["step_key"]),
        output::text(&decision["decision"]),
        output::text(&decision["decided_by_name"]),
        match decision["outcome"].as_str() {
            Some("queued") => "continues from its journal",
            Some("waiting") => "waits for decisions on its other uncertain steps",
            Some("failed") => "failed",
            _ => "is as it was",
        }
    );
    println!("reason: {}", output::text(&decision["reason"]));
}

async fn show(client: &Client, run: &str, json: bool) -> Result<u8, CallError> {
    let view = client
        .get(&format!("/api/v1/runs/{run}/reconciliation"))
        .await?;
    if json {
        output::json(&view);
        return Ok(exit::OK);
    }
    println!(
        "run {run} is {} ({})",
        output::text(&view["state"]),
        output::text(&view["stop_reason"])
    );
    let steps = view["uncertain_steps"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if steps.is_empty() {
        println!("no step waits for a decision");
    }
    for step in &steps {
        println!();
        output::fields(
            step,
            &[
                "step_key",
                "standing",
                "idempotent",
                "intent_epoch",
                "attempt",
                "worker",
                "started_at",
                "ended_at",
                "exit_code",
            ],
        );
        let key = output::text(&step["step_key"]);
        let path = format!("/api/v1/runs/{run}/steps/{key}/output?tail_bytes=2000");
        // The step's bytes are arbitrary: shown escaped, never raw to the terminal.
        match client.call_bytes(Method::GET, &path, None).await {
            Ok((status, bytes)) if status.is_success() && !bytes.is_empty() => println!(
                "output (last 2000 bytes of stdout):\n{}",
                cairn_common::output::escape(&bytes)
            ),
            Ok((status, _)) if status.is_success() || status.as_u16() == 404 => {
                println!("output: none")
            }
            Ok((status, _)) => println!("output: not readable (HTTP {status})"),
            Err(e) => println!("output: not readable ({})", e.message),
        }
        println!(
            "decide: cairnctl reconciliation decide {run} {key} mark-done|mark-not-done|fail-run --reason TEXT"
        );
    }
    let decisions = output::rows(&view["decisions"], |d| {
        output::cells(
            d,
            &[
                "created_at",
                "step_key",
                "decision",
                "decided_by_name",
                "outcome",
                "reason",
            ],
        )
    });
    if !decisions.is_empty() {
        println!();
        output::table(
            &["at", "step", "decision", "by", "outcome", "reason"],
            &decisions,
        );
    }
    Ok(exit::OK)
}
