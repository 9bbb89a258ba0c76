//! `cairnctl snapshot`: save, list, info, fork (a new sandbox from it), delete and
//! restore sandbox snapshots.

use crate::client::{exit, CallError, Client};
use crate::commands::sandbox;
use crate::{id, output};
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Snapshot a running sandbox, optionally named.
    Save {
        /// The running sandbox's id (32 lowercase hex characters).
        sandbox: String,
        /// A name for the snapshot, 1 to 200 characters without control characters.
        name: Option<String>,
        /// Same key and body: the same snapshot; same key, other sandbox or body: refused.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// List snapshots, newest first.
    List {
        /// Only this sandbox's snapshots (its id, 32 lowercase hex characters).
        #[arg(long)]
        sandbox: Option<String>,
        /// At most this many snapshots, 1 to 500.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Show one snapshot.
    Info {
        /// The snapshot's id (32 lowercase hex characters).
        snapshot: String,
    },
    /// A new sandbox from the snapshot (the same as restore).
    Fork {
        /// The snapshot's id (32 lowercase hex characters).
        snapshot: String,
        /// Same key and body: the same new sandbox; same key, other snapshot or body: refused.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Restore the snapshot into a new sandbox; the source never changes.
    Restore {
        /// The snapshot's id (32 lowercase hex characters).
        snapshot: String,
        /// The new sandbox's timeout in seconds, 1 to 86400 (default 3600).
        #[arg(long = "timeout-seconds", alias = "timeout-sec")]
        timeout_sec: Option<u32>,
        /// Same key and body: the same new sandbox; same key, other snapshot or body: refused.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Delete a snapshot; sandboxes restored from it are unaffected.
    Delete {
        /// The snapshot's id (32 lowercase hex characters).
        snapshot: String,
    },
}

const HEADER: [&str; 6] = ["snapshot", "sandbox", "kind", "name", "status", "created"];

fn row(snapshot: &Value) -> Vec<String> {
    output::cells(
        snapshot,
        &[
            "snapshot_id",
            "sandbox_id",
            "kind",
            "name",
            "status",
            "created_at",
        ],
    )
}

fn show(snapshot: &Value, json: bool) {
    if json {
        return output::json(snapshot);
    }
    output::fields(
        snapshot,
        &[
            "snapshot_id",
            "sandbox_id",
            "kind",
            "name",
            "status",
            "size_bytes",
            "durability",
            "created_at",
            "deleted_at",
        ],
    );
}

pub async fn snapshot(
    client: &Client,
    command: SnapshotCommand,
    json: bool,
) -> Result<u8, CallError> {
    match command {
        SnapshotCommand::Save {
            sandbox,
            name,
            idempotency_key,
        } => {
            let sandbox = id(&sandbox, "the sandbox id")?;
            let body = name
                .map(|n| json!({"name": n}))
                .unwrap_or_else(|| json!({}));
            let headers = sandbox::keyed(&idempotency_key);
            let answer = client
                .call(
                    Method::POST,
                    &format!("/api/v1/sandboxes/{sandbox}/snapshots"),
                    Some(&body),
                    &headers,
                )
                .await?;
            if !json && answer.status.as_u16() == 202 {
                println!("still capturing: see `cairnctl sandbox operations {sandbox}`");
                return Ok(exit::OK);
            }
            show(&answer.body, json);
        }
        SnapshotCommand::List { sandbox, limit } => {
            let mut query = format!("?limit={limit}");
            if let Some(sandbox) = sandbox {
                query.push_str(&format!("&sandbox_id={}", id(&sandbox, "the sandbox id")?));
            }
            let list = client.get(&format!("/api/v1/snapshots{query}")).await?;
            if json {
                output::json(&list);
            } else {
                output::table(&HEADER, &output::rows(&list["snapshots"], row));
            }
        }
        SnapshotCommand::Info { snapshot } => {
            let snapshot = id(&snapshot, "the snapshot id")?;
            show(
                &client.get(&format!("/api/v1/snapshots/{snapshot}")).await?,
                json,
            );
        }
        SnapshotCommand::Delete { snapshot } => {
            let snapshot = id(&snapshot, "the snapshot id")?;
            let answer = client
                .call(
                    Method::DELETE,
                    &format!("/api/v1/snapshots/{snapshot}"),
                    None,
                    &[],
                )
                .await?;
            show(&answer.body, json);
        }
        SnapshotCommand::Fork {
            snapshot,
            idempotency_key,
        } => return restore(client, &snapshot, None, idempotency_key, json).await,
        SnapshotCommand::Restore {
            snapshot,
            timeout_sec,
            idempotency_key,
        } => return restore(client, &snapshot, timeout_sec, idempotency_key, json).await,
    }
    Ok(exit::OK)
}

async fn restore(
    client: &Client,
    snapshot: &str,
    timeout_sec: Option<u32>,
    key: Option<String>,
    json: bool,
) -> Result<u8, CallError> {
    let snapshot = id(snapshot, "the snapshot id")?;
    let body = timeout_sec
        .map(|t| json!({"timeout_sec": t}))
        .unwrap_or_else(|| json!({}));
    let headers = sandbox::keyed(&key);
    let answer = client
        .call(
            Method::POST,
            &format!("/api/v1/snapshots/{snapshot}/restore"),
            Some(&body),
            &headers,
        )
        .await?;
    sandbox::show(&answer.body, json);
    Ok(exit::OK)
}
