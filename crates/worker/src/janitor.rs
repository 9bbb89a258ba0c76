//! Removes the trees this worker left on its host once nothing guards them: a tree kept
//! under a hold whose hold ended (its task ended, or a successor took its work over) or
//! expired, and a tree a previous run of this worker (same id) left behind when it died.
//! Holds are what keep a tree; the reaper ends expired holds, and this removes what they
//! kept. A request a job of this process is running is never touched.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The requests this process runs jobs for: their trees are in use.
#[derive(Debug, Default)]
pub struct ActiveRequests(Mutex<HashSet<Uuid>>);

impl ActiveRequests {
    pub async fn enter(&self, request_id: Uuid) {
        self.0.lock().await.insert(request_id);
    }

    pub async fn leave(&self, request_id: Uuid) {
        self.0.lock().await.remove(&request_id);
    }
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JanitorReport {
    pub removed: u64,
    /// Rows whose path is not a tree of this worker's directory: left alone.
    pub skipped: u64,
}

/// Where and whose trees to look after.
#[derive(Debug, Clone)]
pub struct Janitor {
    pub worker_id: String,
    pub workspaces_dir: PathBuf,
    /// How long after its hold expired (or its row last changed) a tree is left alone,
    /// so an adoption that saw the hold alive finishes first.
    pub grace: Duration,
}

impl Janitor {
    /// One pass over this host's unguarded trees.
    pub async fn sweep_once(
        &self,
        pool: &sqlx::PgPool,
        active: &ActiveRequests,
    ) -> Result<JanitorReport, sqlx::Error> {
        let grace = self.grace.as_secs_f64();
        let rows: Vec<(Uuid, Option<String>)> = sqlx::query_as(
            "SELECT w.id, w.path FROM workspaces w
              WHERE w.host = $1 AND w.state IN ('stopped', 'running')
                AND w.updated_at < now() - make_interval(secs => $2)
                AND NOT EXISTS (SELECT 1 FROM holds h
                                 WHERE h.workspace_id = w.id AND h.ended_at IS NULL
                                   AND (h.capture_in_progress OR h.expires_at > now() - make_interval(secs => $2)))
              ORDER BY w.updated_at
              LIMIT 500",
        )
        .bind(&self.worker_id)
        .bind(grace)
        .fetch_all(pool)
        .await?;
        let mut report = JanitorReport::default();
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
                if running.contains(&request_id) {
                    continue;
                }
                let mut tx = pool.begin().await?;
                let taken = sqlx::query(
                    "UPDATE workspaces SET state = 'destroyed', destroyed_at = now(), updated_at = now()
                      WHERE id = $1 AND state IN ('stopped', 'running')",
                )
                .bind(workspace_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if taken == 0 {
                    continue;
                }
                cairn_common::hold::end_for_workspace(&mut tx, workspace_id, "tree_removed")
                    .await?;
                let trash = path.with_extension(format!("removed-{}", Uuid::new_v4().simple()));
                let moved = std::fs::rename(&path, &trash).is_ok();
                tx.commit().await?;
                drop(running);
                moved.then_some(trash)
            };
            if let Some(trash) = trash {
                let _ = tokio::fs::remove_dir_all(&trash).await;
            }
            let _ = tokio::fs::remove_dir_all(path.with_extension("home")).await;
            report.removed += 1;
            tracing::info!(%workspace_id, path = %path.display(), "removed a tree no hold guards");
        }
        Ok(report)
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
