//! `cairnctl checkpoint-continuations` and `final-outcome-continuations`: read a
//! candidate, save one reviewed action (its id and body recorded locally first), follow it.

use crate::client::{exit, CallError, Client};
use crate::{actions, id, output, read_document};
use clap::Subcommand;
use serde_json::Value;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum ContinuationCommand {
    /// Inspect the current candidate; starts no work.
    Candidate {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// The execution request's id (32 lowercase hex characters).
        request: String,
        /// Print a version-1 action body for the current candidate instead, to review,
        /// save and pass to `request` (its window: the candidate's maximum, at most 300 s).
        #[arg(long)]
        template: bool,
    },
    /// Save one reviewed action: records ACTION and the exact DOCUMENT locally, then
    /// POSTs once. Never retries and never invents another id.
    Request {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// The execution request's id (32 lowercase hex characters).
        request: String,
        /// Your action id (32 lowercase hex); same id and DOCUMENT: the same action, else refused.
        action: String,
        /// The JSON body (`-` for stdin).
        document: PathBuf,
        /// Where action records are kept (default: $XDG_STATE_HOME/cairn/actions).
        #[arg(long, env = "CAIRN_STATE_DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Read the saved action and its worker status.
    Status {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// The execution request's id (32 lowercase hex characters).
        request: String,
    },
}

pub async fn continuation(
    client: &Client,
    route: &str,
    command: ContinuationCommand,
    json: bool,
) -> Result<u8, CallError> {
    let kind = route.trim_end_matches('s').replace('-', "_");
    match command {
        ContinuationCommand::Candidate {
            run,
            request,
            template,
        } => {
            let path = format!(
                "/api/v1/runs/{}/{route}/requests/{}/candidate",
                id(&run, "RUN")?,
                id(&request, "REQUEST")?
            );
            if template {
                return print_template(client, &path, &kind).await;
            }
            show_candidate(client, &path, json).await
        }
        ContinuationCommand::Request {
            run,
            request,
            action,
            document,
            state_dir,
        } => {
            let (run, request, action) = (
                id(&run, "RUN")?,
                id(&request, "REQUEST")?,
                id(&action, "ACTION")?,
            );
            let text = read_document(&document)?;
            let body: Value = serde_json::from_str(&text).map_err(|e| {
                CallError::new(
                    exit::REJECTED,
                    format!("{}: not JSON: {e}", document.display()),
                )
            })?;
            // The server's own rules, checked here first: a body it would refuse is
            // neither saved nor sent.
            validate(&kind, &body).map_err(|e| {
                CallError::new(
                    exit::REJECTED,
                    format!("{}: {e}; nothing was saved or sent", document.display()),
                )
            })?;
            let dir = actions::state_dir(state_dir.as_deref());
            let status_hint = format!("cairnctl {route} status {run} {request}");
            let record = actions::SavedAction::unsubmitted(&kind, &run, &request, &action, body);
            let path = format!("/api/v1/runs/{run}/{route}/requests/{request}/actions/{action}");
            let (answer, saved_path) =
                actions::submit_once(client, &dir, record, &path, &status_hint).await?;
            if json {
                output::json(&answer.body);
            } else {
                let what = format!("saved action {action}");
                let fields = ["witness_digest", "admission_seal"];
                actions::print_submitted(&answer, &saved_path, &what, &fields, &status_hint);
            }
            Ok(exit::OK)
        }
        ContinuationCommand::Status { run, request } => {
            let path = format!(
                "/api/v1/runs/{}/{route}/requests/{}/status",
                id(&run, "RUN")?,
                id(&request, "REQUEST")?
            );
            show_status(client, &path, json).await
        }
    }
}

/// Checks a version-1 body of `kind` by the scheduler's rules: exactly the documented
/// fields, of their JSON types (`1` or `"true"` is not an acknowledgement), each value
/// in range and every acknowledgement `true`.
fn validate(kind: &str, body: &Value) -> Result<(), String> {
    if !body.is_object() {
        return Err("the document must be a JSON object".into());
    }
    cairn_common::action_input::check(kind == "checkpoint_continuation", body).map(|_| ())
}

/// Prints a version-1 body for the current candidate of `kind`, every acknowledgement
/// set: the operator reads it, keeps it and submits it as it is.
async fn print_template(client: &Client, path: &str, kind: &str) -> Result<u8, CallError> {
    let candidate = client.get(path).await?;
    let Some(digest) = candidate["candidate_digest"].as_str() else {
        return Err(CallError::new(
            exit::CONFLICT,
            "the candidate has no digest: nothing can be requested from it",
        ));
    };
    let window = candidate["maximum_window_seconds"]
        .as_u64()
        .unwrap_or(300)
        .clamp(1, 300);
    let mut body = serde_json::json!({
        "version": 1,
        "candidate_digest": digest,
        "valid_for_seconds": window,
    });
    let checkpoint = kind == "checkpoint_continuation";
    for acknowledgement in cairn_common::action_input::acknowledgements(checkpoint) {
        body[acknowledgement] = Value::Bool(true);
    }
    validate(kind, &body).map_err(|e| CallError::new(exit::ERROR, e))?;
    output::json(&body);
    // The body goes to stdout for a file; why it would be refused now, to the terminal.
    Ok(report_holds(&candidate, |line| eprintln!("{line}")))
}

/// Says each hold of `candidate` through `say`; the exit code: 0 only when it is ready.
fn report_holds(candidate: &Value, say: impl Fn(String)) -> u8 {
    for hold in candidate["holds"].as_array().into_iter().flatten() {
        say(format!(
            "held: {} — {}",
            output::text(&hold["reason"]),
            output::text(&hold["message"])
        ));
    }
    if candidate["admission"] == "READY" {
        exit::OK
    } else {
        exit::CONFLICT
    }
}

/// Prints a candidate; exit 0 only when it is ready.
async fn show_candidate(client: &Client, path: &str, json: bool) -> Result<u8, CallError> {
    let candidate = client.get(path).await?;
    if json {
        output::json(&candidate);
        return Ok(report_holds(&candidate, |_| ()));
    }
    output::fields(
        &candidate,
        &[
            "kind",
            "admission",
            "candidate_digest",
            "request_state",
            "attempt",
            "max_attempts",
            "maximum_window_seconds",
            "admission_window_purpose",
            "policy_revision",
        ],
    );
    println!("usage       {}", candidate["charged_usage"]);
    println!("limits      {}", candidate["limits"]);
    if !candidate["retained_outcome"].is_null() {
        println!("outcome     {}", candidate["retained_outcome"]);
    }
    Ok(report_holds(&candidate, |line| println!("{line}")))
}

/// Prints a saved action's status.
async fn show_status(client: &Client, path: &str, json: bool) -> Result<u8, CallError> {
    let status = client.get(path).await?;
    if json {
        output::json(&status);
    } else {
        output::fields(
            &status,
            &[
                "kind",
                "status",
                "run_id",
                "request_id",
                "action_id",
                "witness_digest",
                "admission_seal",
            ],
        );
        if !status["lease"].is_null() {
            println!("lease           {}", status["lease"]);
        }
    }
    Ok(exit::OK)
}
