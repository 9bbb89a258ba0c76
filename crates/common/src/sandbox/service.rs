//! A sandbox's services: commands its owner starts in the background on every start
//! and resume (a stop ends every process; these are what "enabled" means), and again
//! when one is set. Each start is an operation in the sandbox's journal.

use crate::run::{check_command, valid_name, FieldError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// The most services a sandbox has.
pub const MAX_SERVICES: usize = 8;

/// `PUT /api/v1/sandboxes/{id}/services/{name}`, and each of `services` on create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// The program and its arguments; it runs until it exits, the sandbox stops, or the
    /// service is set again or deleted. Its output goes to
    /// `$HOME/.cairn-services/NAME.log` in the sandbox.
    #[schema(min_items = 1)]
    pub argv: Vec<String>,
    /// At most 1,000 variables.
    #[serde(default)]
    #[schema(schema_with = crate::run::variables_schema)]
    pub env: BTreeMap<String, String>,
    /// Relative to the sandbox's tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Whether it reaches the network. Absent: the worker's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
}

impl ServiceSpec {
    pub fn validate(&self, name: &str) -> Result<(), FieldError> {
        check_service_name(name)?;
        check_command(&self.argv, &self.env, self.cwd.as_deref(), 1, |field| {
            format!("services.{name}.{field}")
        })
    }
}

/// A service's name: 1 to 63 of `A-Za-z0-9._-`, not only dots (`.` and `..` are path
/// segments every client resolves).
pub fn check_service_name(name: &str) -> Result<(), FieldError> {
    if valid_name(name, 63) && !name.bytes().all(|b| b == b'.') {
        Ok(())
    } else {
        Err(FieldError::new(
            "services",
            format!("service name {name:?} is not 1 to 63 of letters, digits, '.', '_' or '-'"),
        ))
    }
}

/// Checks a sandbox's services: how many, and each.
pub fn check_services(services: &BTreeMap<String, ServiceSpec>) -> Result<(), FieldError> {
    if services.len() > MAX_SERVICES {
        return Err(FieldError::new("services", "at most 8 services"));
    }
    services
        .iter()
        .try_for_each(|(name, spec)| spec.validate(name))
}

/// The script that (re)starts a service in the sandbox: the earlier instance's process
/// group ends first (`TERM`, up to 5 s, then `KILL`, so its port is free); the new one
/// leads a group of its own, its id in a file beside its log, both in the sandbox's
/// home (the sandbox writes them itself), at `CAIRN_SERVICE_DIR`, which the owner sets
/// after the service's own variables. `sh` is whatever the view has (`dash` here), so
/// the script keeps to POSIX.
pub const LAUNCHER: &str = r#"unset IFS
name=$1; shift
dir=$CAIRN_SERVICE_DIR; mkdir -p "$dir"
if [ -s "$dir/$name.pid" ]; then
  group=$(cat "$dir/$name.pid")
  kill -TERM "-$group" 2>/dev/null
  for _ in $(seq 100); do kill -0 "-$group" 2>/dev/null || break; sleep 0.05; done
  kill -KILL "-$group" 2>/dev/null
fi
rm -f "$dir/$name.pid"
[ "$#" -eq 0 ] && exit 0
command -v -- "$1" >/dev/null || { printf '%s: not found\n' "$1" >&2; exit 127; }
setsid sh -c 'echo $$ > "$0"; exec "$@"' "$dir/$name.pid" "$@" >>"$dir/$name.log" 2>&1 </dev/null &
for _ in $(seq 100); do [ -s "$dir/$name.pid" ] && break; sleep 0.01; done
[ -s "$dir/$name.pid" ] || { echo "the service did not start" >&2; exit 1; }
sleep 0.1
kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null && exit 0
echo "the service exited at once; its log: $dir/$name.log" >&2; tail -n 5 "$dir/$name.log" >&2; exit 1
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_are_bounded_and_named() {
        let spec = |argv: &[&str]| ServiceSpec {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            env: BTreeMap::new(),
            cwd: None,
            network: None,
        };
        let ok = BTreeMap::from([("web".to_string(), spec(&["python3", "-m", "http.server"]))]);
        assert_eq!(check_services(&ok), Ok(()));
        for name in ["a b", ".", "..", ""] {
            let unnamed = BTreeMap::from([(name.to_string(), spec(&["x"]))]);
            assert!(check_services(&unnamed).is_err(), "{name:?}");
        }
        let empty = BTreeMap::from([("web".to_string(), spec(&[]))]);
        assert_eq!(
            check_services(&empty).map_err(|e| e.field),
            Err("services.web.argv".to_string())
        );
        let many: BTreeMap<_, _> = (0..9).map(|i| (format!("s{i}"), spec(&["x"]))).collect();
        assert!(check_services(&many).is_err());
    }
}
