//! `cairnctl qualification`: the source profiles continuations may run on.

use crate::client::{exit, CallError, Client};
use crate::output;
use clap::Subcommand;
use reqwest::Method;
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum QualificationCommand {
    /// Show the current implementation's source profile and the registered ones.
    Show,
    /// Qualify a profile (the current one, or a registered one) for continuations.
    Qualify {
        /// The profile's digest (64 lowercase hex), as `show` prints it.
        profile: String,
        /// What qualified it.
        #[arg(long, default_value = "")]
        note: String,
    },
    /// Revoke a profile: continuations on it, or from checkpoints retained under it, hold.
    Revoke {
        /// The profile's digest (64 lowercase hex).
        profile: String,
        /// Why.
        #[arg(long, default_value = "")]
        note: String,
    },
}

pub async fn qualification(
    client: &Client,
    command: QualificationCommand,
    json: bool,
) -> Result<u8, CallError> {
    let (profile, qualified, note) = match command {
        QualificationCommand::Show => {
            let view = client.get("/api/v1/qualification").await?;
            if json {
                output::json(&view);
            } else {
                output::fields(&view["current"], &["profile_digest", "status"]);
                for registered in view["profiles"].as_array().into_iter().flatten() {
                    println!();
                    output::fields(
                        registered,
                        &["profile_digest", "status", "note", "revision", "updated_at"],
                    );
                }
            }
            return Ok(exit::OK);
        }
        QualificationCommand::Qualify { profile, note } => (profile, true, note),
        QualificationCommand::Revoke { profile, note } => (profile, false, note),
    };
    let path = format!("/api/v1/qualification/profiles/{profile}");
    let body = json!({"qualified": qualified, "note": note});
    let saved = client
        .call(Method::PUT, &path, Some(&body), &[])
        .await?
        .body;
    if json {
        output::json(&saved);
    } else {
        output::fields(&saved, &["profile_digest", "status", "note", "revision"]);
    }
    Ok(exit::OK)
}
