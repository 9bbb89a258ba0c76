//! Secret settings read from files: `CAIRN_DATABASE_URL_FILE=/run/secrets/db` instead of
//! `CAIRN_DATABASE_URL=…`, so that a credential need not sit in the process environment
//! (where `kubectl describe`, crash reporters and child processes would see it). The
//! file's content, without its trailing line break, becomes the setting's value.

use clap::builder::Resettable;
use clap::Command;
use std::collections::BTreeMap;

/// The settings that may come from a file, and whether a missing file means "not set".
const SECRET_SETTINGS: &[(&str, bool)] = &[
    ("CAIRN_DATABASE_URL", false),
    ("CAIRN_REDIS_URL", false),
    ("CAIRN_AMQP_URL", false),
    // Optional in a mounted Secret: a missing key leaves no file, and no token.
    ("CAIRN_BOOTSTRAP_ADMIN_TOKEN", true),
    // cairnctl's API token, e.g. in a pod that mounts it from a Secret.
    ("CAIRN_TOKEN", false),
];

/// Reads each `<NAME>_FILE` set in `env`. Setting both `<NAME>` and `<NAME>_FILE` is
/// refused, since one of them would be silently ignored.
pub fn read(
    env: impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<&'static str, String>, String> {
    let mut values = BTreeMap::new();
    for &(name, optional) in SECRET_SETTINGS {
        let file_var = format!("{name}_FILE");
        let Some(path) = env(&file_var).filter(|p| !p.is_empty()) else {
            continue;
        };
        if env(name).is_some() {
            return Err(format!(
                "{name} and {file_var} are both set: set one of them"
            ));
        }
        match std::fs::read(&path) {
            Ok(bytes) => {
                let text = String::from_utf8(bytes)
                    .map_err(|_| format!("{file_var}: {path} does not hold UTF-8 text"))?;
                let value = text.strip_suffix('\n').unwrap_or(&text);
                let value = value.strip_suffix('\r').unwrap_or(value);
                values.insert(name, value.to_string());
            }
            Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => {}
            // The error names the path, never the content.
            Err(e) => return Err(format!("{file_var}: cannot read {path}: {e}")),
        }
    }
    Ok(values)
}

/// Makes each value read by [`read`] the default of the argument bound to its variable,
/// in `command` and its subcommands. Its default is hidden from `--help`.
pub fn apply(command: Command, values: &BTreeMap<&'static str, String>) -> Command {
    if values.is_empty() {
        return command;
    }
    let command = command.mut_args(|arg| {
        let Some(name) = arg.get_env().and_then(|n| n.to_str()) else {
            return arg;
        };
        match values.get(name) {
            Some(value) => arg
                .default_value(Resettable::Value(value.clone().into()))
                .hide_default_value(true),
            None => arg,
        }
    });
    let names: Vec<String> = command
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    names.into_iter().fold(command, |command, name| {
        command.mut_subcommand(name, |sub| apply(sub, values))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn a_file_gives_the_value_without_its_line_break() {
        let path = std::env::temp_dir().join(format!("cairn-secret-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, "postgres://u:p%40ss@db/cairn\n").unwrap();
        let values = read(env_of(&[(
            "CAIRN_DATABASE_URL_FILE",
            path.to_str().unwrap(),
        )]));
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            values.unwrap()["CAIRN_DATABASE_URL"],
            "postgres://u:p%40ss@db/cairn"
        );
    }

    #[test]
    fn both_forms_or_a_missing_required_file_are_refused() {
        let both = read(env_of(&[
            ("CAIRN_REDIS_URL", "redis://x"),
            ("CAIRN_REDIS_URL_FILE", "/nonexistent"),
        ]));
        assert!(both.unwrap_err().contains("both set"));
        let missing = read(env_of(&[("CAIRN_AMQP_URL_FILE", "/nonexistent/amqp")])).unwrap_err();
        assert!(missing.starts_with("CAIRN_AMQP_URL_FILE: cannot read /nonexistent/amqp"));
        let token = read(env_of(&[(
            "CAIRN_BOOTSTRAP_ADMIN_TOKEN_FILE",
            "/nonexistent/t",
        )]));
        assert!(
            token.unwrap().is_empty(),
            "a missing token file is no token"
        );
    }

    #[test]
    fn the_value_reaches_the_argument_and_stays_out_of_help() {
        #[derive(clap::Parser, Debug)]
        struct Cli {
            #[command(subcommand)]
            command: Sub,
        }
        #[derive(clap::Subcommand, Debug)]
        enum Sub {
            Migrate {
                #[arg(long, env = "CAIRN_DATABASE_URL", default_value = "postgres://local")]
                database_url: String,
            },
        }
        use clap::{CommandFactory, FromArgMatches};
        let values = BTreeMap::from([("CAIRN_DATABASE_URL", "postgres://secret@db/x".to_string())]);
        let mut command = apply(Cli::command(), &values);
        let help = command
            .find_subcommand_mut("migrate")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(!help.contains("secret@db"), "{help}");
        let matches = command
            .try_get_matches_from(["cairnctl", "migrate"])
            .unwrap();
        let Sub::Migrate { database_url } = Cli::from_arg_matches(&matches).unwrap().command;
        assert_eq!(database_url, "postgres://secret@db/x");
    }
}
