//! The working directory of a request and the git operations on it: cold clones,
//! normalizing a restored baseline to the requested ref, and the clean-tree check a
//! baseline must pass before it is published.

use crate::disk::Disk;
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
    #[error("the tree is not clean: {0}")]
    Dirty(String),
}

/// Paths of one request on this worker, and the room its tree and home each have.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// The tree steps run in.
    pub root: PathBuf,
    /// A private `HOME` outside the tree.
    pub home: PathBuf,
    /// Where the last step may write its final report: in its home, the one private
    /// place beside the tree a sandboxed step can write.
    pub report_file: PathBuf,
    disk: Disk,
    quota_mb: u64,
}

/// The final report's name in the home.
pub const REPORT_FILE: &str = ".cairn-report.json";

impl Workspace {
    /// The tree and home of `request_id` on `disk`, each with room for `quota_mb` MiB.
    pub fn for_request(disk: &Disk, request_id: Uuid, quota_mb: u64) -> Workspace {
        let base = disk.root();
        let name = request_id.simple().to_string();
        let home = base.join(format!("{name}.home"));
        Workspace {
            root: base.join(&name),
            report_file: home.join(REPORT_FILE),
            home,
            disk: disk.clone(),
            quota_mb,
        }
    }

    /// Makes the private paths and an empty tree, removing leftovers of earlier claims.
    pub async fn reset(&self) -> Result<(), WorkspaceError> {
        remove(self).await;
        crate::disk::make(&self.disk, &self.home, self.quota_mb).await?;
        self.empty_tree().await
    }

    /// Makes the tree empty, with its room (what was there is removed).
    pub async fn empty_tree(&self) -> Result<(), WorkspaceError> {
        crate::disk::make(&self.disk, &self.root, self.quota_mb).await?;
        Ok(())
    }

    /// Gives a tree kept from an earlier claim this claim's room.
    pub async fn resize_tree(&self) -> std::io::Result<()> {
        let (disk, root, mb) = (self.disk.clone(), self.root.clone(), self.quota_mb);
        tokio::task::spawn_blocking(move || disk.resize(&root, mb))
            .await
            .map_err(std::io::Error::other)?
    }

    /// The room of the tree and of the home, in MiB.
    pub fn quota_mb(&self) -> u64 {
        self.quota_mb
    }
}

const GIT_TIMEOUT: Duration = Duration::from_secs(600);

async fn git_output(
    step: &'static str,
    args: &[&str],
    cwd: Option<&Path>,
) -> Result<String, WorkspaceError> {
    let mut command = Command::new("git");
    command
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .kill_on_drop(true);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let output = tokio::time::timeout(GIT_TIMEOUT, command.output())
        .await
        .map_err(|_| WorkspaceError::Timeout(step))??;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(WorkspaceError::Git(
            step,
            String::from_utf8_lossy(&output.stderr).trim().to_string(),
        ))
    }
}

async fn git(step: &'static str, args: &[&str], cwd: Option<&Path>) -> Result<(), WorkspaceError> {
    git_output(step, args, cwd).await.map(|_| ())
}

/// A cold start: a fresh clone at the ref, or an empty scratch directory.
pub async fn cold(
    workspace: &Workspace,
    repository: Option<&str>,
    git_ref: Option<&str>,
) -> Result<(), WorkspaceError> {
    workspace.empty_tree().await?;
    match repository {
        None => {}
        Some(repository) => {
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
    Ok(())
}

/// After a baseline restore: the baseline's commit may be stale, so fetch the ref and
/// check it out, drop local branches and untracked files, keep ignored caches.
pub async fn normalize(root: &Path, git_ref: Option<&str>) -> Result<(), WorkspaceError> {
    let wanted = git_ref.unwrap_or("HEAD");
    git(
        "fetch",
        &["fetch", "--quiet", "--force", "origin", wanted],
        Some(root),
    )
    .await?;
    git(
        "checkout",
        &["checkout", "--quiet", "--force", "--detach", "FETCH_HEAD"],
        Some(root),
    )
    .await?;
    // -d without -x: untracked files go, ignored caches stay.
    git("clean", &["clean", "--quiet", "-f", "-d"], Some(root)).await?;
    let branches = git_output(
        "for-each-ref",
        &["for-each-ref", "--format=%(refname:short)", "refs/heads"],
        Some(root),
    )
    .await?;
    for branch in branches.lines().filter(|b| !b.is_empty()) {
        git("branch", &["branch", "--quiet", "-D", branch], Some(root)).await?;
    }
    Ok(())
}

/// Creates the task branch the steps work on.
pub async fn task_branch(root: &Path, work_context: Uuid) -> Result<(), WorkspaceError> {
    let name = format!("cairn/{}", work_context.simple());
    git(
        "switch",
        &["switch", "--quiet", "--force-create", &name],
        Some(root),
    )
    .await
}

/// A baseline may be published only from a validated clean tree: no tracked or staged
/// changes, no non-ignored untracked files, no merge, rebase, cherry-pick or bisect.
pub async fn validate_clean(root: &Path) -> Result<(), WorkspaceError> {
    let git_dir = root.join(".git");
    for marker in [
        "MERGE_HEAD",
        "rebase-merge",
        "rebase-apply",
        "CHERRY_PICK_HEAD",
        "REVERT_HEAD",
        "BISECT_LOG",
    ] {
        if git_dir.join(marker).exists() {
            return Err(WorkspaceError::Dirty(format!(
                "a git operation is in progress ({marker})"
            )));
        }
    }
    let status = git_output(
        "status",
        &["status", "--porcelain=v1", "--untracked-files=normal"],
        Some(root),
    )
    .await?;
    if !status.trim().is_empty() {
        let first = status.lines().next().unwrap_or_default().to_string();
        return Err(WorkspaceError::Dirty(format!(
            "changes or untracked files ({first})"
        )));
    }
    Ok(())
}

/// The commit checked out, for the resume context.
pub async fn head_commit(root: &Path) -> Option<String> {
    git_output("rev-parse", &["rev-parse", "HEAD"], Some(root))
        .await
        .ok()
        .map(|s| s.trim().to_string())
}

/// Removes a workspace and its private files.
pub async fn remove(workspace: &Workspace) {
    let _ = tokio::fs::remove_dir_all(&workspace.root).await;
    let _ = tokio::fs::remove_dir_all(&workspace.home).await;
    let _ = tokio::fs::remove_file(&workspace.report_file).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn repo() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cairn-ws-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        for args in [
            vec!["init", "--quiet", "-b", "main"],
            vec!["config", "user.email", "t@example.com"],
            vec!["config", "user.name", "t"],
        ] {
            git("setup", &args, Some(&dir)).await.expect("git");
        }
        std::fs::write(dir.join("a.txt"), "a").expect("write");
        std::fs::write(dir.join(".gitignore"), "cache/\n").expect("write");
        git("add", &["add", "."], Some(&dir)).await.expect("add");
        git("commit", &["commit", "--quiet", "-m", "init"], Some(&dir))
            .await
            .expect("commit");
        dir
    }

    #[tokio::test]
    async fn a_dirty_tree_cannot_become_a_baseline() {
        let dir = repo().await;
        validate_clean(&dir).await.expect("a fresh commit is clean");
        std::fs::create_dir_all(dir.join("cache")).expect("cache");
        std::fs::write(dir.join("cache/x"), "ignored").expect("write");
        validate_clean(&dir)
            .await
            .expect("ignored files are allowed");
        std::fs::write(dir.join("untracked.txt"), "u").expect("write");
        assert!(matches!(
            validate_clean(&dir).await,
            Err(WorkspaceError::Dirty(_))
        ));
        std::fs::remove_file(dir.join("untracked.txt")).expect("rm");
        std::fs::write(dir.join("a.txt"), "changed").expect("write");
        assert!(matches!(
            validate_clean(&dir).await,
            Err(WorkspaceError::Dirty(_))
        ));
        git("checkout", &["checkout", "--", "a.txt"], Some(&dir))
            .await
            .expect("restore");
        std::fs::write(dir.join(".git/MERGE_HEAD"), "0000").expect("merge marker");
        assert!(matches!(
            validate_clean(&dir).await,
            Err(WorkspaceError::Dirty(_))
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
