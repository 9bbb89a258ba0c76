//! `cairnctl reaper`: the reaper's last sweeps and what waits for repair, read from the
//! database through the reaper's own functions.

use crate::client::{exit, CallError};
use crate::output;
use cairn_common::config::DatabaseArgs;
use cairn_reaper::status;
use clap::Subcommand;
use serde_json::{json, Value};
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub enum ReaperCommand {
    /// The last sweeps: when, who led, what each rule did.
    Status {
        #[command(flatten)]
        database: DatabaseArgs,
        /// How many of the latest sweeps to show (clamped to 1 to 1000).
        #[arg(long, default_value_t = 5)]
        limit: i64,
    },
    /// Artifacts that could not be deleted, with the reason and the next retry.
    Pending {
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

pub async fn connect_database(args: &DatabaseArgs) -> Result<sqlx::PgPool, CallError> {
    if let Err(e) = cairn_common::db::validate_url(&args.database_url) {
        cairn_common::config::exit_invalid(format!("CAIRN_DATABASE_URL: {e}"));
    }
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&args.database_url)
        .await
        .map_err(|e| CallError::new(exit::ERROR, format!("cannot reach PostgreSQL: {e}")))
}

fn failed(e: sqlx::Error) -> CallError {
    CallError::new(exit::ERROR, format!("query failed: {e}"))
}

pub async fn reaper(command: ReaperCommand, json: bool) -> Result<u8, CallError> {
    match command {
        ReaperCommand::Status { database, limit } => status_of(database, limit, json).await,
        ReaperCommand::Pending { database } => {
            let pool = connect_database(&database).await?;
            let rows = status::pending_repairs(&pool).await.map_err(failed)?;
            if json {
                let list: Vec<Value> = rows
                    .iter()
                    .map(|r| {
                        json!({"snapshot_id": r.snapshot_id.simple().to_string(), "kind": r.kind, "store_url": r.store_url,
                               "reason": r.reason, "attempts": r.attempts, "next_retry_at": r.next_retry_at})
                    })
                    .collect();
                output::json(&Value::Array(list));
            } else {
                let table: Vec<Vec<String>> = rows
                    .iter()
                    .map(|r| {
                        vec![
                            r.snapshot_id.simple().to_string(),
                            r.kind.clone(),
                            r.store_url.clone(),
                            r.attempts.to_string(),
                            r.next_retry_at.map(|n| n.to_rfc3339()).unwrap_or_default(),
                            r.reason.clone().unwrap_or_default(),
                        ]
                    })
                    .collect();
                output::table(
                    &[
                        "snapshot",
                        "kind",
                        "store",
                        "attempts",
                        "next retry",
                        "reason",
                    ],
                    &table,
                );
            }
            Ok(exit::OK)
        }
    }
}

async fn status_of(database: DatabaseArgs, limit: i64, json: bool) -> Result<u8, CallError> {
    let pool = connect_database(&database).await?;
    let rows = status::recent_sweeps(&pool, limit).await.map_err(failed)?;
    if json {
        let list: Vec<Value> = rows
            .iter()
            .map(|r| json!({"started_at": r.started_at, "finished_at": r.finished_at, "dry_run": r.dry_run, "summary": r.summary}))
            .collect();
        output::json(&Value::Array(list));
    } else if rows.is_empty() {
        println!("no sweep has run yet");
    } else {
        let table: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                let s = &r.summary;
                vec![
                    r.started_at.to_rfc3339(),
                    r.finished_at
                        .map(|f| format!("{} ms", (f - r.started_at).num_milliseconds()))
                        .unwrap_or_default(),
                    output::text(&s["leader"]),
                    output::text(&s["idle_heads_retired"]),
                    output::text(&s["snapshots_reclaimed"]),
                    output::text(&s["bytes_reclaimed"]),
                    output::text(&s["holds_ended"]),
                    output::text(&s["credential_retired"]),
                    output::text(&s["sandbox_retired"]),
                    output::text(&s["reclaim_failed"]),
                ]
            })
            .collect();
        output::table(
            &[
                "started",
                "took",
                "leader",
                "idle",
                "reclaimed",
                "bytes",
                "holds",
                "credentials",
                "sandbox",
                "failed",
            ],
            &table,
        );
    }
    Ok(exit::OK)
}
