//! Runs: what a client submits (a plan of steps, budgets, attempts), and the message that
//! announces work (a contract: workers of another version decode it).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Largest number of steps in one plan.
pub const MAX_STEPS: usize = 200;
/// Most variables a command may set. The step sandbox passes each as three of
/// bubblewrap's arguments, of which it takes at most 9,000 in all.
pub const MAX_VARIABLES: usize = 1_000;

/// The schema of a command's `env`: names to values, at most [`MAX_VARIABLES`].
pub fn variables_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(ObjectBuilder::new().schema_type(Type::String)))
        .additional_properties(Some(ObjectBuilder::new().schema_type(Type::String)))
        .max_properties(Some(MAX_VARIABLES))
        .description(Some(
            "The command's variables, at most 1,000 (names to values), on top of the \
             few the runner sets (such as PATH and HOME); nothing else is inherited.",
        ))
        .build()
}

/// Largest number of runs in one batch admission.
pub const MAX_BATCH: usize = 1_000;
/// Default bound on automatic attempts.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// A rejected field: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// One command of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    /// Unique within the plan: `[A-Za-z0-9._-]`, at most 64 characters. The journal keys
    /// intents and receipts by it.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub key: String,
    /// Program and arguments; run directly, not through a shell.
    #[schema(min_items = 1)]
    pub argv: Vec<String>,
    /// Environment of the step, at most 1,000 variables; nothing else is inherited.
    #[serde(default)]
    #[schema(schema_with = variables_schema)]
    pub env: BTreeMap<String, String>,
    /// Working directory relative to the workspace root.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Time limit of one execution, 1..=86400 seconds.
    #[serde(default = "default_step_timeout")]
    #[schema(minimum = 1, maximum = 86400)]
    pub timeout_seconds: u32,
    /// Whether running it again after an unknown outcome is safe.
    #[serde(default)]
    pub idempotent: bool,
    /// The step's network, always a namespace of its own: `false`, its loopback only;
    /// `true`, a NAT under the worker's egress policy; `{"allow": [...]}`, that policy
    /// narrowed to the named destinations (never widened). Absent: the worker's default
    /// (`CAIRN_STEP_NETWORK`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::egress::NetworkSpec>,
    /// Resource limits of the step's sandbox; an absent one is the worker's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<StepLimits>,
    /// When it runs again after a failure; absent: the run's `retry`, else never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<crate::step_retry::RetryPolicy>,
}

/// Resource limits of one step's sandbox: all its processes together where the worker
/// has a cgroup (memory, processes), each process otherwise. A step that passes one ends
/// with the limit named in its receipt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepLimits {
    /// Memory, in MiB (16 to 1048576).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 16, maximum = 1_048_576)]
    pub memory_mb: Option<u64>,
    /// Processes and threads at once (8 to 1000000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 8, maximum = 1_000_000)]
    pub pids: Option<u32>,
    /// CPU time, in seconds (1 to 604800).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 604_800)]
    pub cpu_seconds: Option<u32>,
    /// Open files of each process (16 to 1048576).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 16, maximum = 1_048_576)]
    pub open_files: Option<u32>,
}

impl StepLimits {
    /// Each limit of `self`, or of `defaults` where `self` has none.
    pub fn or(self, defaults: StepLimits) -> StepLimits {
        StepLimits {
            memory_mb: self.memory_mb.or(defaults.memory_mb),
            pids: self.pids.or(defaults.pids),
            cpu_seconds: self.cpu_seconds.or(defaults.cpu_seconds),
            open_files: self.open_files.or(defaults.open_files),
        }
    }

    /// The first limit out of its bounds: its field name and the bounds.
    pub fn out_of_bounds(&self) -> Option<(&'static str, &'static str)> {
        let outside = |value: Option<u64>, low: u64, high: u64| {
            value.is_some_and(|v| !(low..=high).contains(&v))
        };
        if outside(self.memory_mb, 16, 1_048_576) {
            return Some(("memory_mb", "from 16 to 1048576"));
        }
        if outside(self.pids.map(u64::from), 8, 1_000_000) {
            return Some(("pids", "from 8 to 1000000"));
        }
        if outside(self.cpu_seconds.map(u64::from), 1, 604_800) {
            return Some(("cpu_seconds", "from 1 to 604800"));
        }
        if outside(self.open_files.map(u64::from), 16, 1_048_576) {
            return Some(("open_files", "from 16 to 1048576"));
        }
        None
    }
}

fn default_step_timeout() -> u32 {
    600
}

/// Limits charged across every attempt and continuation of a request; never reset.
/// Optional, as is each of its fields: 1000 commands and 86400 s (one day) by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Budgets {
    /// Commands the request may execute in all (reused receipts are not re-charged);
    /// default 1000.
    #[schema(maximum = 100000, default = 1000)]
    pub max_commands: u32,
    /// Wall-clock seconds of step execution the request may spend in all; default 86400.
    #[schema(minimum = 1, maximum = 604800, default = 86400)]
    pub max_wall_seconds: u32,
}

/// Enough for a plan of every allowed step run a few times over, and a day of
/// execution: a run without budgets is bounded, and rarely by them.
impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            max_commands: 1000,
            max_wall_seconds: 86_400,
        }
    }
}

/// What a client submits to `POST /api/v1/runs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"agent": "builder", "steps": [{"key": "build", "argv": ["sh", "-c", "make test"], "timeout_seconds": 600}], "budgets": {"max_commands": 20, "max_wall_seconds": 3600}, "max_attempts": 3})))]
pub struct RunSpec {
    /// Which agent the run is for (part of workspace and snapshot ownership).
    #[schema(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    pub agent: String,
    /// Git repository URL or local path; without one the steps run in a scratch directory.
    #[serde(default)]
    pub repository: Option<String>,
    /// Git ref to check out (default: the repository's HEAD).
    #[serde(default, rename = "ref")]
    pub git_ref: Option<String>,
    #[schema(min_items = 1, max_items = 200)]
    pub steps: Vec<StepSpec>,
    #[serde(default)]
    pub budgets: Budgets,
    /// After this instant no further attempt or continuation starts.
    #[serde(default)]
    pub deadline: Option<DateTime<Utc>>,
    /// Automatic attempts after lost leases, 1..=20 (default 3).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 20)]
    pub max_attempts: Option<u32>,
    /// Labels to find the run by (`team: search`): up to 32; keys of 1 to 63 of
    /// `a-z 0-9 . _ - /`, values of 0 to 63 of `A-Z a-z 0-9 . _ -`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Flow control: at most `concurrency_limit` runs with this key run at once, across
    /// every worker; the others wait, by priority then admission. 1 to 128 of
    /// `A-Za-z0-9._-:/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// How many runs of `concurrency_key` may run at once: 1 to 1000 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1000)]
    pub concurrency_limit: Option<u32>,
    /// When workers are busy, a waiting run of higher priority is released to them
    /// first: -100 to 100 (a run that names none is not held for flow control at all).
    /// A waiting run gains 1 for every 10 s it waits, so none starves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = -100, maximum = 100)]
    pub priority: Option<i32>,
    /// At most `per_second` runs with this key start in any one second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// The retry policy of every step that names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<crate::step_retry::RetryPolicy>,
}

/// A per-key start rate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// 1 to 128 of `A-Za-z0-9._-:/`.
    pub key: String,
    /// 1 to 10000.
    #[schema(minimum = 1, maximum = 10000)]
    pub per_second: u32,
}

/// A flow-control key: 1 to 128 of `A-Za-z0-9._-:/`.
pub fn valid_flow_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 128
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/'))
}

impl RunSpec {
    /// Its steps, each with the run's retry policy where it names none.
    pub fn effective_steps(&self) -> Vec<StepSpec> {
        self.steps
            .iter()
            .map(|step| StepSpec {
                retry: step.retry.clone().or_else(|| self.retry.clone()),
                ..step.clone()
            })
            .collect()
    }

    /// Whether the scheduler's gate holds the run until its flow control lets it start.
    pub fn flow_controlled(&self) -> bool {
        self.concurrency_key.is_some() || self.rate_limit.is_some() || self.priority.is_some()
    }

    /// Checks the flow-control fields; `field` names one in an error.
    fn check_flow(&self, field: impl Fn(&str) -> String) -> Result<(), FieldError> {
        if let Some(key) = &self.concurrency_key {
            if !valid_flow_key(key) {
                return Err(FieldError::new(
                    field("concurrency_key"),
                    "1 to 128 of A-Z a-z 0-9 . _ - : /",
                ));
            }
        }
        match self.concurrency_limit {
            Some(_) if self.concurrency_key.is_none() => {
                return Err(FieldError::new(
                    field("concurrency_limit"),
                    "needs a concurrency_key",
                ))
            }
            Some(n) if !(1..=1000).contains(&n) => {
                return Err(FieldError::new(field("concurrency_limit"), "1 to 1000"))
            }
            _ => {}
        }
        if self.priority.is_some_and(|p| !(-100..=100).contains(&p)) {
            return Err(FieldError::new(field("priority"), "-100 to 100"));
        }
        if let Some(rate) = &self.rate_limit {
            if !valid_flow_key(&rate.key) {
                return Err(FieldError::new(
                    field("rate_limit.key"),
                    "1 to 128 of A-Z a-z 0-9 . _ - : /",
                ));
            }
            if !(1..=10_000).contains(&rate.per_second) {
                return Err(FieldError::new(
                    field("rate_limit.per_second"),
                    "1 to 10000",
                ));
            }
        }
        Ok(())
    }
}

/// A name of letters, digits, `.`, `_` and `-`, 1 to `max` long (agents, step keys).
pub fn valid_name(text: &str, max: usize) -> bool {
    !text.is_empty()
        && text.len() <= max
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Checks a command anything runs (a step, a verification check): a program, no NUL,
/// at most [`MAX_VARIABLES`] valid variables, a working directory inside the workspace,
/// a timeout of 1..=86400 s. `at` names a field of the command.
pub fn check_command(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
    timeout_seconds: u32,
    at: impl Fn(&str) -> String,
) -> Result<(), FieldError> {
    if argv.is_empty() || argv[0].is_empty() {
        return Err(FieldError::new(at("argv"), "a program is required"));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(FieldError::new(at("argv"), "arguments cannot contain NUL"));
    }
    if env.len() > MAX_VARIABLES {
        return Err(FieldError::new(
            at("env"),
            format!("at most {MAX_VARIABLES} variables"),
        ));
    }
    for (name, value) in env {
        let valid = !name.is_empty()
            && !name.contains('=')
            && !name.contains('\0')
            && !value.contains('\0');
        if !valid {
            return Err(FieldError::new(
                at("env"),
                format!("invalid variable {name:?}"),
            ));
        }
    }
    if let Some(cwd) = cwd {
        let escapes = cwd.starts_with('/')
            || cwd.contains('\0')
            || std::path::Path::new(cwd)
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir));
        if escapes {
            return Err(FieldError::new(
                at("cwd"),
                "a relative path inside the workspace",
            ));
        }
    }
    if !(1..=86_400).contains(&timeout_seconds) {
        return Err(FieldError::new(at("timeout_seconds"), "from 1 to 86400"));
    }
    Ok(())
}

/// Checks what a workspace starts from, for a run or a sandbox: the agent's name, and a
/// repository with an optional ref.
pub fn check_origin(
    agent: &str,
    repository: Option<&str>,
    git_ref: Option<&str>,
    field: impl Fn(&str) -> String,
) -> Result<(), FieldError> {
    if !valid_name(agent, 128) {
        return Err(FieldError::new(
            field("agent"),
            "1 to 128 characters of letters, digits, '.', '_' or '-'",
        ));
    }
    if let Some(repository) = repository {
        if repository.trim().is_empty() || repository.len() > 2048 {
            return Err(FieldError::new(field("repository"), "1 to 2048 characters"));
        }
    }
    if let Some(git_ref) = git_ref {
        if repository.is_none() {
            return Err(FieldError::new(field("ref"), "a ref needs a repository"));
        }
        let bad = git_ref.is_empty()
            || git_ref.len() > 255
            || git_ref.starts_with('-')
            || git_ref.contains("..")
            || git_ref.chars().any(|c| c.is_whitespace() || c.is_control());
        if bad {
            return Err(FieldError::new(field("ref"), "not a valid git ref"));
        }
    }
    Ok(())
}

impl RunSpec {
    /// Checks everything serde cannot. `prefix` names the field path (`runs[3].`).
    pub fn validate(&self, prefix: &str, now: DateTime<Utc>) -> Result<(), FieldError> {
        let field = |name: &str| format!("{prefix}{name}");
        check_origin(
            &self.agent,
            self.repository.as_deref(),
            self.git_ref.as_deref(),
            field,
        )?;
        crate::labels::check(&self.labels, &field("labels"))
            .map_err(|e| FieldError::new(e.field, e.message))?;
        self.check_flow(field)?;
        if let Some((name, why)) = self.retry.as_ref().and_then(|r| r.problem()) {
            return Err(FieldError::new(field(&format!("retry.{name}")), why));
        }
        if self.steps.is_empty() {
            // A run with nothing to do is a mistake, not a run that completes at once.
            return Err(FieldError::new(field("steps"), "at least one step"));
        }
        if self.steps.len() > MAX_STEPS {
            return Err(FieldError::new(
                field("steps"),
                format!("at most {MAX_STEPS} steps"),
            ));
        }
        let mut keys = std::collections::HashSet::new();
        for (i, step) in self.steps.iter().enumerate() {
            let at = |name: &str| field(&format!("steps[{i}].{name}"));
            if !valid_name(&step.key, 64) {
                return Err(FieldError::new(
                    at("key"),
                    "1 to 64 characters of letters, digits, '.', '_' or '-'",
                ));
            }
            if !keys.insert(step.key.as_str()) {
                return Err(FieldError::new(at("key"), "step keys must be unique"));
            }
            check_command(
                &step.argv,
                &step.env,
                step.cwd.as_deref(),
                step.timeout_seconds,
                at,
            )?;
            if let Some((name, why)) = step.retry.as_ref().and_then(|r| r.problem()) {
                return Err(FieldError::new(at(&format!("retry.{name}")), why));
            }
            if let Some(problem) = step.network.as_ref().and_then(|n| n.problem()) {
                return Err(FieldError::new(at("network.allow"), problem));
            }
            if let Some((name, bounds)) = step.limits.and_then(|l| l.out_of_bounds()) {
                return Err(FieldError::new(at(&format!("limits.{name}")), bounds));
            }
        }
        if self.budgets.max_commands > 100_000 {
            return Err(FieldError::new(
                field("budgets.max_commands"),
                "at most 100000",
            ));
        }
        if !(1..=7 * 86_400).contains(&self.budgets.max_wall_seconds) {
            return Err(FieldError::new(
                field("budgets.max_wall_seconds"),
                "from 1 to 604800",
            ));
        }
        if let Some(max_attempts) = self.max_attempts {
            if !(1..=20).contains(&max_attempts) {
                return Err(FieldError::new(field("max_attempts"), "from 1 to 20"));
            }
        }
        if let Some(deadline) = self.deadline {
            if deadline <= now {
                return Err(FieldError::new(field("deadline"), "must be in the future"));
            }
        }
        Ok(())
    }

    pub fn max_attempts(&self) -> u32 {
        self.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS)
    }

    /// The same input with its defaults filled in: omitting a default and sending it are
    /// the same input (what an idempotency key binds).
    pub fn normalized(&self) -> RunSpec {
        RunSpec {
            max_attempts: Some(self.max_attempts()),
            ..self.clone()
        }
    }
}

/// What the relay publishes to announce work; workers decode it. A sandbox placement
/// carries the sandbox's id as both `run_id` and `request_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMessage {
    pub kind: JobKind,
    /// The tenant of the run or sandbox, stamped by the outbox from the row itself (what
    /// a constructor puts here is replaced). A worker claims only what is this tenant's
    /// in the database, so an announcement never carries work across tenants. One
    /// published before tenants existed has none, and was the default tenant's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub run_id: uuid::Uuid,
    pub request_id: uuid::Uuid,
    #[serde(default)]
    pub action_id: Option<uuid::Uuid>,
    #[serde(default)]
    pub attempt: Option<i32>,
}

impl JobMessage {
    /// The tenant the announcement names.
    pub fn tenant(&self) -> &str {
        self.tenant.as_deref().unwrap_or("default")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    Run,
    CheckpointContinuation,
    FinalOutcomeContinuation,
    Verification,
    /// A sandbox to place on a worker (created, resumed or restored).
    Sandbox,
    /// A completed run's result to deliver as a patch artifact.
    Publication,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RunSpec {
        serde_json::from_value(serde_json::json!({
            "agent": "coder",
            "steps": [{"key": "build", "argv": ["make"]}],
            "budgets": {"max_commands": 5, "max_wall_seconds": 60}
        }))
        .expect("valid spec")
    }

    #[test]
    fn defaults_and_validation() {
        let now = Utc::now();
        let spec = spec();
        assert_eq!(spec.steps[0].timeout_seconds, 600);
        assert!(!spec.steps[0].idempotent);
        assert_eq!(spec.max_attempts(), 3);
        assert_eq!(spec.validate("", now), Ok(()));

        let mut dup = spec.clone();
        dup.steps.push(dup.steps[0].clone());
        assert_eq!(
            dup.validate("", now).map_err(|e| e.field),
            Err("steps[1].key".into())
        );

        let mut escape = spec.clone();
        escape.steps[0].cwd = Some("../etc".into());
        assert_eq!(
            escape.validate("runs[2].", now).map_err(|e| e.field),
            Err("runs[2].steps[0].cwd".into())
        );

        let mut crowded = spec.clone();
        crowded.steps[0].env = (0..=MAX_VARIABLES)
            .map(|i| (format!("V{i}"), "x".into()))
            .collect();
        let refused = crowded.validate("", now).expect_err("too many variables");
        assert_eq!(refused.field, "steps[0].env");
        crowded.steps[0].env.pop_first();
        assert_eq!(
            crowded.validate("", now),
            Ok(()),
            "{MAX_VARIABLES} are allowed"
        );

        let mut past = spec;
        past.deadline = Some(now - chrono::Duration::seconds(1));
        assert_eq!(
            past.validate("", now).map_err(|e| e.field),
            Err("deadline".into())
        );
    }

    #[test]
    fn budgets_are_optional_and_a_plan_without_steps_is_refused() {
        let now = Utc::now();
        let bare: RunSpec = serde_json::from_value(serde_json::json!({
            "agent": "coder", "steps": [{"key": "build", "argv": ["make"]}]
        }))
        .expect("a run without budgets");
        assert_eq!(
            bare.budgets,
            Budgets {
                max_commands: 1000,
                max_wall_seconds: 86_400
            }
        );
        assert_eq!(bare.validate("", now), Ok(()));
        let partial: RunSpec = serde_json::from_value(serde_json::json!({
            "agent": "coder", "steps": [{"key": "build", "argv": ["make"]}],
            "budgets": {"max_commands": 7}
        }))
        .expect("one budget given");
        assert_eq!(partial.budgets.max_commands, 7);
        assert_eq!(partial.budgets.max_wall_seconds, 86_400);

        let mut empty = bare;
        empty.steps.clear();
        let refused = empty.validate("runs[1].", now).expect_err("no steps");
        assert_eq!(refused.field, "runs[1].steps");
    }

    #[test]
    fn unknown_fields_and_coerced_values_are_rejected() {
        let unknown = serde_json::json!({
            "agent": "a", "steps": [], "budgets": {"max_commands": 1, "max_wall_seconds": 1}, "extra": 1
        });
        assert!(serde_json::from_value::<RunSpec>(unknown).is_err());
        let coerced = serde_json::json!({
            "agent": "a", "steps": [], "budgets": {"max_commands": "1", "max_wall_seconds": 1}
        });
        assert!(serde_json::from_value::<RunSpec>(coerced).is_err());
    }
}
