//! Removes the trees of this worker's directory once nothing guards them: a tree kept
//! under a hold whose hold ended (its task ended, or a successor took its work over) or
//! expired, and a tree a previous process on this directory left behind when it died.
//! Trees are keyed by the directory's identity and their path, never by host or worker
//! id (the directory is locked by one live worker, see [`crate::directory`]). Holds are
//! what keep a tree; the reaper ends expired holds, and this removes what they kept. A
//! request a job of this process is running is never touched.

use cairn_common::workspace;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The requests this process runs jobs for, with how many: their trees are in use. (A
/// fenced job may still be releasing when a new claim of its request starts.)
#[derive(Debug, Default)]
pub struct ActiveRequests(Mutex<HashMap<Uuid, usize>>);

impl ActiveRequests {
    pub async fn enter(&self, request_id: Uuid) {
        *self.0.lock().await.entry(request_id).or_default() += 1;
    }

    pub async fn leave(&self, request_id: Uuid) {
        let mut running = self.0.lock().await;
        if let Some(count) = running.get_mut(&request_id) {
            *count -= 1;
            if *count == 0 {
                running.remove(&request_id);
            }
        }
    }
}

/// Marks a tree (or its home) moved aside for removal.
const TRASH: &str = "removed-";

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JanitorReport {
    pub removed: u64,
    /// Rows whose path is not a tree of this worker's directory: left alone.
    pub skipped: u64,
}

/// Which directory's trees to look after.
#[derive(Debug, Clone)]
pub struct Janitor {
    /// The identity of the directory (see [`crate::directory::Directory`]).
    pub directory_id: Uuid,
    pub workspaces_dir: PathBuf,
    /// How long after its hold expired (or its row last changed) a tree is left alone,
    /// so an adoption that saw the hold alive finishes first.
    pub grace: Duration,
}

impl Janitor {
    /// One pass over this directory's unguarded trees.
    pub async fn sweep_once(
        &self,
        pool: &sqlx::PgPool,
        active: &ActiveRequests,
    ) -> Result<JanitorReport, sqlx::Error> {
        let grace = self.grace.as_secs_f64();
        // Only rows of trees directly in this worker's directory, so rows it would skip
        // never crowd out the rest.
        let prefix = format!("{}/", self.workspaces_dir.display());
        let rows: Vec<(Uuid, Option<String>)> = sqlx::query_as(&format!(
            "SELECT w.id, w.path FROM workspaces w
              WHERE w.directory_id = $1 AND w.state IN ('stopped', 'running', 'paused')
                AND starts_with(w.path, $3) AND {}
              ORDER BY w.updated_at
              LIMIT 500",
            workspace::UNGUARDED
        ))
        .bind(self.directory_id)
        .bind(grace)
        .bind(&prefix)
        .fetch_all(pool)
        .await?;
        let mut report = JanitorReport::default();
        self.empty_trash().await;
        for (workspace_id, path) in rows {
            let Some((path, request_id)) = path.as_deref().and_then(|p| self.tree_of(p)) else {
                report.skipped += 1;
                continue;
            };
            // Decided and moved aside under the lock a job takes to start: a job of
            // this request either started before (and the tree is skipped) or starts
            // after the tree is gone.
            let trash = {
                let running = active.0.lock().await;
                if running.contains_key(&request_id) {
                    continue;
                }
                let mut tx = pool.begin().await?;
                // Taken only if it is still unguarded now, not just when it was listed.
                if !workspace::take_unguarded(&mut tx, workspace_id, grace).await? {
                    continue;
                }
                cairn_common::hold::end_for_workspace(&mut tx, workspace_id, "tree_removed")
                    .await?;
                let suffix = format!("{TRASH}{}", Uuid::new_v4().simple());
                let trash = path.with_extension(&suffix);
                let moved = std::fs::rename(&path, &trash).is_ok();
                if moved {
                    let home = path.with_extension("home");
                    let _ = std::fs::rename(&home, home.with_extension(format!("home{suffix}")));
                }
                tx.commit().await?;
                drop(running);
                moved
            };
            if trash {
                self.empty_trash().await;
            }
            report.removed += 1;
            tracing::info!(workspace_id = %workspace_id.simple(), path = %path.display(), "removed a tree no hold guards");
        }
        Ok(report)
    }

    /// Removes what was moved aside (also what an earlier pass could not remove).
    async fn empty_trash(&self) {
        let Ok(mut entries) = tokio::fs::read_dir(&self.workspaces_dir).await else {
            return;
        };
        while let Ok(Some(entry)) = entries.next_entry().await {
            if entry.file_name().to_string_lossy().contains(TRASH) {
                let _ = tokio::fs::remove_dir_all(entry.path()).await;
            }
        }
    }

    /// The tree at `path` if it is one of this worker's request trees (a request id
    /// directly under the workspaces directory); anything else is never removed.
    fn tree_of(&self, path: &str) -> Option<(PathBuf, Uuid)> {
        let path = Path::new(path);
        if path.parent() != Some(self.workspaces_dir.as_path()) {
            return None;
        }
        let name = path.file_name()?.to_str()?;
        let request_id = name.parse::<cairn_common::ids::Id>().ok()?.uuid();
        Some((path.to_path_buf(), request_id))
    }

    /// Sweeps every `interval` until `shutdown`.
    pub async fn run(
        self,
        pool: sqlx::PgPool,
        active: std::sync::Arc<ActiveRequests>,
        interval: Duration,
        shutdown: CancellationToken,
    ) {
        loop {
            match self.sweep_once(&pool, &active).await {
                Ok(report) if report.removed > 0 => {
                    tracing::info!(removed = report.removed, "workspace janitor sweep")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "workspace janitor sweep failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}
