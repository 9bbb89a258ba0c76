//! `cairnctl token`: create and revoke API tokens; `cairnctl tenant`: create and list
//! tenants.

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
        /// The tenant it belongs to. A tenant's admin makes tokens of its own tenant
        /// (the default); a platform admin names one, or omits it for a platform token.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Revoke a token by id.
    Revoke {
        /// The token's `token_id` (32 lowercase hex characters), as printed at creation.
        token_id: String,
    },
}

pub async fn tokens(client: &Client, command: TokenCommand, json: bool) -> Result<u8, CallError> {
    let body = match command {
        TokenCommand::Create { role, name, tenant } => {
            if !["admin", "operator", "viewer"].contains(&role.as_str()) {
                return Err(usage("--role is admin, operator or viewer"));
            }
            let mut request = json!({"name": name, "role": role});
            if let Some(tenant) = tenant {
                request["tenant"] = json!(tenant);
            }
            client
                .call(Method::POST, "/api/v1/tokens", Some(&request), &[])
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
        match body["tenant"].as_str() {
            Some(tenant) => println!("tenant    {tenant}"),
            None => println!("tenant    (none: a platform token, reaching every tenant)"),
        }
        println!("token     {token}");
        println!("(the token is shown once; store it now)");
    } else {
        println!("revoked {}", output::text(&body["token_id"]));
    }
    Ok(exit::OK)
}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant (a platform admin): lowercase letters, digits and `-`.
    Create {
        /// The tenant's id, 1 to 63 characters.
        tenant_id: String,
    },
    /// List tenants: all of them for a platform token, the token's own otherwise.
    List,
}

pub async fn tenants(client: &Client, command: TenantCommand, json: bool) -> Result<u8, CallError> {
    let body = match command {
        TenantCommand::Create { tenant_id } => {
            client
                .call(
                    Method::POST,
                    "/api/v1/tenants",
                    Some(&json!({"tenant_id": tenant_id})),
                    &[],
                )
                .await?
                .body
        }
        TenantCommand::List => {
            client
                .call(Method::GET, "/api/v1/tenants", None, &[])
                .await?
                .body
        }
    };
    if json {
        output::json(&body);
    } else if let Some(list) = body["tenants"].as_array() {
        for tenant in list {
            println!(
                "{}  {}",
                output::text(&tenant["tenant_id"]),
                output::text(&tenant["created_at"])
            );
        }
    } else {
        println!("created tenant {}", output::text(&body["tenant_id"]));
    }
    Ok(exit::OK)
}
