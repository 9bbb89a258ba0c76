//! `cairnctl migrate`: create the database if missing and apply every pending migration.

use crate::client::{exit, CallError};
use cairn_common::config::DatabaseArgs;

pub async fn migrate(database: &DatabaseArgs) -> Result<u8, CallError> {
    if let Err(e) = cairn_common::db::validate_url(&database.database_url) {
        cairn_common::config::exit_invalid(format!("CAIRN_DATABASE_URL: {e}"));
    }
    let failed =
        |e: &dyn std::fmt::Display| CallError::new(exit::ERROR, format!("migration failed: {e}"));
    let pool = cairn_common::db::connect(&database.database_url, 2, None)
        .await
        .map_err(|e| failed(&e))?;
    cairn_common::db::migrate(&pool)
        .await
        .map_err(|e| failed(&e))?;
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(&pool)
        .await
        .map_err(|e| failed(&e))?;
    println!("database is up to date ({applied} migrations applied)");
    Ok(exit::OK)
}
