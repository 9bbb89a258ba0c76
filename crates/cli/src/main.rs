//! `cairnctl`: operate a Cairn installation from a terminal or a script.
//!
//! Tables by default, `--json` for scripts. Exit codes: 0 success, 1 error (an
//! unreachable scheduler included: nothing was sent), 2 invalid usage, 3 not found,
//! 4 conflict, 5 rejected input, 6 access denied, 8 a watched run failed, 9 it was
//! cancelled, 10 it needs a person, 75 the outcome of a write is unknown (read its
//! status).

mod actions;
mod client;
mod commands;
mod output;

use cairn_common::config::{parse_or_exit, DatabaseArgs};
use cairn_common::ids::Id;
use clap::{Args, Parser, Subcommand};
use client::{exit, CallError, Client};
use commands::continuation::{continuation, ContinuationCommand};
use commands::credentials::{credentials, CredentialsCommand};
use commands::migrate::migrate;
use commands::policy::{policy, PolicyCommand};
use commands::publication::{publication, PublicationCommand};
use commands::qualification::{qualification, QualificationCommand};
use commands::reaper::{reaper, ReaperCommand};
use commands::reconciliation::{reconciliation, ReconciliationCommand};
use commands::runs::{runs, RunsCommand};
use commands::sandbox::{sandbox, SandboxCommand};
use commands::snapshot::{snapshot, SnapshotCommand};
use commands::template::{template, TemplateCommand};
use commands::tokens::{tenants, tokens, TenantCommand, TokenCommand};
use commands::verification;
use commands::volume::{volume, VolumeCommand};
use nix::sys::signal::{signal, SigHandler, Signal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Operate a Cairn installation.
#[derive(Debug, Parser)]
#[command(
    name = "cairnctl",
    version,
    about,
    after_help = "A run file is YAML or JSON: see \"A run\" in the README, or `cairnctl runs submit --help`.\nExit codes: 0 success, 1 error (the scheduler unreachable included), 2 usage, 3 not found,\n4 conflict, 5 rejected input, 6 access denied, 8 a watched run failed, 9 it was cancelled,\n10 it needs a person (needs_reconciliation, stopped_at_checkpoint, awaiting_verification),\n75 a write whose outcome is unknown (read its status before trying again)."
)]
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
        // A URL may carry credentials: help names the variable, never its value.
        hide_env_values = true,
        default_value = "http://127.0.0.1:8080"
    )]
    server: String,
    /// Bearer token.
    #[arg(long, global = true, env = "CAIRN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Seconds to wait for the scheduler's answer to each call.
    #[arg(
        long,
        global = true,
        env = "CAIRN_HTTP_TIMEOUT_SECONDS",
        default_value_t = 30
    )]
    http_timeout_seconds: u64,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Submit, list, show, watch and cancel runs.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// A run that needs a person: its uncertain steps, and a decision on each (mark done,
    /// mark not done, fail the run).
    #[command(subcommand)]
    Reconciliation(ReconciliationCommand),
    /// Sandboxes: create, list, show, exec, files, stop, pause, resume, extend, fork,
    /// destroy.
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// Sandbox snapshots: save, list, info, fork, delete, restore.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Templates: a named snapshot published as immutable versions to start from.
    #[command(subcommand)]
    Template(TemplateCommand),
    /// Volumes: storage on one worker's disk that a sandbox attaches, kept across its
    /// restarts.
    #[command(subcommand)]
    Volume(VolumeCommand),
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
    /// Publish a completed run's result as a patch; delivery holds.
    #[command(subcommand)]
    Publication(PublicationCommand),
    /// The source profiles continuations may run on: show, qualify, revoke.
    #[command(subcommand)]
    Qualification(QualificationCommand),
    /// The runs' queue and flow control: held, queued, executing, the workers' slots,
    /// and each concurrency or rate key.
    Queues,
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Manage tenants (projects): each token reaches only its tenant's runs, sandboxes
    /// and snapshots.
    #[command(subcommand)]
    Tenant(TenantCommand),
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

#[tokio::main]
async fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so a print to a closed pipe (`cairnctl … | head`) would
    // panic; like any Unix filter, cairnctl ends quietly instead.
    // SAFETY: SIG_DFL installs no handler of ours, and nothing else in this process
    // sets SIGPIPE's disposition.
    #[allow(unsafe_code)]
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
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

/// A repeated `--flag NAME=VALUE` as a map; a pair without `=`, or a name given twice,
/// is a usage error.
fn pairs(
    flag: &str,
    given: &[String],
) -> Result<std::collections::BTreeMap<String, String>, CallError> {
    let mut map = std::collections::BTreeMap::new();
    for pair in given {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| usage(format!("--{flag} {pair}: expected NAME=VALUE")))?;
        if map.insert(name.to_string(), value.to_string()).is_some() {
            return Err(usage(format!("--{flag} {name}: given twice")));
        }
    }
    Ok(map)
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
        http_timeout_seconds,
    } = cli.api;
    let client = || {
        Client::new(
            &server,
            token.clone(),
            Duration::from_secs(http_timeout_seconds.max(1)),
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
        Command::Reconciliation(command) => reconciliation(&client()?, command, json).await,
        Command::Sandbox(command) => sandbox(&client()?, command, json).await,
        Command::Snapshot(command) => snapshot(&client()?, command, json).await,
        Command::CheckpointContinuations(command) => {
            continuation(&client()?, "checkpoint-continuations", command, json).await
        }
        Command::FinalOutcomeContinuations(command) => {
            continuation(&client()?, "final-outcome-continuations", command, json).await
        }
        Command::Verification(command) => verification::command(&client()?, command, json).await,
        Command::Policy(command) => policy(&client()?, command, json).await,
        Command::Publication(command) => publication(&client()?, command, json).await,
        Command::Qualification(command) => qualification(&client()?, command, json).await,
        Command::Template(command) => template(&client()?, command, json).await,
        Command::Volume(command) => volume(&client()?, command, json).await,
        Command::Queues => commands::queues::queues(&client()?, json).await,
        Command::Token(command) => tokens(&client()?, command, json).await,
        Command::Tenant(command) => tenants(&client()?, command, json).await,
        Command::Credentials(command) => credentials(&client()?, command, json).await,
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::{CommandFactory, Parser};

    /// Every duration flag is spelled `--…-seconds` (the API's `timeout_sec` is taken
    /// as an alias where it is the field's name).
    #[test]
    fn every_duration_flag_is_in_seconds_by_one_spelling() {
        fn walk(command: &clap::Command, path: &str, found: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                let timed = ["timeout", "interval", "wait", "window"]
                    .iter()
                    .any(|w| long.contains(w))
                    && arg.get_action().takes_values();
                if long.ends_with("-sec") || (timed && !long.ends_with("-seconds")) {
                    found.push(format!("{path} --{long}"));
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), found);
            }
        }
        let mut found = Vec::new();
        walk(&Cli::command(), "cairnctl", &mut found);
        assert!(found.is_empty(), "{found:?}");
        let id = "0123456789abcdef0123456789abcdef";
        for flag in ["--timeout-seconds", "--timeout-sec"] {
            let parsed =
                Cli::try_parse_from(["cairnctl", "sandbox", "exec", id, flag, "5", "--", "true"]);
            assert!(parsed.is_ok(), "{flag}: {parsed:?}");
        }
    }

    /// Every argument of every command says what it is in `--help`.
    #[test]
    fn help_documents_every_argument() {
        fn undocumented(command: &clap::Command, path: &str, found: &mut Vec<String>) {
            let path = format!("{path} {}", command.get_name());
            for arg in command.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    found.push(format!("{path}: {}", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    found.push(format!("{path} {}: no description", sub.get_name()));
                }
                undocumented(sub, &path, found);
            }
        }
        let mut found = Vec::new();
        undocumented(&Cli::command(), "", &mut found);
        assert!(found.is_empty(), "undocumented:\n{}", found.join("\n"));
    }
}
