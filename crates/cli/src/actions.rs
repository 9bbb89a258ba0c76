//! The local record of continuation actions: the action id and the exact body are saved
//! *before* the single POST, so an uncertain response never leads to a new id or a
//! changed body, only to reading the status.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Debug, Serialize, Deserialize)]
pub struct SavedAction {
    pub kind: String,
    pub run_id: String,
    pub request_id: String,
    pub action_id: String,
    pub body: Value,
    pub saved_at: String,
    /// Last known outcome: `unsubmitted`, `saved` (201), `rejected` or `uncertain`.
    pub outcome: String,
}

pub fn state_dir(configured: Option<&Path>) -> PathBuf {
    if let Some(dir) = configured {
        return dir.to_path_buf();
    }
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("cairn").join("actions")
}

pub fn path(dir: &Path, action_id: &str) -> PathBuf {
    dir.join(format!("{action_id}.json"))
}

pub fn load(dir: &Path, action_id: &str) -> anyhow::Result<Option<SavedAction>> {
    let path = path(dir, action_id);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Writes the record durably (write, fsync, rename) before anything is sent.
pub fn save(dir: &Path, action: &SavedAction) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = path(dir, &action.action_id);
    let tmp = path.with_extension("json.tmp");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&serde_json::to_vec_pretty(action)?)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}
