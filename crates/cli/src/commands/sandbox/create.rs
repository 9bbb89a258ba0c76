//! `cairnctl sandbox create`: the body from the flags, and `--wait` until the sandbox
//! runs or fails.

use super::view::{keyed, show};
use crate::client::{exit, CallError, Client};
use crate::output;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The agent the sandbox is for: 1 to 128 letters, digits, '.', '_' or '-'.
    #[arg(long)]
    pub agent: String,
    /// Clone this repository into the tree.
    #[arg(long, conflicts_with = "source")]
    pub repository: Option<String>,
    /// The git ref to check out (default the repository's HEAD); needs --repository.
    #[arg(long = "ref", requires = "repository")]
    pub git_ref: Option<String>,
    /// Start from a snapshot: `snapshot:<id>`.
    #[arg(long)]
    pub source: Option<String>,
    /// Start from a template version (its id, as `cairnctl template list` prints it).
    #[arg(long, conflicts_with_all = ["source", "repository"])]
    pub template: Option<String>,
    /// Idle-anchored timeout, 1 to 86400 seconds (default 3600).
    #[arg(long = "timeout-seconds", alias = "timeout-sec")]
    pub timeout_sec: Option<u32>,
    /// Idle auto-stop in seconds; 0 disables it (default 1800).
    #[arg(long = "idle-timeout-seconds", alias = "idle-timeout-sec")]
    pub idle_timeout_sec: Option<u32>,
    /// No timeout or idle stop until an explicit lifecycle action.
    #[arg(long)]
    pub always_on: bool,
    /// Destroyed (not stopped) at its timeout, never resumed by an operation.
    #[arg(long)]
    pub not_persistent: bool,
    /// The disk size in MiB, 1 to 1048576 (default 10240).
    #[arg(long)]
    pub disk_mb: Option<u32>,
    /// Same key and body: the same sandbox; same key, other body: refused.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// A label, `KEY=VALUE` (repeatable; at most 32).
    #[arg(long = "metadata", value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    /// A port previews reach (`cairnctl sandbox preview`; repeatable, at most 16).
    #[arg(long = "port", value_name = "PORT")]
    pub ports: Vec<u16>,
    /// A volume to attach at `/volumes/NAME` (`cairnctl volume create`; repeatable, at
    /// most 4).
    #[arg(long = "volume", value_name = "NAME")]
    pub volumes: Vec<String>,
    /// Wait until the sandbox runs (exit 0) or fails (exit 1), at most --wait-seconds.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits, in seconds.
    #[arg(long, default_value_t = 120, requires = "wait")]
    pub wait_seconds: u64,
}

pub async fn create(client: &Client, args: CreateArgs, json: bool) -> Result<u8, CallError> {
    let CreateArgs {
        agent,
        repository,
        git_ref,
        source,
        template,
        timeout_sec,
        idle_timeout_sec,
        always_on,
        not_persistent,
        disk_mb,
        idempotency_key,
        metadata,
        ports,
        volumes,
        wait,
        wait_seconds,
    } = args;
    let labels = crate::pairs("metadata", &metadata)?;
    let mut body = json!({"agent": agent, "always_on": always_on, "persistent": !not_persistent});
    for (name, value) in [
        ("repository", repository.map(Value::from)),
        ("ref", git_ref.map(Value::from)),
        ("source", source.map(Value::from)),
        ("template_id", template.map(Value::from)),
        ("timeout_sec", timeout_sec.map(Value::from)),
        ("idle_timeout_sec", idle_timeout_sec.map(Value::from)),
        ("disk_mb", disk_mb.map(Value::from)),
    ] {
        if let Some(value) = value {
            body[name] = value;
        }
    }
    if !labels.is_empty() {
        body["metadata"] = json!(labels);
    }
    if !ports.is_empty() {
        body["ports"] = json!(ports);
    }
    if !volumes.is_empty() {
        body["volumes"] = json!(volumes);
    }
    let answer = client
        .call(
            Method::POST,
            "/api/v1/sandboxes",
            Some(&body),
            &keyed(&idempotency_key),
        )
        .await?;
    if !json && answer.status.as_u16() == 200 {
        println!("replayed: this key created the sandbox before");
    }
    if !wait {
        show(&answer.body, json);
        return Ok(exit::OK);
    }
    let sandbox = output::text(&answer.body["sandbox_id"]);
    let ready = until_settled(client, &sandbox, Duration::from_secs(wait_seconds), json).await?;
    show(&ready, json);
    Ok(if ready["state"] == "running" {
        exit::OK
    } else {
        exit::ERROR
    })
}

/// Polls the sandbox until it leaves `creating` (running, or failed: `error`,
/// `destroyed`), saying so on stderr; `NOT_COMPLETED` after `limit`.
async fn until_settled(
    client: &Client,
    sandbox: &str,
    limit: Duration,
    json: bool,
) -> Result<Value, CallError> {
    let started = Instant::now();
    if !json {
        eprintln!(
            "waiting for {sandbox} to run (at most {} s)…",
            limit.as_secs()
        );
    }
    loop {
        let current = client.get(&format!("/api/v1/sandboxes/{sandbox}")).await?;
        let settled = current["state"] != "creating" && current["pending"].is_null();
        if settled {
            if !json {
                let state = output::text(&current["state"]);
                eprintln!("{state} after {:.1} s", started.elapsed().as_secs_f64());
            }
            return Ok(current);
        }
        if started.elapsed() >= limit {
            return Err(CallError::new(
                exit::NOT_COMPLETED,
                format!(
                    "{sandbox} is still {} after {} s; follow it with: cairnctl sandbox show {sandbox}",
                    output::text(&current["state"]),
                    limit.as_secs()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
