//! The local record of continuation actions: the action id and the exact body are saved
//! *before* the single POST, so an uncertain response never leads to a new id or a
//! changed body, only to reading the status.

use crate::client::{exit, Answer, CallError, Client};
use reqwest::Method;
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
    /// Last known outcome: `unsubmitted` (also when the scheduler could not be reached),
    /// `saved` (201), `rejected` or `uncertain`.
    pub outcome: String,
}

impl SavedAction {
    /// A record made now, not yet submitted.
    pub fn unsubmitted(
        kind: &str,
        run_id: &str,
        request_id: &str,
        action_id: &str,
        body: Value,
    ) -> Self {
        SavedAction {
            kind: kind.into(),
            run_id: run_id.into(),
            request_id: request_id.into(),
            action_id: action_id.into(),
            body,
            saved_at: chrono::Utc::now().to_rfc3339(),
            outcome: "unsubmitted".into(),
        }
    }
}

/// Prints a submitted decision: `what`, its status and record, its `fields`, and how to
/// follow it.
pub fn print_submitted(
    answer: &Answer,
    saved: &Path,
    what: &str,
    fields: &[&str],
    status_hint: &str,
) {
    println!(
        "{what} ({}); record: {}",
        crate::output::text(&answer.body["status"]),
        saved.display()
    );
    crate::output::fields(&answer.body, fields);
    println!("follow it with: {status_hint}");
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

/// Submits a caller-owned decision once: the record (id and exact body) is saved before
/// the single POST to `path`, and the outcome after it. A record saved earlier with other
/// input is a conflict; an uncertain outcome says to read the status (`status_hint`),
/// never to submit again. Returns the answer and where the record is.
pub async fn submit_once(
    client: &Client,
    dir: &Path,
    record: SavedAction,
    path: &str,
    status_hint: &str,
) -> Result<(Answer, PathBuf), CallError> {
    let id = record.action_id.clone();
    let record = match load(dir, &id).map_err(|e| CallError::new(exit::ERROR, e.to_string()))? {
        Some(saved)
            if saved.body != record.body
                || saved.run_id != record.run_id
                || saved.request_id != record.request_id
                || saved.kind != record.kind =>
        {
            return Err(CallError::new(
                exit::CONFLICT,
                format!("{id} was saved earlier with other input; keep that decision and read it with: {status_hint}"),
            ));
        }
        Some(saved) => saved,
        None => record,
    };
    let saved_path = save(dir, &record).map_err(|e| {
        CallError::new(
            exit::ERROR,
            format!("could not save {id} locally, so nothing was sent: {e}"),
        )
    })?;
    let result = client
        .call(Method::POST, path, Some(&record.body), &[])
        .await;
    let outcome = match &result {
        Ok(_) => "saved",
        Err(e) if e.code == exit::UNCERTAIN => "uncertain",
        // Refused before anything was sent: submitting it again is safe.
        Err(e) if e.transient => "unsubmitted",
        Err(_) => "rejected",
    };
    let _ = save(
        dir,
        &SavedAction {
            outcome: outcome.into(),
            ..record
        },
    );
    match result {
        Ok(answer) => Ok((answer, saved_path)),
        Err(e) if e.code == exit::UNCERTAIN => Err(CallError::new(
            exit::UNCERTAIN,
            format!("{e}\nthe outcome is unknown; do not submit again under another id. Read it with: {status_hint}"),
        )),
        Err(e) => Err(e),
    }
}
