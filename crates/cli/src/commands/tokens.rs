//! `cairnctl token`: create and revoke API tokens; `cairnctl tenant`: create and list
//! tenants, and show or set a tenant's network policy.

use crate::client::{exit, CallError, Client};
use crate::{id, output, usage};
use cairn_common::egress::{AllowList, NetworkSpec};
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
    /// Show a tenant's network policy, or set it (a platform admin) with one of
    /// --allow, --off or --on. A run's or sandbox's own `network` narrows it further.
    Network {
        /// The tenant's id.
        tenant_id: String,
        /// Narrow the operator's egress policy to these destinations (repeat):
        /// `HOST:PORT`, `IP[/PREFIX][:PORT]` or `[IPV6[/PREFIX]]:PORT`.
        #[arg(long, conflicts_with_all = ["off", "on"])]
        allow: Vec<String>,
        /// No network for any step or sandbox of the tenant.
        #[arg(long, conflicts_with = "on")]
        off: bool,
        /// The operator's policy as it is (undoes --allow or --off).
        #[arg(long)]
        on: bool,
    },
}

/// The policy `tenant network` sets, checked before anything is sent; `None`: show it.
fn network_change(
    allow: Vec<String>,
    off: bool,
    on: bool,
) -> Result<Option<NetworkSpec>, CallError> {
    let spec = match (allow.is_empty(), off, on) {
        (false, _, _) => NetworkSpec::Allow(AllowList { allow }),
        (true, true, _) => NetworkSpec::On(false),
        (true, false, true) => NetworkSpec::On(true),
        (true, false, false) => return Ok(None),
    };
    match spec.problem() {
        Some(problem) => Err(CallError::new(exit::USAGE, format!("--allow: {problem}"))),
        None => Ok(Some(spec)),
    }
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
        TenantCommand::Network {
            tenant_id,
            allow,
            off,
            on,
        } => {
            if !cairn_common::ids::valid_tenant_id(&tenant_id) {
                return Err(CallError::new(
                    exit::USAGE,
                    "a tenant id is 1 to 63 lowercase letters, digits and '-', not starting with '-'",
                ));
            }
            let path = format!("/api/v1/tenants/{tenant_id}/network-policy");
            let answer = match network_change(allow, off, on)? {
                Some(network) => {
                    let body = json!({ "network": network });
                    client.call(Method::PUT, &path, Some(&body), &[]).await?
                }
                None => client.call(Method::GET, &path, None, &[]).await?,
            };
            let body = answer.body;
            if !json {
                println!("tenant    {}", output::text(&body["tenant_id"]));
                println!("network   {}", body["network"]);
                println!("revision  {}", output::text(&body["revision"]));
                return Ok(exit::OK);
            }
            body
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
