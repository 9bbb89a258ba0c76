//! `cairnctl sandbox service set|delete`: a sandbox's services, started in the
//! background on every start and resume (and now, when set).

use crate::client::{exit, CallError, Client};
use crate::{id, output};
use reqwest::Method;
use serde_json::{json, Value};

#[derive(Debug, clap::Subcommand)]
pub enum ServiceCommand {
    /// Set a service (a deploy): kept for every later start and resume, started now
    /// (a stopped or paused persistent sandbox is resumed first).
    Set {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
        /// The service's name, 1 to 63 of `A-Za-z0-9._-`.
        name: String,
        /// Working directory, relative to the tree.
        #[arg(long)]
        cwd: Option<String>,
        /// `NAME=VALUE`, repeatable.
        #[arg(long = "env")]
        env: Vec<String>,
        /// Reach the network (`true`) or not (`false`); default the worker's.
        #[arg(long)]
        network: Option<bool>,
        /// The program and its arguments (after `--`).
        #[arg(required = true, last = true)]
        argv: Vec<String>,
    },
    /// Delete a service: it ends now and is not started again.
    Delete {
        /// The sandbox's id (32 lowercase hex characters).
        sandbox: String,
        /// The service's name.
        name: String,
    },
}

pub async fn service(
    client: &Client,
    command: ServiceCommand,
    json_out: bool,
) -> Result<u8, CallError> {
    let (sandbox, name, method, body) = match command {
        ServiceCommand::Set {
            sandbox,
            name,
            cwd,
            env,
            network,
            argv,
        } => {
            let vars = crate::pairs("env", &env)?;
            let mut body = json!({"argv": argv, "env": vars});
            if let Some(cwd) = cwd {
                body["cwd"] = Value::from(cwd);
            }
            if let Some(network) = network {
                body["network"] = Value::from(network);
            }
            (sandbox, name, Method::PUT, Some(body))
        }
        ServiceCommand::Delete { sandbox, name } => (sandbox, name, Method::DELETE, None),
    };
    let sandbox = id(&sandbox, "the sandbox id")?;
    // Checked before it goes into a URL, where `..` would lead elsewhere.
    cairn_common::sandbox::service::check_service_name(&name)
        .map_err(|e| CallError::new(exit::USAGE, e.message))?;
    let path = format!("/api/v1/sandboxes/{sandbox}/services/{name}");
    let answer = client.call(method, &path, body.as_ref(), &[]).await?;
    if json_out {
        output::json(&answer.body);
        return Ok(exit::OK);
    }
    let result = &answer.body["result"];
    if answer.status.as_u16() == 202 {
        println!("not carried out yet: see `cairnctl sandbox operations {sandbox}`");
    } else if result["started"] == true {
        println!(
            "service {name} started; its output: {}",
            output::text(&result["log"])
        );
    } else if result.get("error").is_some() || result["exit_code"].as_i64().is_some_and(|c| c != 0)
    {
        let why = result["error"]
            .as_str()
            .or(result["stderr"].as_str())
            .unwrap_or("it did not start");
        return Err(CallError::new(
            exit::ERROR,
            format!("service {name}: {why}"),
        ));
    } else {
        println!("service {name} ended and deleted");
    }
    Ok(exit::OK)
}
