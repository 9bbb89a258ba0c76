//! `cairnctl`: operate a Cairn installation from a terminal or a script.
//!
//! Tables by default, `--json` for scripts. Exit codes: 0 success, 1 error, 2 invalid
//! usage, 3 not found, 4 conflict, 5 rejected input, 6 access denied, 8 a watched run
//! ended without completing, 75 the outcome of a write is unknown (read its status).

mod actions;
mod client;
mod output;
mod verification;

use cairn_common::config::{parse_or_exit, DatabaseArgs};
use cairn_common::ids::Id;
use cairn_common::run::RunSpec;
use clap::{Args, Parser, Subcommand};
use client::{exit, CallError, Client};
use reqwest::Method;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Operate a Cairn installation.
#[derive(Debug, Parser)]
#[command(name = "cairnctl", version, about)]
struct Cli {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
struct ApiArgs {
    /// The scheduler's base URL.
    #[arg(
        long,
        global = true,
        env = "CAIRN_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    server: String,
    /// Bearer token.
    #[arg(long, global = true, env = "CAIRN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Seconds to wait for an answer.
    #[arg(
        long,
        global = true,
        env = "CAIRN_TIMEOUT_SECONDS",
        default_value_t = 30
    )]
    timeout_seconds: u64,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Submit, list, show, watch and cancel runs.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Reviewed continuation of a request stopped at its retained checkpoint.
    #[command(subcommand, name = "checkpoint-continuations")]
    CheckpointContinuations(ContinuationCommand),
    /// Reviewed acceptance of a retained final report.
    #[command(subcommand, name = "final-outcome-continuations")]
    FinalOutcomeContinuations(ContinuationCommand),
    /// Verification handoffs: candidates, adoption of the frozen checks, their results.
    #[command(subcommand)]
    Verification(verification::VerificationCommand),
    /// Read or change the saved-work recovery policy.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Rotate an agent's credentials: its snapshots are retired from reuse.
    #[command(subcommand)]
    Credentials(CredentialsCommand),
    /// The reaper's last sweep and the artifacts waiting for operator repair (reads the
    /// database directly).
    #[command(subcommand)]
    Reaper(ReaperCommand),
    /// Create the database if missing and apply every pending migration.
    Migrate {
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Print a new random id (32 lowercase hex) to use as an action id.
    NewId,
}

#[derive(Debug, Subcommand)]
enum RunsCommand {
    /// Submit a run described in a YAML or JSON file (`-` for stdin).
    Submit {
        file: PathBuf,
        /// Same key and body: the same run; same key, other body: refused.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// List runs, newest first.
    List {
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Show one run.
    Show { run: String },
    /// Follow a run until it ends; exit 0 only when it completed.
    Watch {
        run: String,
        #[arg(long, default_value_t = 1.0)]
        interval_seconds: f64,
    },
    /// Cancel a run.
    Cancel { run: String },
    /// Pause a running run: its step's processes stop and a checkpoint is captured
    /// before the paused reply. Pausing a paused run shows its pause again.
    Pause {
        run: String,
        /// Seconds to wait for the worker's capture (0 to 60).
        #[arg(long, default_value_t = 30)]
        wait_seconds: u64,
    },
    /// Resume a paused run: its step's processes continue.
    Resume {
        run: String,
        /// Seconds to wait for the worker (0 to 60).
        #[arg(long, default_value_t = 30)]
        wait_seconds: u64,
    },
    /// Show a run's journal: every step's intent and receipt.
    Journal { run: String },
    /// Show a run's execution requests.
    Requests { run: String },
}

#[derive(Debug, Subcommand)]
enum ContinuationCommand {
    /// Inspect the current candidate; starts no work.
    Candidate { run: String, request: String },
    /// Save one reviewed action: records ACTION and the exact DOCUMENT locally, then
    /// POSTs once. Never retries and never invents another id.
    Request {
        run: String,
        request: String,
        action: String,
        /// The JSON body (`-` for stdin).
        document: PathBuf,
        /// Where action records are kept (default: $XDG_STATE_HOME/cairn/actions).
        #[arg(long, env = "CAIRN_STATE_DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Read the saved action and its worker status.
    Status { run: String, request: String },
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Show the policy.
    Get,
    /// Change the named settings; the others keep their values.
    Set {
        #[arg(long)]
        enabled: Option<bool>,
        #[arg(long)]
        allow_checkpoint_continuation: Option<bool>,
        #[arg(long)]
        allow_final_outcome_continuation: Option<bool>,
        #[arg(long)]
        maximum_window_seconds: Option<u32>,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create a token with a role (admin, operator, viewer); prints the secret once.
    Create {
        #[arg(long)]
        role: String,
        #[arg(long, default_value = "cairnctl")]
        name: String,
    },
    /// Revoke a token by id.
    Revoke { token_id: String },
}

#[derive(Debug, Subcommand)]
enum ReaperCommand {
    /// The last sweeps: when, who led, what each rule did.
    Status {
        #[command(flatten)]
        database: DatabaseArgs,
        #[arg(long, default_value_t = 5)]
        limit: i64,
    },
    /// Artifacts that could not be deleted, with the reason and the next retry.
    Pending {
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[derive(Debug, Subcommand)]
enum CredentialsCommand {
    /// Start a new credential generation for AGENT.
    Rotate { agent: String },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli: Cli = parse_or_exit();
    match run(cli).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

fn usage(message: impl Into<String>) -> CallError {
    CallError::new(exit::USAGE, message)
}

fn id(text: &str, what: &str) -> Result<String, CallError> {
    text.parse::<Id>().map(|id| id.to_string()).map_err(|_| {
        usage(format!(
            "{what} must be exactly 32 lowercase hexadecimal characters"
        ))
    })
}

fn read_document(path: &PathBuf) -> Result<String, CallError> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| usage(format!("cannot read stdin: {e}")))?;
        Ok(text)
    } else {
        std::fs::read_to_string(path)
            .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))
    }
}

async fn run(cli: Cli) -> Result<u8, CallError> {
    let ApiArgs {
        server,
        token,
        json,
        timeout_seconds,
    } = cli.api;
    let client = || {
        Client::new(
            &server,
            token.clone(),
            Duration::from_secs(timeout_seconds.max(1)),
        )
    };
    match cli.command {
        Command::Migrate { database } => migrate(&database).await,
        Command::Reaper(command) => reaper(command, json).await,
        Command::NewId => {
            println!("{}", Id::new());
            Ok(exit::OK)
        }
        Command::Runs(command) => runs(&client()?, command, json).await,
        Command::CheckpointContinuations(command) => {
            continuation(&client()?, "checkpoint-continuations", command, json).await
        }
        Command::FinalOutcomeContinuations(command) => {
            continuation(&client()?, "final-outcome-continuations", command, json).await
        }
        Command::Verification(command) => verification::command(&client()?, command, json).await,
        Command::Policy(command) => policy(&client()?, command, json).await,
        Command::Token(command) => tokens(&client()?, command, json).await,
        Command::Credentials(CredentialsCommand::Rotate { agent }) => {
            let answer = client()?
                .call(
                    Method::POST,
                    &format!("/api/v1/agents/{agent}/credentials/rotate"),
                    None,
                    &[],
                )
                .await?;
            if json {
                output::json(&answer.body);
            } else {
                println!(
                    "agent {agent} is at credential generation {}; {} snapshots retired from reuse",
                    output::text(&answer.body["generation"]),
                    output::text(&answer.body["snapshots_retired"])
                );
            }
            Ok(exit::OK)
        }
    }
}

async fn migrate(database: &DatabaseArgs) -> Result<u8, CallError> {
    if let Err(e) = cairn_common::db::validate_url(&database.database_url) {
        cairn_common::config::exit_invalid(format!("CAIRN_DATABASE_URL: {e}"));
    }
    let failed =
        |e: &dyn std::fmt::Display| CallError::new(exit::ERROR, format!("migration failed: {e}"));
    let pool = cairn_common::db::connect(&database.database_url, 2)
        .await
        .map_err(|e| failed(&e))?;
    cairn_common::db::migrate(&pool)
        .await
        .map_err(|e| failed(&e))?;
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(&pool)
        .await
        .map_err(|e| failed(&e))?;
    println!("database is up to date ({applied} migrations applied)");
    Ok(exit::OK)
}

fn run_row(run: &Value) -> Vec<String> {
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
    ]
}

const RUN_HEADER: [&str; 6] = ["run", "state", "agent", "attempt", "commands", "created"];

fn show_run(run: &Value) {
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

async fn runs(client: &Client, command: RunsCommand, json: bool) -> Result<u8, CallError> {
    match command {
        RunsCommand::Submit {
            file,
            idempotency_key,
        } => {
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
        RunsCommand::List {
            state,
            limit,
            cursor,
        } => {
            let mut query = format!("?limit={limit}");
            if let Some(state) = state {
                query.push_str(&format!("&state={state}"));
            }
            if let Some(cursor) = cursor {
                query.push_str(&format!("&cursor={cursor}"));
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
        RunsCommand::Show { run } => {
            let run = client
                .get(&format!("/api/v1/runs/{}", id(&run, "RUN")?))
                .await?;
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
        } => watch(client, &id(&run, "RUN")?, interval_seconds, json).await,
        RunsCommand::Cancel { run } => {
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
                println!("cancel requested: the worker holding run {run} stops it within one lease renewal");
            } else {
                println!("run {run} is {}", output::text(&answer.body["state"]));
            }
            Ok(exit::OK)
        }
        RunsCommand::Pause { run, wait_seconds } => {
            let run = id(&run, "RUN")?;
            let path = format!("/api/v1/runs/{run}/pause?wait_seconds={wait_seconds}");
            let answer = client.call(Method::POST, &path, None, &[]).await?;
            if json {
                output::json(&answer.body);
            } else if answer.status.as_u16() == 202 {
                println!(
                    "pausing: the worker has not recorded the pause yet; run this again to see it"
                );
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
        RunsCommand::Resume { run, wait_seconds } => {
            let run = id(&run, "RUN")?;
            let path = format!("/api/v1/runs/{run}/resume?wait_seconds={wait_seconds}");
            let answer = client.call(Method::POST, &path, None, &[]).await?;
            if json {
                output::json(&answer.body);
            } else if answer.status.as_u16() == 202 {
                println!("resuming: the worker has not continued the step yet");
            } else {
                println!("run {run} is running again");
            }
            Ok(exit::OK)
        }
        RunsCommand::Journal { run } => {
            let journal = client
                .get(&format!("/api/v1/runs/{}/journal", id(&run, "RUN")?))
                .await?;
            if json {
                output::json(&journal);
            } else {
                let rows: Vec<Vec<String>> = journal["steps"]
                    .as_array()
                    .map(|steps| {
                        steps
                            .iter()
                            .map(|s| {
                                vec![
                                    output::text(&s["step_key"]),
                                    output::text(&s["status"]),
                                    output::text(&s["exit_code"]),
                                    output::text(&s["wall_ms"]),
                                    output::text(&s["intent_epoch"]),
                                    output::text(&s["receipt_epoch"]),
                                    output::text(&s["tree_tier"]),
                                    // The snapshot holding the step's effects.
                                    s["snapshot_id"]
                                        .as_str()
                                        .map(|id| id.chars().take(12).collect())
                                        .unwrap_or_else(|| "-".into()),
                                ]
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                output::table(
                    &[
                        "step",
                        "status",
                        "exit",
                        "wall_ms",
                        "intent_epoch",
                        "receipt_epoch",
                        "tree",
                        "snapshot",
                    ],
                    &rows,
                );
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
        RunsCommand::Requests { run } => {
            let list = client
                .get(&format!(
                    "/api/v1/runs/{}/execution-requests",
                    id(&run, "RUN")?
                ))
                .await?;
            if json {
                output::json(&list);
            } else {
                let rows: Vec<Vec<String>> = list["execution_requests"]
                    .as_array()
                    .map(|r| {
                        r.iter()
                            .map(|e| {
                                vec![
                                    output::text(&e["request_id"]),
                                    output::text(&e["kind"]),
                                    output::text(&e["state"]),
                                    output::text(&e["attempt"]),
                                    output::text(&e["lease_epoch"]),
                                    output::text(&e["lease_owner"]),
                                ]
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                output::table(
                    &["request", "kind", "state", "attempt", "epoch", "owner"],
                    &rows,
                );
            }
            Ok(exit::OK)
        }
    }
}

const ENDED: [&str; 6] = [
    "completed",
    "failed",
    "cancelled",
    "stopped_at_checkpoint",
    "needs_reconciliation",
    "awaiting_verification",
];

async fn watch(client: &Client, run: &str, interval: f64, json: bool) -> Result<u8, CallError> {
    let interval = Duration::from_secs_f64(interval.clamp(0.1, 60.0));
    let mut last = String::new();
    loop {
        // Reads are safe to repeat: an unanswered poll is simply tried again.
        let current = match client.get(&format!("/api/v1/runs/{run}")).await {
            Ok(value) => value,
            Err(e) if e.code == exit::UNCERTAIN => {
                eprintln!("watch: {e}; retrying");
                tokio::time::sleep(interval).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let state = output::text(&current["state"]);
        let line = format!(
            "{state} attempt {}/{} commands {}/{}",
            output::text(&current["attempt"]),
            output::text(&current["max_attempts"]),
            output::text(&current["usage"]["commands"]),
            output::text(&current["budgets"]["max_commands"]),
        );
        if line != last {
            if json {
                println!("{current}");
            } else {
                println!("{}  {line}", chrono::Utc::now().format("%H:%M:%S"));
            }
            last = line;
        }
        if ENDED.contains(&state.as_str()) {
            return Ok(if state == "completed" {
                exit::OK
            } else {
                exit::NOT_COMPLETED
            });
        }
        tokio::time::sleep(interval).await;
    }
}

async fn continuation(
    client: &Client,
    route: &str,
    command: ContinuationCommand,
    json: bool,
) -> Result<u8, CallError> {
    let kind = route.trim_end_matches('s').replace('-', "_");
    match command {
        ContinuationCommand::Candidate { run, request } => {
            let path = format!(
                "/api/v1/runs/{}/{route}/requests/{}/candidate",
                id(&run, "RUN")?,
                id(&request, "REQUEST")?
            );
            let candidate = client.get(&path).await?;
            if json {
                output::json(&candidate);
            } else {
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
                for hold in candidate["holds"].as_array().into_iter().flatten() {
                    println!(
                        "held: {} — {}",
                        output::text(&hold["reason"]),
                        output::text(&hold["message"])
                    );
                }
            }
            Ok(if candidate["admission"] == "READY" {
                exit::OK
            } else {
                exit::CONFLICT
            })
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
            if !body.is_object() {
                return Err(CallError::new(
                    exit::REJECTED,
                    "the document must be a JSON object",
                ));
            }
            let dir = actions::state_dir(state_dir.as_deref());
            let status_hint = format!("cairnctl {route} status {run} {request}");
            let record = actions::SavedAction {
                kind: kind.clone(),
                run_id: run.clone(),
                request_id: request.clone(),
                action_id: action.clone(),
                body,
                saved_at: chrono::Utc::now().to_rfc3339(),
                outcome: "unsubmitted".into(),
            };
            let path = format!("/api/v1/runs/{run}/{route}/requests/{request}/actions/{action}");
            let (answer, saved_path) =
                actions::submit_once(client, &dir, record, &path, &status_hint).await?;
            if json {
                output::json(&answer.body);
            } else {
                println!(
                    "saved action {action} ({}); record: {}",
                    output::text(&answer.body["status"]),
                    saved_path.display()
                );
                output::fields(&answer.body, &["witness_digest", "admission_seal"]);
                println!("follow it with: {status_hint}");
            }
            Ok(exit::OK)
        }
        ContinuationCommand::Status { run, request } => {
            let path = format!(
                "/api/v1/runs/{}/{route}/requests/{}/status",
                id(&run, "RUN")?,
                id(&request, "REQUEST")?
            );
            let status = client.get(&path).await?;
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
    }
}

async fn policy(client: &Client, command: PolicyCommand, json: bool) -> Result<u8, CallError> {
    let path = "/api/v1/invalid-read-continuity/policy";
    let policy = match command {
        PolicyCommand::Get => client.get(path).await?,
        PolicyCommand::Set {
            enabled,
            allow_checkpoint_continuation,
            allow_final_outcome_continuation,
            maximum_window_seconds,
        } => {
            let mut change = serde_json::Map::new();
            let mut put = |name: &str, value: Option<Value>| {
                if let Some(value) = value {
                    change.insert(name.to_string(), value);
                }
            };
            put("enabled", enabled.map(Value::from));
            put(
                "allow_checkpoint_continuation",
                allow_checkpoint_continuation.map(Value::from),
            );
            put(
                "allow_final_outcome_continuation",
                allow_final_outcome_continuation.map(Value::from),
            );
            put(
                "maximum_window_seconds",
                maximum_window_seconds.map(Value::from),
            );
            if change.is_empty() {
                return Err(usage("name at least one setting to change"));
            }
            client
                .call(Method::PUT, path, Some(&Value::Object(change)), &[])
                .await?
                .body
        }
    };
    if json {
        output::json(&policy);
    } else {
        output::fields(
            &policy,
            &[
                "enabled",
                "allow_checkpoint_continuation",
                "allow_final_outcome_continuation",
                "maximum_window_seconds",
                "revision",
                "updated_at",
            ],
        );
    }
    Ok(exit::OK)
}

async fn tokens(client: &Client, command: TokenCommand, json: bool) -> Result<u8, CallError> {
    let body = match command {
        TokenCommand::Create { role, name } => {
            if !["admin", "operator", "viewer"].contains(&role.as_str()) {
                return Err(usage("--role is admin, operator or viewer"));
            }
            client
                .call(
                    Method::POST,
                    "/api/v1/tokens",
                    Some(&json!({"name": name, "role": role})),
                    &[],
                )
                .await?
                .body
        }
        TokenCommand::Revoke { token_id } => {
            client
                .call(
                    Method::POST,
                    &format!("/api/v1/tokens/{}/revoke", id(&token_id, "TOKEN_ID")?),
                    None,
                    &[],
                )
                .await?
                .body
        }
    };
    if json {
        output::json(&body);
    } else if let Some(token) = body["token"].as_str() {
        println!("token_id  {}", output::text(&body["token_id"]));
        println!("role      {}", output::text(&body["role"]));
        println!("token     {token}");
        println!("(the token is shown once; store it now)");
    } else {
        println!("revoked {}", output::text(&body["token_id"]));
    }
    Ok(exit::OK)
}

async fn connect_database(args: &DatabaseArgs) -> Result<sqlx::PgPool, CallError> {
    if let Err(e) = cairn_common::db::validate_url(&args.database_url) {
        cairn_common::config::exit_invalid(format!("CAIRN_DATABASE_URL: {e}"));
    }
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&args.database_url)
        .await
        .map_err(|e| CallError::new(exit::UNCERTAIN, format!("cannot reach PostgreSQL: {e}")))
}

type Timestamp = chrono::DateTime<chrono::Utc>;
/// started, finished, dry run, summary.
type SweepRow = (Timestamp, Option<Timestamp>, bool, Value);
/// id, kind, store, reason, attempts, next retry.
type PendingRow = (
    uuid::Uuid,
    String,
    String,
    Option<String>,
    i32,
    Option<Timestamp>,
);

async fn reaper(command: ReaperCommand, json: bool) -> Result<u8, CallError> {
    let failed = |e: sqlx::Error| CallError::new(exit::ERROR, format!("query failed: {e}"));
    match command {
        ReaperCommand::Status { database, limit } => {
            let pool = connect_database(&database).await?;
            let rows: Vec<SweepRow> = sqlx::query_as(
                "SELECT started_at, finished_at, dry_run, summary FROM sweeps WHERE component = 'reaper' ORDER BY id DESC LIMIT $1",
            )
            .bind(limit.clamp(1, 1000))
            .fetch_all(&pool)
            .await
            .map_err(failed)?;
            if json {
                let list: Vec<Value> = rows
                    .iter()
                    .map(|(s, f, d, summary)| json!({"started_at": s, "finished_at": f, "dry_run": d, "summary": summary}))
                    .collect();
                output::json(&Value::Array(list));
            } else if rows.is_empty() {
                println!("no sweep has run yet");
            } else {
                let table: Vec<Vec<String>> = rows
                    .iter()
                    .map(|(started, finished, _, s)| {
                        vec![
                            started.to_rfc3339(),
                            finished
                                .map(|f| format!("{} ms", (f - *started).num_milliseconds()))
                                .unwrap_or_default(),
                            output::text(&s["leader"]),
                            output::text(&s["idle_heads_retired"]),
                            output::text(&s["snapshots_reclaimed"]),
                            output::text(&s["bytes_reclaimed"]),
                            output::text(&s["holds_ended"]),
                            output::text(&s["credential_retired"]),
                            output::text(&s["sandbox_retired"]),
                            output::text(&s["reclaim_failed"]),
                        ]
                    })
                    .collect();
                output::table(
                    &[
                        "started",
                        "took",
                        "leader",
                        "idle",
                        "reclaimed",
                        "bytes",
                        "holds",
                        "credentials",
                        "sandbox",
                        "failed",
                    ],
                    &table,
                );
            }
            Ok(exit::OK)
        }
        ReaperCommand::Pending { database } => {
            let pool = connect_database(&database).await?;
            let rows: Vec<PendingRow> = sqlx::query_as(
                "SELECT id, kind, store_url, repair_reason, repair_attempts, next_repair_at FROM project_snapshots
                  WHERE retention = 'pending_operator_repair' ORDER BY next_repair_at",
            )
            .fetch_all(&pool)
            .await
            .map_err(failed)?;
            if json {
                let list: Vec<Value> = rows
                    .iter()
                    .map(|(id, kind, store, reason, attempts, next)| {
                        json!({"snapshot_id": id.simple().to_string(), "kind": kind, "store_url": store, "reason": reason,
                               "attempts": attempts, "next_retry_at": next})
                    })
                    .collect();
                output::json(&Value::Array(list));
            } else {
                let table: Vec<Vec<String>> = rows
                    .iter()
                    .map(|(id, kind, store, reason, attempts, next)| {
                        vec![
                            id.simple().to_string(),
                            kind.clone(),
                            store.clone(),
                            attempts.to_string(),
                            next.map(|n| n.to_rfc3339()).unwrap_or_default(),
                            reason.clone().unwrap_or_default(),
                        ]
                    })
                    .collect();
                output::table(
                    &[
                        "snapshot",
                        "kind",
                        "store",
                        "attempts",
                        "next retry",
                        "reason",
                    ],
                    &table,
                );
            }
            Ok(exit::OK)
        }
    }
}
