//! The working directory of a request: a fresh clone of its repository at its ref, or a
//! scratch directory when it has none. Capture and restore of workspaces are not built
//! yet, so each claim starts from a fresh tree.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::Command;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("workspace I/O failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("git {0} failed: {1}")]
    Git(&'static str, String),
    #[error("git {0} timed out")]
    Timeout(&'static str),
}

/// Paths of one request on this worker.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// The tree steps run in.
    pub root: PathBuf,
    /// A private `HOME` outside the tree.
    pub home: PathBuf,
    /// Where the last step may write its final report.
    pub report_file: PathBuf,
}

const GIT_TIMEOUT: Duration = Duration::from_secs(600);

async fn git(step: &'static str, args: &[&str], cwd: Option<&Path>) -> Result<(), WorkspaceError> {
    let mut command = Command::new("git");
    command
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .kill_on_drop(true);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let output = tokio::time::timeout(GIT_TIMEOUT, command.output())
        .await
        .map_err(|_| WorkspaceError::Timeout(step))??;
    if output.status.success() {
        Ok(())
    } else {
        Err(WorkspaceError::Git(
            step,
            String::from_utf8_lossy(&output.stderr).trim().to_string(),
        ))
    }
}

/// Creates a fresh workspace for a request.
pub async fn prepare(
    base: &Path,
    request_id: Uuid,
    repository: Option<&str>,
    git_ref: Option<&str>,
) -> Result<Workspace, WorkspaceError> {
    let name = request_id.simple().to_string();
    let workspace = Workspace {
        root: base.join(&name),
        home: base.join(format!("{name}.home")),
        report_file: base.join(format!("{name}.report.json")),
    };
    remove(&workspace).await;
    tokio::fs::create_dir_all(&workspace.home).await?;
    match repository {
        None => tokio::fs::create_dir_all(&workspace.root).await?,
        Some(repository) => {
            tokio::fs::create_dir_all(base).await?;
            let root = workspace.root.to_string_lossy().into_owned();
            git(
                "clone",
                &["clone", "--quiet", "--no-checkout", "--", repository, &root],
                None,
            )
            .await?;
            git(
                "checkout",
                &["checkout", "--quiet", "--detach", git_ref.unwrap_or("HEAD")],
                Some(&workspace.root),
            )
            .await?;
        }
    }
    Ok(workspace)
}

/// Removes a workspace and its private files.
pub async fn remove(workspace: &Workspace) {
    let _ = tokio::fs::remove_dir_all(&workspace.root).await;
    let _ = tokio::fs::remove_dir_all(&workspace.home).await;
    let _ = tokio::fs::remove_file(&workspace.report_file).await;
}
