//! Connection settings shared by every binary. Each field is a flag and a `CAIRN_*`
//! environment variable; defaults point at the local services.

use clap::{Args, ValueEnum};

/// PostgreSQL: the source of truth.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL; the database is created if it does not exist.
    #[arg(
        long,
        env = "CAIRN_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/cairn"
    )]
    pub database_url: String,
    /// Largest number of pooled connections (default: 10; a worker's, twice its
    /// concurrency plus 4).
    #[arg(long, env = "CAIRN_DATABASE_MAX_CONNECTIONS",
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub database_max_connections: Option<u32>,
}

impl DatabaseArgs {
    /// The pool size: the one configured, else `default`.
    pub fn pool_size(&self, default: u32) -> u32 {
        self.database_max_connections.unwrap_or(default)
    }
}

/// Redis: liveness of leases only; it may lose every key at any time.
#[derive(Debug, Clone, Args)]
pub struct RedisArgs {
    /// Redis URL.
    #[arg(
        long,
        env = "CAIRN_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// Prefix of every Redis key, so several installations (or tests) share one Redis.
    #[arg(long, env = "CAIRN_REDIS_PREFIX", default_value = "cairn:")]
    pub redis_prefix: String,
}

/// RabbitMQ: delivery only.
#[derive(Debug, Clone, Args)]
pub struct AmqpArgs {
    /// AMQP URL.
    #[arg(
        long,
        env = "CAIRN_AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_url: String,
    /// Prefix of every exchange and queue name, so several installations share a vhost.
    #[arg(long, env = "CAIRN_QUEUE_PREFIX", default_value = "")]
    pub queue_prefix: String,
    /// Deliveries of one message before RabbitMQ dead-letters it into `cairn.dead`.
    #[arg(long, env = "CAIRN_DELIVERY_LIMIT", default_value_t = 5)]
    pub delivery_limit: u32,
}

/// Where snapshot and output artifacts live.
#[derive(Debug, Clone, Args)]
pub struct ArtifactsArgs {
    /// Artifact store URL: a local directory (path or `file://`) or an object store URL.
    #[arg(
        long,
        env = "CAIRN_ARTIFACTS_URL",
        default_value = "./.cairn/artifacts"
    )]
    pub artifacts_url: String,
}

/// Log output.
#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// `pretty` for people, `json` for log pipelines.
    #[arg(long, env = "CAIRN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Pretty)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Pretty,
    Json,
}

/// Parses a binary's configuration; an invalid one prints one clear line on stderr and
/// exits with status 2 (help and version print as usual and exit 0).
/// Secret settings may come from files (see [`crate::secret_files`]).
pub fn parse_or_exit<T: clap::Parser>() -> T {
    let from_files = crate::secret_files::read(|name| std::env::var(name).ok())
        .unwrap_or_else(|reason| exit_invalid(reason));
    let command = crate::secret_files::apply(T::command(), &from_files);
    let parsed = command
        .try_get_matches()
        .and_then(|mut matches| T::from_arg_matches_mut(&mut matches));
    match parsed {
        Ok(config) => config,
        Err(error) => match error.kind() {
            clap::error::ErrorKind::DisplayHelp
            | clap::error::ErrorKind::DisplayVersion
            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => error.exit(),
            _ => exit_invalid(first_line(&error.render().to_string())),
        },
    }
}

/// Prints `invalid configuration: <reason>` as one line and exits with status 2.
pub fn exit_invalid(reason: impl std::fmt::Display) -> ! {
    let line = reason.to_string().replace('\n', " ");
    eprintln!(
        "invalid configuration: {}",
        line.trim_start_matches("error: ")
    );
    std::process::exit(2)
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or("").trim().to_string()
}
