//! `cairnctl template`: publish a named snapshot as a template's next version, list the
//! versions, show one. A sandbox starts from one with `sandbox create --template ID`.

use crate::client::{exit, CallError, Client};
use crate::{id, output};
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};

#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Publish a ready named snapshot as the next version of NAME (1, 2, …); a version
    /// never changes, and its snapshot is kept while it names it.
    Create {
        /// 1 to 63 letters, digits, '.', '_' or '-'.
        name: String,
        /// `snapshot:<id>` (or the bare id) of a named snapshot (`cairnctl snapshot save`).
        #[arg(long)]
        source: String,
        /// What it holds, at most 500 characters.
        #[arg(long)]
        description: Option<String>,
    },
    /// Templates' versions, newest first by name.
    List {
        /// Only this name's versions.
        #[arg(long)]
        name: Option<String>,
    },
    /// One version.
    Show {
        /// The version's id (32 lowercase hex characters).
        template: String,
    },
}

const HEADER: [&str; 5] = ["template", "name", "version", "source", "snapshot_status"];

fn row(template: &Value) -> Vec<String> {
    HEADER
        .iter()
        .map(|field| {
            let name = if *field == "template" {
                "template_id"
            } else {
                field
            };
            output::text(&template[name])
        })
        .collect()
}

pub async fn template(
    client: &Client,
    command: TemplateCommand,
    json: bool,
) -> Result<u8, CallError> {
    let shown = match command {
        TemplateCommand::Create {
            name,
            source,
            description,
        } => {
            let source = if source.starts_with("snapshot:") {
                source
            } else {
                format!("snapshot:{source}")
            };
            let mut body = json!({"name": name, "source": source});
            if let Some(description) = description {
                body["description"] = Value::from(description);
            }
            client
                .call(Method::POST, "/api/v1/templates", Some(&body), &[])
                .await?
                .body
        }
        TemplateCommand::List { name } => {
            let query = name
                .map(|n| {
                    let pair = url::form_urlencoded::Serializer::new(String::new())
                        .append_pair("name", &n)
                        .finish();
                    format!("?{pair}")
                })
                .unwrap_or_default();
            let list = client.get(&format!("/api/v1/templates{query}")).await?;
            if json {
                output::json(&list);
            } else {
                output::table(&HEADER, &output::rows(&list["templates"], row));
            }
            return Ok(exit::OK);
        }
        TemplateCommand::Show { template } => {
            let template = id(&template, "the template id")?;
            client.get(&format!("/api/v1/templates/{template}")).await?
        }
    };
    if json {
        output::json(&shown);
    } else {
        let fields = [
            "template_id",
            "name",
            "version",
            "source",
            "snapshot_status",
            "description",
            "created_at",
        ];
        output::fields(&shown, &fields);
    }
    Ok(exit::OK)
}
