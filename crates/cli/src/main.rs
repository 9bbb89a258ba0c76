//! `cairnctl`: operate a Cairn installation.

use anyhow::Context;
use cairn_common::config::{parse_or_exit, DatabaseArgs};
use cairn_common::db;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Operate a Cairn installation.
#[derive(Debug, Parser)]
#[command(name = "cairnctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the database if missing and apply every pending migration.
    Migrate {
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli: Cli = parse_or_exit();
    let result = match cli.command {
        Command::Migrate { database } => migrate(&database).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn migrate(database: &DatabaseArgs) -> anyhow::Result<()> {
    if let Err(e) = db::validate_url(&database.database_url) {
        cairn_common::config::exit_invalid(format!("CAIRN_DATABASE_URL: {e}"));
    }
    let pool = db::connect(&database.database_url, 2)
        .await
        .context("connecting to PostgreSQL")?;
    db::migrate(&pool).await.context("migrating")?;
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(&pool)
        .await?;
    println!("database is up to date ({applied} migrations applied)");
    Ok(())
}
