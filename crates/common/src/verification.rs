//! Verification handoffs: the frozen list of checks a run's final report asks for, their
//! purposes, and the digests that bind a check for reuse.
//!
//! A check's *command digest* covers what it runs (argv, working directory, purpose); its
//! environment is bound separately by the environment digest of the scope it ran in, so a
//! changed variable makes a check run fresh without changing which check it is.

use crate::digest;
use crate::run::{check_command, FieldError};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Most checks one handoff may freeze.
pub const MAX_CHECKS: usize = 64;

/// Variables the runner sets for every check; a check cannot set them itself.
pub const RUNNER_VARIABLES: [&str; 3] = ["HOME", "TMPDIR", "PATH"];

/// What a check establishes, which decides whether its result may ever be reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// Compiles the retained source.
    SourceBuild,
    /// Runs tests of the retained source.
    Test,
    /// Talks to a database whose state changes: always fresh.
    DatabaseIntegration,
    /// Depends on a deployment or an outside service: always fresh.
    ExternalService,
    /// Inspects generated output directories: always fresh.
    FrontendBuild,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::SourceBuild => "source_build",
            Purpose::Test => "test",
            Purpose::DatabaseIntegration => "database_integration",
            Purpose::ExternalService => "external_service",
            Purpose::FrontendBuild => "frontend_build",
        }
    }

    /// Whether a passed result of this kind may ever be reused. Checks that depend on
    /// changing services or inspect generated output never are, whatever is declared.
    pub fn reuse_eligible(self) -> bool {
        matches!(self, Purpose::SourceBuild | Purpose::Test)
    }
}

/// One frozen check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckCommand {
    /// Program and arguments; run directly, not through a shell.
    pub argv: Vec<String>,
    pub purpose: Purpose,
    /// Working directory relative to the workspace root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Variables of the check (at most 1,000), on top of the runner's (`HOME`, `TMPDIR`,
    /// `PATH`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(schema_with = crate::run::variables_schema)]
    pub env: BTreeMap<String, String>,
    /// Time limit, 1..=86400 seconds.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u32,
}

fn default_timeout() -> u32 {
    600
}

/// The `verification` member of a final report whose `followup_kind` is `verification`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VerificationRequest {
    pub commands: Vec<CheckCommand>,
}

impl VerificationRequest {
    /// Checks what serde cannot; `prefix` names the field path.
    pub fn validate(&self, prefix: &str) -> Result<(), FieldError> {
        if self.commands.is_empty() || self.commands.len() > MAX_CHECKS {
            return Err(FieldError::new(
                format!("{prefix}commands"),
                format!("1 to {MAX_CHECKS} checks"),
            ));
        }
        for (i, check) in self.commands.iter().enumerate() {
            let at = |name: &str| format!("{prefix}commands[{i}].{name}");
            check_command(
                &check.argv,
                &check.env,
                check.cwd.as_deref(),
                check.timeout_seconds,
                at,
            )?;
            if let Some(name) = check
                .env
                .keys()
                .find(|name| RUNNER_VARIABLES.contains(&name.as_str()))
            {
                return Err(FieldError::new(
                    at("env"),
                    format!("{name} is set by the runner"),
                ));
            }
        }
        Ok(())
    }
}

/// Which check this is: everything of it that can change its outcome besides its scope
/// (its variables are bound by the environment digest): argv, working directory,
/// purpose and time limit. A check that passed within 30 s says nothing of 1 s.
pub fn command_digest(check: &CheckCommand) -> String {
    digest::of_json(&json!({
        "argv": check.argv,
        "cwd": check.cwd,
        "purpose": check.purpose,
        "timeout_seconds": check.timeout_seconds,
    }))
}

/// The whole frozen list, in order, with every field.
pub fn commands_digest(checks: &[CheckCommand]) -> String {
    digest::of(&checks)
}

/// The journal key of check `index` (1-based) of an adoption; step keys cannot contain
/// `:`, so it never collides with a plan's step.
pub fn step_key(adoption_id: uuid::Uuid, index: usize) -> String {
    format!("verify:{}:{index}", adoption_id.simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(argv: &[&str], purpose: Purpose) -> CheckCommand {
        CheckCommand {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            purpose,
            cwd: None,
            env: BTreeMap::new(),
            timeout_seconds: 600,
        }
    }

    #[test]
    fn the_command_digest_ignores_the_environment_but_the_list_digest_does_not() {
        let a = check(&["make"], Purpose::SourceBuild);
        let mut b = a.clone();
        b.env.insert("MODE".into(), "x".into());
        assert_eq!(command_digest(&a), command_digest(&b));
        assert_ne!(
            commands_digest(std::slice::from_ref(&a)),
            commands_digest(&[b])
        );
        let mut c = a.clone();
        c.purpose = Purpose::Test;
        assert_ne!(command_digest(&a), command_digest(&c));
    }

    #[test]
    fn only_source_checks_may_be_reused() {
        assert!(Purpose::SourceBuild.reuse_eligible());
        assert!(Purpose::Test.reuse_eligible());
        assert!(!Purpose::DatabaseIntegration.reuse_eligible());
        assert!(!Purpose::ExternalService.reuse_eligible());
        assert!(!Purpose::FrontendBuild.reuse_eligible());
    }

    #[test]
    fn validation_names_the_field() {
        let ok = VerificationRequest {
            commands: vec![check(&["make"], Purpose::SourceBuild)],
        };
        assert_eq!(ok.validate("verification."), Ok(()));
        let mut home = ok.clone();
        home.commands[0].env.insert("HOME".into(), "/root".into());
        assert_eq!(
            home.validate("verification.").map_err(|e| e.field),
            Err("verification.commands[0].env".into())
        );
        let empty = VerificationRequest { commands: vec![] };
        assert!(empty.validate("").is_err());
        let mut escape = ok;
        escape.commands[0].cwd = Some("../x".into());
        assert!(escape.validate("").is_err());
        let coerced = serde_json::json!({"commands": [{"argv": ["make"], "purpose": "source_build", "timeout_seconds": "5"}]});
        assert!(serde_json::from_value::<VerificationRequest>(coerced).is_err());
    }
}
