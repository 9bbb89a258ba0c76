//! `cairnctl sandbox exec`: one command in a sandbox, its output printed as the command
//! prints it (followed from the API), then its exit status as `cairnctl`'s.

use crate::client::{exit, CallError, Client};
use crate::commands::logs::{print_events, Stream};
use crate::{id, output};
use reqwest::Method;
use serde_json::{json, Value};
use std::io::Write;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The sandbox's id (32 lowercase hex characters).
    pub sandbox: String,
    /// Working directory, relative to the tree.
    #[arg(long)]
    pub cwd: Option<String>,
    /// `NAME=VALUE`, repeatable.
    #[arg(long = "env")]
    pub env: Vec<String>,
    /// Seconds the command may run before it is stopped, 1 to 86400.
    #[arg(long = "timeout-seconds", alias = "timeout-sec", default_value_t = 60)]
    pub timeout_sec: u32,
    /// Reach the network (`true`) or not (`false`); default the worker's.
    #[arg(long)]
    pub network: Option<bool>,
    /// The program and its arguments (after `--`).
    #[arg(required = true, last = true)]
    pub argv: Vec<String>,
}

pub async fn exec(client: &Client, args: ExecArgs, json: bool) -> Result<u8, CallError> {
    let ExecArgs {
        sandbox,
        cwd,
        env,
        timeout_sec,
        network,
        argv,
    } = args;
    let sandbox = id(&sandbox, "the sandbox id")?;
    let vars = crate::pairs("env", &env)?;
    let mut body = json!({"argv": argv, "env": vars, "timeout_sec": timeout_sec});
    if let Some(cwd) = cwd {
        body["cwd"] = Value::from(cwd);
    }
    if let Some(network) = network {
        body["network"] = Value::from(network);
    }
    if json {
        // The receipt, whole, once the command ended.
        let path = format!("/api/v1/sandboxes/{sandbox}/exec");
        let answer = client.call(Method::POST, &path, Some(&body), &[]).await?;
        return exec_result(&answer.body, answer.status.as_u16(), json);
    }
    // The output as it is printed, then the receipt's exit status.
    let path = format!("/api/v1/sandboxes/{sandbox}/exec?wait=false");
    let answer = client.call(Method::POST, &path, Some(&body), &[]).await?;
    if answer.status.as_u16() != 202 {
        return exec_result(&answer.body, answer.status.as_u16(), json);
    }
    let operation = output::text(&answer.body["operation_id"]);
    let base = format!("/api/v1/sandboxes/{sandbox}/operations/{operation}");
    let streamed = stream_output(client, &base).await;
    // The scheduler waits a minute for a worker to start the exec, then the command
    // has its timeout: after both and a margin, its end is not coming.
    let limit = Duration::from_secs(60 + u64::from(timeout_sec) + 60);
    let receipt = until_ended(client, &base, limit).await?;
    match streamed {
        Ok(()) => exec_status(&receipt),
        // Where the output could not be followed at all (a store this scheduler does
        // not reach), the receipt's tails are what there is.
        Err((e, false)) => {
            eprintln!("(the output could not be followed: {e}; its receipt's tails follow)");
            exec_result(&receipt, 200, json)
        }
        // Part of it was printed: the tails would print it twice.
        Err((e, true)) => {
            eprintln!(
                "(the output stream broke: {e}; the rest is in `cairnctl sandbox operations`)"
            );
            exec_status(&receipt)
        }
    }
}

/// Prints the exec's stdout and stderr, each to its own stream, as they are printed.
/// An error says whether any of it was printed before.
async fn stream_output(client: &Client, base: &str) -> Result<(), (CallError, bool)> {
    let mut printing = Vec::new();
    for stream in [Stream::Stdout, Stream::Stderr] {
        let name = if stream == Stream::Stdout {
            "stdout"
        } else {
            "stderr"
        };
        let response = client
            .open_stream(&format!("{base}/output?stream={name}&follow=true"))
            .await
            .map_err(|e| (e, false))?;
        printing.push(print_events(response, stream));
    }
    for ended in futures::future::join_all(printing).await {
        ended.map_err(|e| (e, true))?;
    }
    Ok(())
}

/// The operation once it has ended (its receipt, or `interrupted`), waited for at most
/// `limit`.
pub(super) async fn until_ended(
    client: &Client,
    base: &str,
    limit: Duration,
) -> Result<Value, CallError> {
    let started = std::time::Instant::now();
    loop {
        let operation = client.get(base).await?;
        if !matches!(operation["state"].as_str(), Some("pending" | "running")) {
            return Ok(operation);
        }
        if started.elapsed() >= limit {
            let state = output::text(&operation["state"]);
            return Err(CallError::new(
                exit::NOT_COMPLETED,
                format!("the exec is still {state} after {} s; follow it with: cairnctl sandbox operations", limit.as_secs()),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn exec_result(receipt: &Value, status: u16, json: bool) -> Result<u8, CallError> {
    if json {
        output::json(receipt);
    }
    if status == 202 {
        if !json {
            println!("still running: see `cairnctl sandbox operations`");
        }
        return Ok(exit::OK);
    }
    let result = &receipt["result"];
    if let Some(error) = result["error"].as_str() {
        return Err(CallError::new(exit::ERROR, error.to_string()));
    }
    if !json {
        print!("{}", output::text(&result["stdout"]));
        eprint!("{}", output::text(&result["stderr"]));
        let _ = std::io::stdout().flush();
        if result["truncated"] == true {
            eprintln!("(output truncated)");
        }
    }
    exec_status(receipt)
}

/// The command's exit status as `cairnctl`'s; an exec that could not run is an error.
pub(super) fn exec_status(receipt: &Value) -> Result<u8, CallError> {
    let result = &receipt["result"];
    if let Some(error) = result["error"].as_str() {
        return Err(CallError::new(exit::ERROR, error.to_string()));
    }
    if receipt["state"] == "interrupted" {
        return Err(CallError::new(
            exit::ERROR,
            "the exec was interrupted (its sandbox stopped or its worker was lost)",
        ));
    }
    let code = result["exit_code"].as_i64();
    Ok(code
        .and_then(|c| u8::try_from(c).ok())
        .unwrap_or(exit::ERROR))
}
