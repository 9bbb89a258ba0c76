//! A check's private scratch directory and its whole environment: what planning (reuse)
//! and running (check) both derive from the job.

use crate::job::handle::Job;
use cairn_common::verification::CheckCommand;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where a request's checks get their private scratch directories (outside the tree).
pub fn scratch_root(workspaces_dir: &Path, job: &Job) -> PathBuf {
    // Per epoch: a fenced-out owner on the same host never shares or removes it.
    workspaces_dir.join(format!(
        "{}.scratch-{}",
        job.request_id().simple(),
        job.lease().epoch
    ))
}

/// A check's whole environment: the runner's variables, then the check's own.
pub fn check_env(check: &CheckCommand, scratch: &Path) -> BTreeMap<String, String> {
    let scratch = scratch.to_string_lossy().into_owned();
    let mut env = BTreeMap::from([
        ("HOME".to_string(), scratch.clone()),
        ("TMPDIR".to_string(), scratch),
        (
            "PATH".to_string(),
            crate::isolation::DEFAULT_PATH.to_string(),
        ),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ]);
    env.extend(check.env.clone());
    env
}
