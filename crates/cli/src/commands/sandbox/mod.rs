//! `cairnctl sandbox`: create, list, show, exec, files, stop, pause, resume, extend, fork
//! and destroy sandboxes, and read their journal of operations.

use crate::client::{exit, CallError, Client};
use crate::{id, output, usage};
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;

mod create;
mod exec;
mod service;
mod shell;
mod view;
pub use create::CreateArgs;
pub use exec::ExecArgs;
pub use shell::ShellArgs;
pub use view::{keyed, show};
use view::{row, HEADER};

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Create a sandbox; it is `creating` until a worker has prepared its tree.
    Create(CreateArgs),
    /// List sandboxes, newest first.
    List {
        /// Only sandboxes in this state: creating, running, stopped, paused, error, destroyed.
        #[arg(long)]
        state: Option<String>,
        /// Only this agent's sandboxes.
        #[arg(long)]
        agent: Option<String>,
        /// Only sandboxes labelled `KEY=VALUE` (repeatable: every pair must match).
        #[arg(long = "metadata", visible_alias = "label", value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        /// At most this many sandboxes, 1 to 500.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// The page after this one (the `next_cursor` a list printed).
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Show one sandbox.
    Show {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
    },
    /// Run a command in the sandbox (resuming a stopped persistent one first); prints
    /// its output and exits with its status.
    Exec(ExecArgs),
    /// List, read or write the sandbox's files.
    #[command(subcommand)]
    Files(FilesCommand),
    /// Stop: processes end, the tree is captured (the stop snapshot), the slot released.
    Stop {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
    },
    /// Pause: the sandbox's processes are frozen in place (at most the pause limit).
    Pause {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
    },
    /// Resume a stopped or paused sandbox (on any worker).
    Resume {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
        /// A larger disk; a smaller one is refused.
        #[arg(long)]
        disk_mb: Option<u32>,
        /// Same key and body: the sandbox, not resumed again; other sandbox or body: refused.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Replace the timeout (not added to it); without --timeout-seconds it is kept.
    Extend {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
        /// The new timeout in seconds, 1 to 86400; it replaces the current one.
        #[arg(long = "timeout-seconds", alias = "timeout-sec")]
        timeout_sec: Option<u32>,
    },
    /// Fork a running sandbox into new ones from one capture.
    Fork {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
        /// How many new sandboxes from the one capture, 1 to 100 (default 1).
        #[arg(long)]
        count: Option<u32>,
        /// The forks' timeout in seconds, 1 to 86400 (default the source's).
        #[arg(long = "timeout-seconds", alias = "timeout-sec")]
        timeout_sec: Option<u32>,
        /// Same key and body: the same forks; same key, other sandbox or body: refused.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Destroy a sandbox (or delete an `error` record).
    Destroy {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
    },
    /// Set or delete a service (started in the background on every start and resume).
    #[command(subcommand)]
    Service(service::ServiceCommand),
    /// GET a path of the server on one of the sandbox's ports (a stopped or paused
    /// persistent sandbox is woken first) and print the sandbox's answer.
    Preview {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
        /// One of the ports it was created with (`--port`).
        port: u16,
        /// The path in the sandbox's server, with its query (default `/`).
        #[arg(default_value = "/")]
        path: String,
    },
    /// An interactive terminal in the sandbox (`sh -i`, or the command after `--`):
    /// what is typed goes to it, its output is printed as it comes, and cairnctl exits
    /// with its status.
    Shell(ShellArgs),
    /// Send this process's stdin to a running exec started with `stdin` or `pty`.
    Input {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
        /// The exec's operation id.
        operation: String,
        /// Close the exec's input after it (a terminal gets its end-of-file character).
        #[arg(long)]
        eof: bool,
    },
    /// End a running exec: SIGTERM, then SIGKILL after the grace.
    Kill {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
        /// The exec's operation id.
        operation: String,
    },
    /// The journal: every exec and file operation, with its receipt.
    Operations {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum FilesCommand {
    /// List a directory of the tree (default its root).
    List {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
        /// The directory, relative to the tree (default its root).
        path: Option<String>,
    },
    /// Print a file's bytes.
    Read {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
        /// The file, relative to the tree.
        path: String,
    },
    /// Write a file from a local one (`-` for stdin).
    Write {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
        /// The file to write, relative to the tree.
        path: String,
        /// The local file to upload, at most 4 MiB (`-` for stdin).
        source: PathBuf,
    },
}

fn path_query(path: &str) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("path", path)
        .finish()
}

pub async fn sandbox(
    client: &Client,
    command: SandboxCommand,
    json: bool,
) -> Result<u8, CallError> {
    match command {
        SandboxCommand::Create(args) => create::create(client, args, json).await,
        SandboxCommand::List {
            state,
            agent,
            metadata,
            limit,
            cursor,
        } => {
            let filters = Filters {
                state,
                agent,
                metadata,
                cursor,
            };
            list(client, filters, limit, json).await
        }
        SandboxCommand::Show { sandbox } => {
            let sandbox = id(&sandbox, "the sandbox id")?;
            show(
                &client.get(&format!("/api/v1/sandboxes/{sandbox}")).await?,
                json,
            );
            Ok(exit::OK)
        }
        SandboxCommand::Exec(args) => exec::exec(client, args, json).await,
        SandboxCommand::Files(command) => files(client, command, json).await,
        SandboxCommand::Stop { sandbox } => {
            lifecycle(client, Method::POST, &sandbox, "/stop", None, &[], json).await
        }
        SandboxCommand::Pause { sandbox } => {
            lifecycle(client, Method::POST, &sandbox, "/pause", None, &[], json).await
        }
        SandboxCommand::Resume {
            sandbox,
            disk_mb,
            idempotency_key,
        } => resume(client, sandbox, disk_mb, idempotency_key, json).await,
        SandboxCommand::Extend {
            sandbox,
            timeout_sec,
        } => {
            let body = timeout_sec.map(|t| json!({"timeout_sec": t}));
            lifecycle(client, Method::POST, &sandbox, "/extend", body, &[], json).await
        }
        SandboxCommand::Destroy { sandbox } => {
            lifecycle(client, Method::DELETE, &sandbox, "", None, &[], json).await
        }
        SandboxCommand::Fork {
            sandbox,
            count,
            timeout_sec,
            idempotency_key,
        } => fork(client, sandbox, count, timeout_sec, idempotency_key, json).await,
        SandboxCommand::Operations { sandbox } => operations(client, sandbox, json).await,
        SandboxCommand::Shell(args) => shell::shell(client, args).await,
        SandboxCommand::Input {
            sandbox,
            operation,
            eof,
        } => shell::input(client, &sandbox, &operation, eof).await,
        SandboxCommand::Kill { sandbox, operation } => {
            shell::kill(client, &sandbox, &operation, json).await
        }
        SandboxCommand::Service(command) => service::service(client, command, json).await,
        SandboxCommand::Preview {
            sandbox,
            port,
            path,
        } => preview(client, &sandbox, port, &path).await,
    }
}

/// Prints the sandbox's answer to a GET of `path` on `port`.
async fn preview(client: &Client, sandbox: &str, port: u16, path: &str) -> Result<u8, CallError> {
    let sandbox = id(sandbox, "the sandbox id")?;
    let path = path.trim_start_matches('/');
    let (_, bytes) = client
        .call_bytes(
            Method::GET,
            &format!("/api/v1/sandboxes/{sandbox}/preview/{port}/{path}"),
            None,
        )
        .await?;
    std::io::stdout()
        .write_all(&bytes)
        .map_err(|e| CallError::new(exit::ERROR, format!("writing stdout: {e}")))?;
    Ok(exit::OK)
}

/// What a list keeps, and where its page starts.
struct Filters {
    state: Option<String>,
    agent: Option<String>,
    metadata: Vec<String>,
    cursor: Option<String>,
}

async fn list(client: &Client, filters: Filters, limit: u32, json: bool) -> Result<u8, CallError> {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    query.append_pair("limit", &limit.to_string());
    for (name, value) in [
        ("state", filters.state),
        ("agent", filters.agent),
        ("cursor", filters.cursor),
    ] {
        if let Some(value) = value {
            query.append_pair(name, &value);
        }
    }
    for (key, value) in crate::pairs("metadata", &filters.metadata)? {
        query.append_pair(&format!("metadata.{key}"), &value);
    }
    let list = client
        .get(&format!("/api/v1/sandboxes?{}", query.finish()))
        .await?;
    if json {
        output::json(&list);
    } else {
        output::table(&HEADER, &output::rows(&list["sandboxes"], row));
        if let Some(next) = list["next_cursor"].as_str() {
            println!("more: --cursor {next}");
        }
    }
    Ok(exit::OK)
}

async fn resume(
    client: &Client,
    sandbox: String,
    disk_mb: Option<u32>,
    idempotency_key: Option<String>,
    json: bool,
) -> Result<u8, CallError> {
    let body = disk_mb.map(|d| json!({"disk_mb": d}));
    lifecycle(
        client,
        Method::POST,
        &sandbox,
        "/resume",
        body,
        &keyed(&idempotency_key),
        json,
    )
    .await
}

async fn fork(
    client: &Client,
    sandbox: String,
    count: Option<u32>,
    timeout_sec: Option<u32>,
    idempotency_key: Option<String>,
    json: bool,
) -> Result<u8, CallError> {
    let sandbox = id(&sandbox, "the sandbox id")?;
    let mut body = json!({});
    if let Some(count) = count {
        body["count"] = Value::from(count);
    }
    if let Some(timeout) = timeout_sec {
        body["timeout_sec"] = Value::from(timeout);
    }
    let answer = client
        .call(
            Method::POST,
            &format!("/api/v1/sandboxes/{sandbox}/fork"),
            Some(&body),
            &keyed(&idempotency_key),
        )
        .await?;
    if json {
        output::json(&answer.body);
    } else if answer.status.as_u16() == 202 {
        println!("still capturing: see `cairnctl sandbox operations {sandbox}`");
    } else {
        println!(
            "one capture ({}), the source took no operation for {} ms",
            output::text(&answer.body["snapshot_id"]),
            output::text(&answer.body["source_frozen_ms"])
        );
        output::table(&HEADER, &output::rows(&answer.body["sandboxes"], row));
    }
    Ok(exit::OK)
}

async fn operations(client: &Client, sandbox: String, json: bool) -> Result<u8, CallError> {
    let sandbox = id(&sandbox, "the sandbox id")?;
    let list = client
        .get(&format!("/api/v1/sandboxes/{sandbox}/operations"))
        .await?;
    if json {
        output::json(&list);
    } else {
        let rows = output::rows(&list["operations"], |o| {
            let result = &o["result"];
            let outcome = match (&result["exit_code"], &result["error"]) {
                (_, Value::String(error)) => error.clone(),
                (Value::Number(code), _) => format!("exit {code}"),
                _ => String::new(),
            };
            vec![
                output::text(&o["seq"]),
                output::text(&o["kind"]),
                output::text(&o["state"]),
                output::text(&o["lease_epoch"]),
                outcome,
                output::text(&o["snapshot_id"]),
            ]
        });
        output::table(
            &["seq", "kind", "state", "epoch", "outcome", "snapshot"],
            &rows,
        );
    }
    Ok(exit::OK)
}

/// A lifecycle call; `202` says the worker has not finished yet.
async fn lifecycle(
    client: &Client,
    method: Method,
    sandbox: &str,
    route: &str,
    body: Option<Value>,
    headers: &[(&str, &str)],
    json: bool,
) -> Result<u8, CallError> {
    let sandbox = id(sandbox, "the sandbox id")?;
    let answer = client
        .call(
            method,
            &format!("/api/v1/sandboxes/{sandbox}{route}"),
            body.as_ref(),
            headers,
        )
        .await?;
    if !json && answer.status.as_u16() == 202 {
        println!("accepted; its worker has not finished yet (`cairnctl sandbox show {sandbox}`)");
    }
    show(&answer.body, json);
    Ok(exit::OK)
}

/// Prints an exec's output and exits with its status (1 when it had none).
async fn files(client: &Client, command: FilesCommand, json: bool) -> Result<u8, CallError> {
    match command {
        FilesCommand::List { sandbox, path } => {
            let sandbox = id(&sandbox, "the sandbox id")?;
            let query = path_query(path.as_deref().unwrap_or("."));
            let list = client
                .get(&format!("/api/v1/sandboxes/{sandbox}/files?{query}"))
                .await?;
            if json {
                output::json(&list);
            } else {
                let rows = output::rows(&list["entries"], |e| {
                    output::cells(e, &["type", "size", "name"])
                });
                output::table(&["type", "size", "name"], &rows);
            }
        }
        FilesCommand::Read { sandbox, path } => {
            let sandbox = id(&sandbox, "the sandbox id")?;
            let (_, bytes) = client
                .call_bytes(
                    Method::GET,
                    &format!(
                        "/api/v1/sandboxes/{sandbox}/files/content?{}",
                        path_query(&path)
                    ),
                    None,
                )
                .await?;
            std::io::stdout()
                .write_all(&bytes)
                .map_err(|e| CallError::new(exit::ERROR, format!("writing stdout: {e}")))?;
        }
        FilesCommand::Write {
            sandbox,
            path,
            source,
        } => {
            let sandbox = id(&sandbox, "the sandbox id")?;
            let bytes = if source.as_os_str() == "-" {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
                    .map_err(|e| usage(format!("cannot read stdin: {e}")))?;
                bytes
            } else {
                std::fs::read(&source)
                    .map_err(|e| usage(format!("cannot read {}: {e}", source.display())))?
            };
            let (_, answer) = client
                .call_bytes(
                    Method::PUT,
                    &format!(
                        "/api/v1/sandboxes/{sandbox}/files/content?{}",
                        path_query(&path)
                    ),
                    Some(bytes),
                )
                .await?;
            let receipt: Value = serde_json::from_slice(&answer).unwrap_or_default();
            if json {
                output::json(&receipt);
            } else {
                println!(
                    "wrote {} bytes to {path} (snapshot {})",
                    output::text(&receipt["result"]["size"]),
                    output::text(&receipt["snapshot_id"])
                );
            }
        }
    }
    Ok(exit::OK)
}
