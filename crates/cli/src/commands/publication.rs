//! `cairnctl publication`: publish a completed run's result as a patch, read its
//! delivery receipt, and set or clear a run's delivery hold.

use crate::client::{exit, CallError, Client};
use crate::{id, output};
use cairn_common::ids::Id;
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};

#[derive(Debug, Subcommand)]
pub enum PublicationCommand {
    /// Request publication of a completed run (admin), after reading its command receipts
    /// (`cairnctl runs journal RUN`). Prints the request id before its one POST.
    Request {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// Your request id (32 lowercase hex); a new one when left out. The same id and
        /// input read the same publication.
        #[arg(long)]
        request_id: Option<String>,
        /// Say that you read the run's command receipts: the request is refused without it.
        #[arg(long)]
        receipts_read: bool,
    },
    /// Read a publication and, once delivered, its receipt (artifact key, SHA-256).
    Status {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// The publication's request id (32 lowercase hex characters).
        request_id: String,
    },
    /// Set a delivery hold on a run (admin): nothing of it is published while it stands.
    Hold {
        /// The run's id (32 lowercase hex characters).
        run: String,
        /// Why (1 to 500 characters).
        #[arg(long)]
        reason: String,
    },
    /// Clear a run's delivery hold (admin).
    Release {
        /// The run's id (32 lowercase hex characters).
        run: String,
    },
}

pub async fn publication(
    client: &Client,
    command: PublicationCommand,
    json: bool,
) -> Result<u8, CallError> {
    let shown = match command {
        PublicationCommand::Request {
            run,
            request_id,
            receipts_read,
        } => {
            if !receipts_read {
                return Err(crate::usage(
                    "read the run's command receipts (cairnctl runs journal RUN), then pass --receipts-read",
                ));
            }
            let run = id(&run, "RUN")?;
            let request_id = match request_id {
                Some(given) => id(&given, "--request-id")?,
                None => Id::new().to_string(),
            };
            eprintln!("publication request id: {request_id}");
            let body = json!({"version": 1, "request_id": request_id, "acknowledge_command_receipts_read": true});
            let path = format!("/api/v1/runs/{run}/publications");
            client
                .call(Method::POST, &path, Some(&body), &[])
                .await?
                .body
        }
        PublicationCommand::Status { run, request_id } => {
            let (run, request_id) = (id(&run, "RUN")?, id(&request_id, "REQUEST_ID")?);
            client
                .get(&format!("/api/v1/runs/{run}/publications/{request_id}"))
                .await?
        }
        PublicationCommand::Hold { run, reason } => {
            let path = format!("/api/v1/runs/{}/delivery-hold", id(&run, "RUN")?);
            let body = json!({"reason": reason});
            client
                .call(Method::PUT, &path, Some(&body), &[])
                .await?
                .body
        }
        PublicationCommand::Release { run } => {
            let path = format!("/api/v1/runs/{}/delivery-hold", id(&run, "RUN")?);
            client.call(Method::DELETE, &path, None, &[]).await?.body
        }
    };
    if json {
        output::json(&shown);
    } else {
        print_text(&shown);
    }
    Ok(exit::OK)
}

fn print_text(shown: &Value) {
    if shown.get("held").is_some() {
        output::fields(shown, &["run_id", "held", "reason", "set_at"]);
        return;
    }
    output::fields(shown, &["request_id", "run_id", "state", "stop_reason"]);
    if shown["delivery"].is_object() {
        output::fields(
            &shown["delivery"],
            &["artifact_key", "sha256", "bytes", "files_changed", "base"],
        );
    }
}
