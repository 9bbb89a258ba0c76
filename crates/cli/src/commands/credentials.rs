//! `cairnctl credentials`: rotate an agent's credentials.

use crate::client::{exit, CallError, Client};
use crate::output;
use clap::Subcommand;
use reqwest::Method;

#[derive(Debug, Subcommand)]
pub enum CredentialsCommand {
    /// Start a new credential generation for AGENT.
    Rotate {
        /// The agent's name: 1 to 128 letters, digits, '.', '_' or '-'.
        agent: String,
    },
}

/// Runs a `credentials` command.
pub async fn credentials(
    client: &Client,
    command: CredentialsCommand,
    json: bool,
) -> Result<u8, CallError> {
    match command {
        CredentialsCommand::Rotate { agent } => {
            let answer = client
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
