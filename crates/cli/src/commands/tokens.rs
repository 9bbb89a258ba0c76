//! `cairnctl token`: create and revoke API tokens.

use crate::client::{exit, CallError, Client};
use crate::{id, output, usage};
use clap::Subcommand;
use reqwest::Method;
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token with a role (admin, operator, viewer); prints the secret once.
    Create {
        /// The token's role: `admin`, `operator` or `viewer`.
        #[arg(long)]
        role: String,
        /// A label for people, 1 to 128 characters.
        #[arg(long, default_value = "cairnctl")]
        name: String,
    },
    /// Revoke a token by id.
    Revoke {
        /// The token's `token_id` (32 lowercase hex characters), as printed at creation.
        token_id: String,
    },
}

pub async fn tokens(client: &Client, command: TokenCommand, json: bool) -> Result<u8, CallError> {
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
