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
        hide_env_values = true,
        default_value = "postgres://postgres@127.0.0.1:5432/cairn"
    )]
    pub database_url: String,
    /// Largest number of pooled connections (default: 10; a worker's, twice its
    /// concurrency plus 4).
    #[arg(long, env = "CAIRN_DATABASE_MAX_CONNECTIONS",
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub database_max_connections: Option<u32>,
    /// Connections opened before the process reports ready and kept open while idle
    /// (default: 8, at most the pool's size): PostgreSQL takes milliseconds to start a
    /// backend, which the first jobs would otherwise wait for. Lower it where many
    /// processes share a server's `max_connections`.
    #[arg(long, env = "CAIRN_DATABASE_WARM_CONNECTIONS",
          value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub database_warm_connections: Option<u32>,
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
        hide_env_values = true,
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
        hide_env_values = true,
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
        hide_env_values = true,
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

/// Parses a binary's configuration. A bad value of an environment variable prints one
/// line naming it (`invalid configuration: CAIRN_LISTEN=notaport: …`, with the allowed
/// values when there is a list) and exits with status 2. A bad command line prints
/// `usage: …`, with a "did you mean" when a name is close, and exits with status 2.
/// Help and version print as usual and exit 0. Secret settings may come from files (see
/// [`crate::secret_files`]).
pub fn parse_or_exit<T: clap::Parser>() -> T {
    let from_files = crate::secret_files::read(|name| std::env::var(name).ok())
        .unwrap_or_else(|reason| exit_invalid(reason));
    let command = crate::secret_files::apply(T::command(), &from_files);
    let parsed = command
        .clone()
        .try_get_matches()
        .and_then(|mut matches| T::from_arg_matches_mut(&mut matches));
    match parsed {
        Ok(config) => config,
        Err(error) => match error.kind() {
            clap::error::ErrorKind::DisplayHelp
            | clap::error::ErrorKind::DisplayVersion
            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => error.exit(),
            _ => match from_environment(&command, &error) {
                Some(line) => exit_invalid(line),
                None => exit_usage(&command, &error),
            },
        },
    }
}

/// The failed value as the environment variable that gave it (`CAIRN_LISTEN=notaport:
/// why`), or `None` when the command line gave it.
fn from_environment(command: &clap::Command, error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let ContextValue::String(arg) = error.get(ContextKind::InvalidArg)? else {
        return None;
    };
    let long = arg.trim_start_matches('-').split([' ', '=']).next()?;
    let (var, secret) = find_env(command, long)?;
    let value = std::env::var(&var).ok()?;
    if let Some(ContextValue::String(invalid)) = error.get(ContextKind::InvalidValue) {
        if *invalid != value {
            return None;
        }
    }
    let why = match error.get(ContextKind::ValidValue) {
        Some(ContextValue::Strings(allowed)) => format!("allowed values: {}", allowed.join(", ")),
        _ => std::error::Error::source(error)
            .map(|source| source.to_string())
            .unwrap_or_else(|| first_line(&error.render().to_string())),
    };
    let why = why.trim_start_matches("error: ");
    // A URL or a token may hold a secret: its name only, never its value.
    Some(if secret {
        format!("{var}: {why}")
    } else {
        format!("{var}={value}: {why}")
    })
}

/// The environment variable of the argument `--long`, in any subcommand, and whether
/// its value may hold a secret.
fn find_env(command: &clap::Command, long: &str) -> Option<(String, bool)> {
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| {
            let var = a.get_env()?.to_string_lossy().into_owned();
            let secret = a.is_hide_env_values_set()
                || var.ends_with("_URL")
                || var.contains("TOKEN")
                || var.contains("PASSWORD");
            Some((var, secret))
        })
        .or_else(|| {
            command
                .get_subcommands()
                .find_map(|sub| find_env(sub, long))
        })
}

/// Prints `usage: <what was wrong>`, a "did you mean" when clap has a suggestion, the
/// usage line and where help is, and exits with status 2.
fn exit_usage(command: &clap::Command, error: &clap::Error) -> ! {
    use clap::error::{ContextKind, ContextValue};
    let rendered = error.render().to_string();
    let mut what = first_line(&rendered);
    if what.ends_with(':') {
        // "the following required arguments were not provided:" lists them below.
        let listed: Vec<&str> = rendered
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .map(str::trim)
            .collect();
        what = format!("{} {}", what, listed.join(" "));
    }
    let mut line = format!("usage: {}", what.trim_start_matches("error: "));
    for kind in [ContextKind::SuggestedSubcommand, ContextKind::SuggestedArg] {
        let suggested = match error.get(kind) {
            Some(ContextValue::String(one)) => vec![one.clone()],
            Some(ContextValue::Strings(many)) => many.clone(),
            _ => continue,
        };
        if !suggested.is_empty() {
            line.push_str(&format!("; did you mean '{}'?", suggested.join("' or '")));
        }
    }
    // An invalid value of a closed set says which values there are.
    if let Some(ContextValue::Strings(valid)) = error.get(ContextKind::ValidValue) {
        line.push_str(&format!("; one of: {}", valid.join(", ")));
    }
    eprintln!("{line}");
    let usage = rendered.lines().find(|l| l.starts_with("Usage:"));
    // The command that failed: the usage line's words before its arguments.
    let path = usage
        .map(|u| {
            u.trim_start_matches("Usage:")
                .split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<']))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| command.get_name().to_string());
    if let Some(usage) = usage {
        eprintln!("{usage}");
    }
    eprintln!("Try '{path} --help' for every argument.");
    std::process::exit(2)
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

#[cfg(test)]
mod tests {
    use clap::{Args, Command};

    /// A URL may carry a password: `--help` and usage errors never print its value
    /// from the environment.
    #[test]
    fn no_connection_url_is_shown_from_the_environment() {
        let command = [
            super::DatabaseArgs::augment_args,
            super::RedisArgs::augment_args,
            super::AmqpArgs::augment_args,
            super::ArtifactsArgs::augment_args,
        ]
        .iter()
        .fold(Command::new("cairn"), |command, add| add(command));
        let urls: Vec<_> = command
            .get_arguments()
            .filter(|a| {
                a.get_env()
                    .is_some_and(|e| e.to_string_lossy().ends_with("_URL"))
            })
            .collect();
        assert_eq!(urls.len(), 4);
        for arg in urls {
            assert!(arg.is_hide_env_values_set(), "{:?}", arg.get_env());
        }
    }
}
