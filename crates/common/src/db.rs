//! PostgreSQL: connect (creating the database when it is missing) and migrate.

use backon::{ExponentialBuilder, Retryable};
use sqlx::migrate::{MigrateDatabase, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};
use std::str::FromStr;
use std::time::Duration;

/// Every migration of the schema, embedded at build time.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("invalid database URL: {0}")]
    InvalidUrl(String),
    #[error("database unavailable: {0}")]
    Unavailable(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// Checks that a URL is a PostgreSQL URL without connecting.
pub fn validate_url(url: &str) -> Result<(), DbError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(DbError::InvalidUrl(
            "expected postgres:// or postgresql://".into(),
        ));
    }
    PgConnectOptions::from_str(url)
        .map(|_| ())
        .map_err(|e| DbError::InvalidUrl(e.to_string()))
}

fn retry_policy() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(5))
        .with_max_times(12)
}

/// Creates the database if it does not exist. Processes racing to create it all
/// succeed: "already exists" is the outcome each wanted, whether PostgreSQL reports it
/// as 42P04 or, when two `CREATE DATABASE` run at once, as a unique violation of
/// `pg_database` (23505).
pub async fn create_if_missing(url: &str) -> Result<(), DbError> {
    validate_url(url)?;
    let exists = (|| Postgres::database_exists(url))
        .retry(retry_policy())
        .notify(|e, wait| tracing::warn!(error = %e, ?wait, "PostgreSQL not answering, retrying"))
        .await?;
    if !exists {
        match Postgres::create_database(url).await {
            Ok(()) => tracing::info!("created database"),
            Err(sqlx::Error::Database(e))
                if matches!(e.code().as_deref(), Some("42P04") | Some("23505")) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Connects with retry, creating the database if missing, and opens the pool's
/// [`WARM_CONNECTIONS`] (sqlx opens a pool's minimum before `connect` returns).
/// Migrations are separate: see [`migrate`]. `idle_in_transaction`: PostgreSQL ends a
/// session that sits that long inside a transaction without a statement (a process
/// stalled mid-transaction would otherwise hold its row locks, and so its requests,
/// until its connection died).
pub async fn connect(
    url: &str,
    max_connections: u32,
    idle_in_transaction: Option<Duration>,
) -> Result<PgPool, DbError> {
    connect_warm(
        url,
        (max_connections, WARM_CONNECTIONS),
        idle_in_transaction,
    )
    .await
}

/// [`connect`] with `warm` connections opened and kept instead of [`WARM_CONNECTIONS`]
/// (at most `max_connections`).
pub async fn connect_warm(
    url: &str,
    (max_connections, warm): (u32, u32),
    idle_in_transaction: Option<Duration>,
) -> Result<PgPool, DbError> {
    create_if_missing(url).await?;
    // No JIT: Cairn's statements each read a few rows, and a plan whose row estimate is
    // far off (a partial index's selectivity, say) would otherwise be compiled at every
    // execution, tens of milliseconds for a statement that runs in one or two.
    let mut options = PgConnectOptions::from_str(url)
        .map_err(|e| DbError::InvalidUrl(e.to_string()))?
        .application_name("cairn")
        .options([("jit", "off")]);
    if let Some(limit) = idle_in_transaction {
        let ms = limit.as_millis().to_string();
        options = options.options([("idle_in_transaction_session_timeout", ms.as_str())]);
    }
    let pool = (|| {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .min_connections(warm.min(max_connections))
            .acquire_timeout(Duration::from_secs(10))
            // sqlx pings a connection each time it comes back to the pool; pinging it
            // again at every checkout cost a round trip per transaction. One used within
            // the second is taken as it is: if it broke since, its first statement fails,
            // as it would had it broken in use.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= Duration::from_secs(1) {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options.clone())
    })
    .retry(retry_policy())
    .notify(|e, wait| tracing::warn!(error = %e, ?wait, "PostgreSQL not answering, retrying"))
    .await?;
    Ok(pool)
}

/// The connections [`connect`] opens before it returns (so before the process reports
/// ready), and the pool keeps open while idle: PostgreSQL takes milliseconds to start a
/// backend, which the first jobs after a start would otherwise wait for.
pub const WARM_CONNECTIONS: u32 = 8;

/// Connects once to a database that must exist (no creation, no retry): for a tool that
/// only reads, such as the reaper's dry run.
pub async fn open_existing(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    validate_url(url)?;
    let options = PgConnectOptions::from_str(url)
        .map_err(|e| DbError::InvalidUrl(e.to_string()))?
        .application_name("cairn");
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await?)
}

/// Applies pending migrations; concurrent callers serialize on sqlx's advisory lock.
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    // A schema a newer release migrated further is accepted as it is, so that after a
    // rollback the older release's pods start on it (its migrations only add). A
    // migration this build knows whose checksum differs still fails.
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.set_ignore_missing(true);
    migrator.run(pool).await?;
    Ok(())
}
