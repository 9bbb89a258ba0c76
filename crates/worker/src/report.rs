//! The typed final report a run's last step may write to `$CAIRN_REPORT_FILE`.

use cairn_common::verification::VerificationRequest;
use serde::Deserialize;

pub use cairn_common::report::VERIFICATION;

/// A final report as the worker retains it with the last step's receipt.
pub struct RetainedReport {
    pub report: FinalReport,
    pub body: serde_json::Value,
    /// The source a verification it asks for will verify.
    pub source_digest: Option<String>,
}

impl RetainedReport {
    /// What the journal's report record takes.
    pub fn retained(&self) -> cairn_common::report::RetainedReport<'_> {
        cairn_common::report::RetainedReport {
            outcome: self.report.outcome.as_str(),
            followup_kind: self.report.followup_kind.as_deref(),
            body: &self.body,
            source_digest: self.source_digest.as_deref(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct FinalReport {
    pub outcome: Outcome,
    #[serde(default)]
    pub followup_kind: Option<String>,
    /// The frozen checks, when `followup_kind` is `verification`.
    #[serde(default)]
    pub verification: Option<VerificationRequest>,
}

impl FinalReport {
    pub fn asks_for_verification(&self) -> bool {
        self.followup_kind.as_deref() == Some(VERIFICATION)
    }

    fn validate(&self) -> Result<(), String> {
        match (&self.verification, self.asks_for_verification()) {
            (Some(request), true) => request
                .validate("verification.")
                .map_err(|e| format!("invalid final report: {}: {}", e.field, e.message)),
            (None, true) => Err(
                "invalid final report: followup_kind verification needs verification.commands"
                    .into(),
            ),
            (Some(_), false) => Err(
                "invalid final report: verification is given but followup_kind is not verification"
                    .into(),
            ),
            (None, false) => Ok(()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Complete,
    Blocked,
    Clarification,
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::Blocked => "blocked",
            Outcome::Clarification => "clarification",
            Outcome::Failed => "failed",
        }
    }
}

/// The largest final report read.
const MAX_REPORT_BYTES: u64 = 1024 * 1024;

/// Reads the report file if the step wrote one: `Ok(None)` when absent, an error
/// message when it is not a valid report.
pub async fn read(
    path: &std::path::Path,
) -> Result<Option<(FinalReport, serde_json::Value)>, String> {
    // A step wrote this path: it may be a link (to the worker's secrets, or to
    // /dev/zero) or a FIFO nobody writes to. Only a regular file is read, and only up to
    // the limit.
    let path = path.to_path_buf();
    let read = tokio::task::spawn_blocking(move || -> std::io::Result<Option<Vec<u8>>> {
        use std::io::Read;
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let Some(file) = cairn_snapshot::regular::open_regular(&path)? else {
            return Err(std::io::Error::other("it is not a regular file"));
        };
        let mut bytes = Vec::new();
        file.take(MAX_REPORT_BYTES + 1).read_to_end(&mut bytes)?;
        Ok(Some(bytes))
    })
    .await
    .map_err(|e| format!("cannot read the final report: {e}"))?;
    let bytes = match read {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(None),
        Err(e) => return Err(format!("cannot read the final report: {e}")),
    };
    if bytes.len() as u64 > MAX_REPORT_BYTES {
        return Err("the final report is larger than 1 MiB".into());
    }
    let body: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("the final report is not JSON: {e}"))?;
    let report: FinalReport =
        serde_json::from_value(body.clone()).map_err(|e| format!("invalid final report: {e}"))?;
    report.validate()?;
    Ok(Some((report, body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_regular_report_file_is_read() {
        let dir = std::env::temp_dir().join(format!("cairn-report-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        assert!(matches!(read(&dir.join("absent")).await, Ok(None)));
        std::fs::write(dir.join("secret"), "{}").expect("secret");
        std::os::unix::fs::symlink(dir.join("secret"), dir.join("link")).expect("link");
        assert!(
            read(&dir.join("link")).await.is_err(),
            "a link is not followed"
        );
        nix::unistd::mkfifo(&dir.join("pipe"), nix::sys::stat::Mode::S_IRWXU).expect("fifo");
        let pipe = dir.join("pipe");
        let fifo = tokio::time::timeout(std::time::Duration::from_secs(5), read(&pipe));
        assert!(fifo.await.expect("a FIFO never blocks").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
