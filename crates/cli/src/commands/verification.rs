//! `cairnctl verification`: read a run's pending handoff, adopt its frozen checks once
//! (the request id and exact document saved locally first), and follow the adoption.

use crate::client::{exit, CallError, Client};
use crate::{actions, id, output, read_document};
use cairn_common::ids::Id;
use clap::Subcommand;
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum VerificationCommand {
    /// Inspect the run's pending handoff: its digests, frozen checks and the checks that
    /// may be declared reusable. Starts no work.
    Candidates {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// The provider the verification runs under (the run's agent).
        #[arg(long)]
        agent: String,
        /// Print an adoption document for this candidate, with a new request id.
        #[arg(long)]
        template: bool,
        /// With --template: declare these checks (1-based) reusable.
        #[arg(long, value_delimiter = ',')]
        reuse: Vec<usize>,
    },
    /// Adopt the frozen checks: records the document's request_id and the exact
    /// DOCUMENT locally, then POSTs once. Never retries and never invents another id.
    Adopt {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// The JSON body (`-` for stdin).
        document: PathBuf,
        /// Where records are kept (default: $XDG_STATE_HOME/cairn/actions).
        #[arg(long, env = "CAIRN_STATE_DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Read a saved adoption and every check's result (executed or reused).
    Status {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// The adoption's `request_id`, from its document (32 lowercase hex characters).
        request_id: String,
    },
}

pub async fn command(
    client: &Client,
    command: VerificationCommand,
    json: bool,
) -> Result<u8, CallError> {
    match command {
        VerificationCommand::Candidates {
            run,
            agent,
            template,
            reuse,
        } => candidates(client, run, agent, template, reuse, json).await,
        VerificationCommand::Adopt {
            run,
            document,
            state_dir,
        } => adopt(client, &id(&run, "RUN")?, &document, state_dir, json).await,
        VerificationCommand::Status { run, request_id } => {
            let path = format!(
                "/api/v1/runs/{}/verification-handoffs/adoptions/{}",
                id(&run, "RUN")?,
                id(&request_id, "REQUEST_ID")?
            );
            let adoption = client.get(&path).await?;
            if json {
                output::json(&adoption);
            } else {
                output::fields(
                    &adoption,
                    &[
                        "status",
                        "handoff_state",
                        "request_id",
                        "run_id",
                        "agent",
                        "stop_reason",
                        "input_digest",
                        "policy_digest",
                    ],
                );
                let rows: Vec<Vec<String>> = adoption["results"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|r| {
                        vec![
                            output::text(&r["index"]),
                            output::text(&r["display"]),
                            if r["passed"] == true {
                                "passed"
                            } else {
                                "failed"
                            }
                            .to_string(),
                            output::text(&r["confined"]),
                            output::text(&r["reusable"]),
                            output::text(&r["exit_code"]),
                            output::text(&r["fresh_reason"]),
                        ]
                    })
                    .collect();
                output::table(
                    &[
                        "check",
                        "result",
                        "status",
                        "confined",
                        "reusable",
                        "exit",
                        "fresh reason",
                    ],
                    &rows,
                );
            }
            Ok(exit::OK)
        }
    }
}

async fn candidates(
    client: &Client,
    run: String,
    agent: String,
    template: bool,
    reuse: Vec<usize>,
    json: bool,
) -> Result<u8, CallError> {
    let run = id(&run, "RUN")?;
    let valid_agent = !agent.is_empty()
        && agent
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !valid_agent {
        return Err(CallError::new(
            exit::USAGE,
            "AGENT is letters, digits, '.', '_' or '-'",
        ));
    }
    let candidate = client
        .get(&format!(
            "/api/v1/runs/{run}/verification-handoffs/candidates?agent={agent}"
        ))
        .await?;
    if template {
        output::json(&adoption_template(&candidate, &reuse)?);
        return Ok(exit::OK);
    }
    if json {
        output::json(&candidate);
    } else {
        print_candidate(&candidate);
        for hold in candidate["holds"].as_array().into_iter().flatten() {
            println!("held: {}", output::text(hold));
        }
    }
    Ok(if candidate["admission"] == "READY" {
        exit::OK
    } else {
        exit::CONFLICT
    })
}

/// A candidate's digests and its checks, each saying whether it may be reused.
fn print_candidate(candidate: &Value) {
    output::fields(
        candidate,
        &[
            "admission",
            "run_id",
            "request_id",
            "handoff_id",
            "agent",
            "pending_request_digest",
            "source_digest",
            "commands_digest",
            "policy_digest",
            "provider_digest",
        ],
    );
    println!("budget                  {}", candidate["budget"]);
    let reusable: Vec<&Value> = candidate["reusable_build_candidates"]
        .as_array()
        .map(|a| a.iter().map(|c| &c["command_digest"]).collect())
        .unwrap_or_default();
    let rows: Vec<Vec<String>> = candidate["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            vec![
                output::text(&c["index"]),
                output::text(&c["purpose"]),
                if reusable.contains(&&c["command_digest"]) {
                    "yes"
                } else {
                    "no"
                }
                .to_string(),
                output::text(&c["command_digest"]),
                output::text(&c["arguments"]),
            ]
        })
        .collect();
    output::table(
        &[
            "check",
            "purpose",
            "reusable",
            "command_digest",
            "arguments",
        ],
        &rows,
    );
}

/// An adoption document for the candidate as it is now, with a new request id.
fn adoption_template(candidate: &Value, reuse: &[usize]) -> Result<Value, CallError> {
    let mut selected = Vec::new();
    for index in reuse {
        let offered = candidate["reusable_build_candidates"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["index"] == json!(index));
        let Some(offered) = offered else {
            return Err(CallError::new(
                exit::REJECTED,
                format!("check {index} is not among the candidate's reusable_build_candidates"),
            ));
        };
        selected.push(json!({
            "command_digest": offered["command_digest"],
            "purpose": "source_build",
            "independent_of_time_and_external_state": true
        }));
    }
    Ok(json!({
        "request_id": Id::new().to_string(),
        "agent": candidate["agent"],
        "pending_request_digest": candidate["pending_request_digest"],
        "source_digest": candidate["source_digest"],
        "commands_digest": candidate["commands_digest"],
        "policy_digest": candidate["policy_digest"],
        "provider_digest": candidate["provider_digest"],
        "reusable_build_checks": selected
    }))
}

async fn adopt(
    client: &Client,
    run: &str,
    document: &PathBuf,
    state_dir: Option<PathBuf>,
    json: bool,
) -> Result<u8, CallError> {
    let text = read_document(document)?;
    let body: Value = serde_json::from_str(&text).map_err(|e| {
        CallError::new(
            exit::REJECTED,
            format!("{}: not JSON: {e}", document.display()),
        )
    })?;
    let request_id = body["request_id"]
        .as_str()
        .ok_or_else(|| CallError::new(exit::REJECTED, "the document needs a request_id"))
        .and_then(|r| id(r, "request_id"))?;
    let dir = actions::state_dir(state_dir.as_deref());
    let status_hint = format!("cairnctl verification status {run} {request_id}");
    let record = actions::SavedAction::unsubmitted(
        "verification_adoption",
        run,
        &request_id,
        &request_id,
        body,
    );
    let path = format!("/api/v1/runs/{run}/verification-handoffs/adoptions");
    let (answer, saved_path) =
        actions::submit_once(client, &dir, record, &path, &status_hint).await?;
    if json {
        output::json(&answer.body);
    } else {
        let what = format!("adopted {request_id}");
        actions::print_submitted(&answer, &saved_path, &what, &[], &status_hint);
    }
    Ok(exit::OK)
}
