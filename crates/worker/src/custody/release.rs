//! Release: a tree goes only when nothing in it is uncaptured, or when its task ended.

use super::{Custody, CustodyError, Subject, Tree};
use crate::workspace;
use cairn_common::hold::{self, HoldTarget};
use cairn_common::lease::Lease;
use cairn_common::lineage;
use cairn_common::workspace as workspace_row;

/// How a job lets go of its tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The lease is lost: nothing is written. A tree with uncaptured work stays (a
    /// capture's hold, if one was written, guards it).
    Fenced,
    /// The task reached a terminal state: its tree goes and its holds end. `retire`
    /// retires its lineage too (the task completed without asking for more).
    Ended { retire: bool },
    /// Someone continues the request (a drain, a pause past its limit, an attempt that
    /// ended): a tree with uncaptured work stays, held, for a successor of the same task.
    HandedOn,
}

impl Custody {
    /// Releases the workspace, while the lease is still ours (except when fenced).
    pub async fn release(&self, lease: &Lease, subject: &Subject, tree: &Tree, how: Release) {
        if how == Release::Fenced {
            if !keeps(tree, how) {
                workspace::remove(&tree.live.workspace).await;
            }
            return;
        }
        let result = async {
            let mut tx = lease.begin_fenced(&self.pool).await?;
            self.release_rows(&mut tx, subject, tree, how).await?;
            tx.commit().await?;
            Ok::<_, CustodyError>(())
        }
        .await;
        match result {
            Ok(()) => self.released(tree, how).await,
            Err(e) => tracing::warn!(error = %e, "workspace release not recorded; the tree stays"),
        }
    }

    /// What a release records, in the caller's fenced transaction: a tree that goes is
    /// marked destroyed (its holds end with its task, and a completed task's lineage
    /// retires); a tree that stays is held. Once that transaction commits,
    /// [`Custody::released`] deals with the files.
    pub async fn release_rows(
        &self,
        conn: &mut sqlx::PgConnection,
        subject: &Subject,
        tree: &Tree,
        how: Release,
    ) -> Result<(), CustodyError> {
        if keeps(tree, how) {
            // A hold guards it (written by a failed capture, moved with an adopted
            // tree, or written now).
            let expires = hold::expiry(
                chrono::Utc::now(),
                subject.deadline,
                self.settings.persistent,
                self.settings.hold_limits,
            );
            let target = HoldTarget {
                workspace_id: tree.live.workspace_id,
                run_id: Some(subject.run_id),
                work_context: Some(subject.work_context),
                agent: &subject.agent,
            };
            hold::hold(&mut *conn, &target, "uncaptured tree", expires).await?;
            workspace_row::stop(&mut *conn, tree.live.workspace_id).await?;
            return Ok(());
        }
        match how {
            Release::Ended { retire } => {
                self.ended_rows(conn, subject, (tree.live.workspace_id, None), retire)
                    .await?
            }
            _ => workspace_row::destroy(&mut *conn, tree.live.workspace_id).await?,
        }
        Ok(())
    }

    /// The rows of a tree whose task ended, in the caller's fenced transaction: the tree
    /// goes (last at `at`, when its final commit is in this transaction), any hold of it
    /// ends with its task, and `retire` retires its lineage (the task completed without
    /// asking for more).
    pub async fn ended_rows(
        &self,
        conn: &mut sqlx::PgConnection,
        subject: &Subject,
        (workspace_id, at): (uuid::Uuid, Option<uuid::Uuid>),
        retire: bool,
    ) -> Result<(), sqlx::Error> {
        workspace_row::destroy_at(&mut *conn, workspace_id, at).await?;
        hold::end_for_workspace(&mut *conn, workspace_id, "task_ended").await?;
        if retire {
            lineage::retire(&mut *conn, subject.work_context, "task_completed").await?;
        }
        Ok(())
    }

    /// Whether the tree's row is destroyed: its release was written (read back after a
    /// lost connection). Unknown counts as not.
    pub async fn is_destroyed(&self, tree: &Tree) -> bool {
        let state: Result<Option<String>, sqlx::Error> =
            sqlx::query_scalar("SELECT state FROM workspaces WHERE id = $1")
                .bind(tree.live.workspace_id)
                .fetch_optional(&self.pool)
                .await;
        matches!(state, Ok(Some(state)) if state == "destroyed")
    }

    /// After [`Custody::release_rows`] committed: a tree that went is removed; one
    /// that stays keeps its files, without the step's home.
    pub async fn released(&self, tree: &Tree, how: Release) {
        if keeps(tree, how) {
            let _ = tokio::fs::remove_dir_all(&tree.live.workspace.home).await;
            tracing::info!(path = %tree.live.workspace.root.display(), "uncaptured tree kept under a hold");
        } else {
            workspace::remove(&tree.live.workspace).await;
        }
    }
}

/// Whether a release keeps the tree: it holds uncaptured work and its task goes on.
fn keeps(tree: &Tree, how: Release) -> bool {
    tree.live.uncaptured && !matches!(how, Release::Ended { .. })
}
