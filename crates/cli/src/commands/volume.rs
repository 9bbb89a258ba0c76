//! `cairnctl volume`: storage on one worker's disk that a sandbox attaches at
//! `/volumes/NAME` (`sandbox create --volume NAME`), kept across its restarts.

use crate::client::{exit, CallError, Client};
use crate::{id, output};
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create a volume; it takes room on a worker's disk when a sandbox first attaches it.
    Create {
        /// 1 to 63 of a-z, 0-9, '.', '_' or '-', starting with a letter or digit.
        name: String,
        /// Its room in MiB, 1 to 1048576 (default 1024).
        #[arg(long)]
        size_mb: Option<u32>,
    },
    /// Volumes not deleted, by name.
    List,
    /// One volume.
    Show {
        /// The volume's id (32 lowercase hex characters).
        volume: String,
    },
    /// Delete a volume and its data (refused while a sandbox has it attached).
    Delete {
        /// The volume's id (32 lowercase hex characters).
        volume: String,
    },
}

const HEADER: [&str; 5] = ["volume", "name", "size_mb", "state", "attached_to"];

fn row(volume: &Value) -> Vec<String> {
    HEADER
        .iter()
        .map(|field| {
            let name = if *field == "volume" {
                "volume_id"
            } else {
                field
            };
            output::text(&volume[name])
        })
        .collect()
}

pub async fn volume(client: &Client, command: VolumeCommand, json: bool) -> Result<u8, CallError> {
    let shown = match command {
        VolumeCommand::Create { name, size_mb } => {
            let mut body = json!({"name": name});
            if let Some(size) = size_mb {
                body["size_mb"] = Value::from(size);
            }
            client
                .call(Method::POST, "/api/v1/volumes", Some(&body), &[])
                .await?
                .body
        }
        VolumeCommand::List => {
            let list = client.get("/api/v1/volumes").await?;
            if json {
                output::json(&list);
            } else {
                output::table(&HEADER, &output::rows(&list["volumes"], row));
            }
            return Ok(exit::OK);
        }
        VolumeCommand::Show { volume } => {
            let volume = id(&volume, "the volume id")?;
            client.get(&format!("/api/v1/volumes/{volume}")).await?
        }
        VolumeCommand::Delete { volume } => {
            let volume = id(&volume, "the volume id")?;
            let path = format!("/api/v1/volumes/{volume}");
            client.call(Method::DELETE, &path, None, &[]).await?.body
        }
    };
    if json {
        output::json(&shown);
    } else {
        let fields = [
            "volume_id",
            "name",
            "size_mb",
            "state",
            "attached_to",
            "created_at",
            "deleted_at",
        ];
        output::fields(&shown, &fields);
    }
    Ok(exit::OK)
}
