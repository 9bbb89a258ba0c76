//! `cairnctl policy`: read or change the saved-work recovery policy.

use crate::client::{exit, CallError, Client};
use crate::{output, usage};
use clap::Subcommand;
use reqwest::Method;
use serde_json::Value;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Show the policy.
    Get,
    /// Change the named settings; the others keep their values.
    Set {
        /// Turn saved-work recovery on (`true`) or off (`false`): the master switch.
        #[arg(long)]
        enabled: Option<bool>,
        /// Permit (`true`) or forbid (`false`) checkpoint continuations.
        #[arg(long)]
        allow_checkpoint_continuation: Option<bool>,
        /// Permit (`true`) or forbid (`false`) final-outcome continuations.
        #[arg(long)]
        allow_final_outcome_continuation: Option<bool>,
        /// The longest window an action may ask for, 1 to 7200 seconds.
        #[arg(long)]
        maximum_window_seconds: Option<u32>,
    },
}

pub async fn policy(client: &Client, command: PolicyCommand, json: bool) -> Result<u8, CallError> {
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
