//! The bodies of the sandbox routes, their defaults and bounds.

use crate::ids::Id;
use crate::run::{check_command, check_origin, FieldError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;
use uuid::Uuid;

pub const DEFAULT_TIMEOUT_SEC: u32 = 3_600;
pub const MAX_TIMEOUT_SEC: u32 = 86_400;
/// The idle auto-stop of a sandbox that does not set one (the seed's default for
/// accounts created after October 11, 2026: every Cairn installation).
pub const DEFAULT_IDLE_TIMEOUT_SEC: u32 = 1_800;
pub const DEFAULT_DISK_MB: u32 = 10_240;
pub const MAX_DISK_MB: u32 = 1_048_576;
pub const DEFAULT_EXEC_TIMEOUT_SEC: u32 = 60;
/// The largest file a read returns or a write takes.
pub const MAX_FILE_BYTES: usize = 4 * 1024 * 1024;

/// `POST /api/v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSpec {
    pub agent: String,
    /// A repository to clone into the new tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<String>,
    /// `snapshot:<id>`: start from a ready snapshot's tree (a new sandbox; the snapshot
    /// is never changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Idle-anchored: seconds from the last activity (an exec or a file operation) until
    /// a persistent sandbox is stopped and a non-persistent one destroyed. 1 to 86400,
    /// default 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 86400)]
    pub timeout_sec: Option<u32>,
    /// Idle auto-stop, also from the last activity; 0 disables it. Default 1800.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_sec: Option<u32>,
    /// Disables both timeouts until an explicit lifecycle action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub always_on: Option<bool>,
    /// Whether the sandbox survives a stop (its disk is kept). Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
    /// The disk size in MiB, 1 to 1048576, default 10240.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1048576)]
    pub disk_mb: Option<u32>,
    /// The network of its commands: `false` (none), `true` (the worker's egress policy),
    /// or `{"allow": ["HOST:PORT", "CIDR:PORT", …]}`, which narrows that policy to those
    /// destinations. Absent: the worker's default. An exec may still ask for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::egress::NetworkSpec>,
    /// Labels of the caller's (`{"team": "search"}`): at most 32, each key 1 to 63 of
    /// `A-Za-z0-9._-`, each value at most 256 characters. Copied to forks; a list is
    /// filtered on them with `?metadata.KEY=VALUE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// A template version's id (32 lowercase hex): start from the snapshot it names,
    /// instead of a repository or `source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub template_id: Option<String>,
    /// The ports a preview reaches (`/api/v1/sandboxes/{id}/preview/{port}/…`): at most
    /// 16, each 1 to 65535, distinct. Copied to forks. Default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 16, value_type = Option<Vec<u16>>)]
    pub ports: Option<Vec<u16>>,
    /// Services by name (at most 8): each started in the background on every start and
    /// resume. Copied to forks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<BTreeMap<String, super::service::ServiceSpec>>,
    /// The names of the tenant's volumes to attach (at most 4), each at
    /// `/volumes/<name>`. A volume is attached to one sandbox at a time and is never
    /// copied to forks, snapshots or templates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 4)]
    pub volumes: Option<Vec<String>>,
}

/// Checks the volumes to attach: how many, their names, none twice.
pub fn check_volumes(names: &[String]) -> Result<(), FieldError> {
    use super::volume::{valid_name, MAX_PER_SANDBOX};
    if names.len() > MAX_PER_SANDBOX {
        return Err(FieldError::new("volumes", "at most 4 volumes"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for name in names {
        if !valid_name(name) {
            return Err(FieldError::new(
                "volumes",
                format!("{name:?} is not a volume name: 1 to 63 of a-z, 0-9, '.', '_' or '-', starting with a letter or digit"),
            ));
        }
        if !seen.insert(name) {
            return Err(FieldError::new(
                "volumes",
                format!("{name} is listed twice"),
            ));
        }
    }
    Ok(())
}

/// The most ports a sandbox exposes to previews.
pub const MAX_PORTS: usize = 16;

/// Checks the exposed ports: how many, none 0, none twice.
pub fn check_ports(ports: &[u16]) -> Result<(), FieldError> {
    if ports.len() > MAX_PORTS {
        return Err(FieldError::new("ports", "at most 16 ports"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for port in ports {
        if *port == 0 {
            return Err(FieldError::new("ports", "each port from 1 to 65535"));
        }
        if !seen.insert(port) {
            return Err(FieldError::new(
                "ports",
                format!("port {port} is listed twice"),
            ));
        }
    }
    Ok(())
}

/// The most labels a sandbox has.
pub const MAX_METADATA_ENTRIES: usize = 32;
/// The longest label value, in characters.
pub const MAX_METADATA_VALUE: usize = 256;

/// A label's key: 1 to 63 of `A-Za-z0-9._-`.
pub fn valid_metadata_key(key: &str) -> bool {
    crate::run::valid_name(key, 63)
}

/// Checks a set of labels: their number, keys and values.
pub fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), FieldError> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(FieldError::new("metadata", "at most 32 entries"));
    }
    for (key, value) in metadata {
        if !valid_metadata_key(key) {
            return Err(FieldError::new(
                "metadata",
                format!("key {key:?} is not 1 to 63 of letters, digits, '.', '_' or '-'"),
            ));
        }
        if value.chars().count() > MAX_METADATA_VALUE || value.contains('\0') {
            return Err(FieldError::new(
                format!("metadata.{key}"),
                "at most 256 characters, without NUL",
            ));
        }
    }
    Ok(())
}

impl CreateSpec {
    /// Checks everything serde cannot.
    pub fn validate(&self) -> Result<(), FieldError> {
        let field = |name: &str| name.to_string();
        check_origin(
            &self.agent,
            self.repository.as_deref(),
            self.git_ref.as_deref(),
            field,
        )?;
        if self.source.is_some() && self.repository.is_some() {
            return Err(FieldError::new(
                "source",
                "a sandbox starts from a repository or from a snapshot, not both",
            ));
        }
        if self.template_id.is_some() && (self.source.is_some() || self.repository.is_some()) {
            return Err(FieldError::new(
                "template_id",
                "a sandbox starts from a template, a repository or a snapshot: one of them",
            ));
        }
        self.template()?;
        self.source_snapshot()?;
        check_timeout(
            self.timeout_sec.unwrap_or(DEFAULT_TIMEOUT_SEC),
            "timeout_sec",
        )?;
        if let Some(disk) = self.disk_mb {
            check_disk(disk)?;
        }
        if let Some(problem) = self.network.as_ref().and_then(|n| n.problem()) {
            return Err(FieldError::new("network.allow", &problem));
        }
        if let Some(metadata) = &self.metadata {
            check_metadata(metadata)?;
        }
        if let Some(ports) = &self.ports {
            check_ports(ports)?;
        }
        if let Some(services) = &self.services {
            super::service::check_services(services)?;
        }
        if let Some(volumes) = &self.volumes {
            check_volumes(volumes)?;
        }
        Ok(())
    }

    /// The template version named by `template_id`, if any.
    pub fn template(&self) -> Result<Option<Uuid>, FieldError> {
        let Some(template) = &self.template_id else {
            return Ok(None);
        };
        template
            .parse::<Id>()
            .map(|id| Some(id.uuid()))
            .map_err(|_| {
                FieldError::new("template_id", "a template version's id: 32 lowercase hex")
            })
    }

    /// The snapshot named by `source`, if any.
    pub fn source_snapshot(&self) -> Result<Option<Uuid>, FieldError> {
        let Some(source) = &self.source else {
            return Ok(None);
        };
        source
            .strip_prefix("snapshot:")
            .and_then(|id| id.parse::<Id>().ok())
            .map(|id| Some(id.uuid()))
            .ok_or_else(|| FieldError::new("source", "`snapshot:` and a 32-hex snapshot id"))
    }

    /// The same input with its defaults filled in (what an idempotency key binds).
    pub fn normalized(&self) -> CreateSpec {
        CreateSpec {
            timeout_sec: Some(self.timeout_sec.unwrap_or(DEFAULT_TIMEOUT_SEC)),
            idle_timeout_sec: Some(self.idle_timeout_sec.unwrap_or(DEFAULT_IDLE_TIMEOUT_SEC)),
            always_on: Some(self.always_on.unwrap_or(false)),
            persistent: Some(self.persistent.unwrap_or(true)),
            disk_mb: Some(self.disk_mb.unwrap_or(DEFAULT_DISK_MB)),
            ..self.clone()
        }
    }
}

/// A timeout of 1 to 86400 seconds.
pub fn check_timeout(seconds: u32, field: &str) -> Result<(), FieldError> {
    if (1..=MAX_TIMEOUT_SEC).contains(&seconds) {
        Ok(())
    } else {
        Err(FieldError::new(field, "from 1 to 86400"))
    }
}

/// A disk size of 1 MiB to 1 TiB.
pub fn check_disk(disk_mb: u32) -> Result<(), FieldError> {
    if (1..=MAX_DISK_MB).contains(&disk_mb) {
        Ok(())
    } else {
        Err(FieldError::new("disk_mb", "from 1 to 1048576"))
    }
}

/// `POST /api/v1/sandboxes/{id}/exec`: one command in the sandbox's step sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    #[schema(min_items = 1)]
    pub argv: Vec<String>,
    /// At most 1,000 variables.
    #[serde(default)]
    #[schema(schema_with = crate::run::variables_schema)]
    pub env: BTreeMap<String, String>,
    /// Relative to the sandbox's tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// 1 to 86400 seconds, default 60.
    #[serde(default = "default_exec_timeout")]
    #[schema(minimum = 1, maximum = 86400)]
    pub timeout_sec: u32,
    /// Whether the command reaches the network. Absent: the worker's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
    /// Keep its standard input open for `POST …/operations/{id}/input` while it runs
    /// (else it reads `/dev/null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
    /// Run it in a terminal of this size: the terminal is its input, output and errors
    /// (all on `stdout`, with the terminal's own line endings), fed by `…/input` and
    /// sized by `…/resize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
}

/// A terminal's size, in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    #[schema(minimum = 1, maximum = 1000)]
    pub rows: u16,
    #[schema(minimum = 1, maximum = 1000)]
    pub cols: u16,
}

impl PtySize {
    pub fn validate(&self, field: &str) -> Result<(), FieldError> {
        if !(1..=1000).contains(&self.rows) || !(1..=1000).contains(&self.cols) {
            return Err(FieldError::new(field, "rows and cols from 1 to 1000"));
        }
        Ok(())
    }
}

fn default_exec_timeout() -> u32 {
    DEFAULT_EXEC_TIMEOUT_SEC
}

impl ExecSpec {
    pub fn validate(&self) -> Result<(), FieldError> {
        if let Some(pty) = &self.pty {
            pty.validate("pty")?;
        }
        check_command(
            &self.argv,
            &self.env,
            self.cwd.as_deref(),
            self.timeout_sec,
            |name| match name {
                "timeout_seconds" => "timeout_sec".to_string(),
                other => other.to_string(),
            },
        )
    }
}

/// A file operation's target: a path relative to the sandbox's tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    /// Relative to the tree; `""` or `.` is its root (for a listing).
    pub path: String,
}

impl FileSpec {
    /// A relative path that stays in the tree; `allow_root` for a listing.
    pub fn validate(&self, allow_root: bool) -> Result<(), FieldError> {
        let path = std::path::Path::new(&self.path);
        let escapes = self.path.starts_with('/')
            || self.path.contains('\0')
            || self.path.len() > 4096
            || path
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir));
        if escapes {
            return Err(FieldError::new(
                "path",
                "a relative path inside the sandbox",
            ));
        }
        let root = path
            .components()
            .all(|c| matches!(c, std::path::Component::CurDir));
        if root && !allow_root {
            return Err(FieldError::new("path", "a file inside the sandbox"));
        }
        Ok(())
    }
}

/// The largest fan-out of one fork.
pub const MAX_FORKS: u32 = 100;

/// `POST /api/v1/sandboxes/{id}/fork`: new sandboxes from one capture of a running one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkSpec {
    /// The forks' timeout; default the source's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 86400)]
    pub timeout_sec: Option<u32>,
    /// How many forks from the one capture, 1 to 100 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 100)]
    pub count: Option<u32>,
    /// The forks' disk in MiB: the source's or larger, never smaller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u32>,
    /// Refused: a fork's tree is its source's capture (a template starts a new sandbox:
    /// `template_id` on create).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_id: Option<String>,
}

impl ForkSpec {
    pub fn validate(&self) -> Result<(), FieldError> {
        if let Some(timeout) = self.timeout_sec {
            check_timeout(timeout, "timeout_sec")?;
        }
        if !(1..=MAX_FORKS).contains(&self.count.unwrap_or(1)) {
            return Err(FieldError::new("count", "from 1 to 100"));
        }
        if let Some(disk) = self.disk_mb {
            check_disk(disk)?;
        }
        if self.template_id.is_some() {
            return Err(FieldError::new(
                "template_id",
                "a fork's tree is its source's capture; to start from a template, create a sandbox with template_id",
            ));
        }
        Ok(())
    }

    pub fn count(&self) -> u32 {
        self.count.unwrap_or(1)
    }
}

/// `POST /api/v1/sandboxes/{id}/snapshots`: a named snapshot of a running sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotSpec {
    /// Up to 200 characters, no control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl SnapshotSpec {
    pub fn validate(&self) -> Result<(), FieldError> {
        match &self.name {
            Some(name)
                if name.is_empty() || name.len() > 200 || name.chars().any(char::is_control) =>
            {
                Err(FieldError::new(
                    "name",
                    "1 to 200 characters, no control characters",
                ))
            }
            _ => Ok(()),
        }
    }
}

/// What the owner of a sandbox carries out for the API: in order, but for an exec that
/// takes input ([`Operation::takes_input`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Operation {
    Exec(ExecSpec),
    Read(FileSpec),
    /// `content` is base64.
    Write {
        path: String,
        content: String,
    },
    List(FileSpec),
    /// A named snapshot of the tree.
    Snapshot(SnapshotSpec),
    /// One capture, then `count` new sandboxes from it.
    Fork(ForkSpec),
    /// (Re)starts the service `name`, or ends it (`service` absent: it was deleted).
    Service {
        name: String,
        service: Option<super::service::ServiceSpec>,
    },
}

impl Operation {
    pub fn kind(&self) -> &'static str {
        match self {
            Operation::Exec(_) => "exec",
            Operation::Read(_) => "read",
            Operation::Write { .. } => "write",
            Operation::List(_) => "list",
            Operation::Snapshot(_) => "snapshot",
            Operation::Fork(_) => "fork",
            Operation::Service { .. } => "service",
        }
    }

    /// Whether it can change the tree (so it is journaled and committed with a capture).
    pub fn changes_tree(&self) -> bool {
        matches!(self, Operation::Exec(_) | Operation::Write { .. })
    }

    /// Whether it is an exec that takes input (its standard input, or a terminal): it
    /// runs beside the sandbox's other operations, which it would otherwise hold up for
    /// as long as it waits for someone to type.
    pub fn takes_input(&self) -> bool {
        matches!(self, Operation::Exec(spec) if spec.stdin == Some(true) || spec.pty.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_exec_that_takes_input_runs_beside() {
        let operation = |body: serde_json::Value| -> Operation {
            serde_json::from_value(body).expect("decodes")
        };
        let exec = |extra: serde_json::Value| {
            let mut body = serde_json::json!({"kind": "exec", "argv": ["sh"]});
            body.as_object_mut()
                .expect("object")
                .extend(extra.as_object().expect("object").clone());
            operation(body)
        };
        assert!(exec(serde_json::json!({"stdin": true})).takes_input());
        assert!(exec(serde_json::json!({"pty": {"rows": 24, "cols": 80}})).takes_input());
        assert!(!exec(serde_json::json!({"stdin": false})).takes_input());
        assert!(!exec(serde_json::json!({})).takes_input());
        let read = operation(serde_json::json!({"kind": "read", "path": "a.txt"}));
        assert!(!read.takes_input());
    }

    fn create(body: serde_json::Value) -> CreateSpec {
        serde_json::from_value(body).expect("decodes")
    }

    #[test]
    fn create_defaults_and_bounds() {
        let spec = create(serde_json::json!({"agent": "coder"}));
        assert_eq!(spec.validate(), Ok(()));
        let normal = spec.normalized();
        assert_eq!(normal.timeout_sec, Some(3600));
        assert_eq!(normal.idle_timeout_sec, Some(1800));
        assert_eq!(normal.persistent, Some(true));
        assert_eq!(normal.always_on, Some(false));
        for (body, field) in [
            (
                serde_json::json!({"agent": "c", "timeout_sec": 0}),
                "timeout_sec",
            ),
            (
                serde_json::json!({"agent": "c", "timeout_sec": 86401}),
                "timeout_sec",
            ),
            (serde_json::json!({"agent": "c", "disk_mb": 0}), "disk_mb"),
            (
                serde_json::json!({"agent": "c", "source": "snap:1"}),
                "source",
            ),
            (
                serde_json::json!({"agent": "c", "repository": "r", "source": format!("snapshot:{}", Id::new())}),
                "source",
            ),
            (serde_json::json!({"agent": "bad agent"}), "agent"),
        ] {
            assert_eq!(
                create(body).validate().map_err(|e| e.field),
                Err(field.into())
            );
        }
        let id = Id::new();
        let from = create(serde_json::json!({"agent": "c", "source": format!("snapshot:{id}")}));
        assert_eq!(from.source_snapshot(), Ok(Some(id.uuid())));
    }

    #[test]
    fn paths_stay_in_the_tree() {
        let path = |p: &str| FileSpec { path: p.into() };
        assert!(path("a/b.txt").validate(false).is_ok());
        assert!(path(".").validate(true).is_ok());
        assert!(path("").validate(false).is_err());
        assert!(path("../x").validate(true).is_err());
        assert!(path("/etc/passwd").validate(true).is_err());
        assert!(path("a/../../x").validate(true).is_err());
    }
}
