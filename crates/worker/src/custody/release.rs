//! Release: a tree goes only when nothing in it is uncaptured, or when its task ended.

use super::{Custody, CustodyError, Subject, Tree};
use crate::workspace;
use cairn_common::hold::{self, HoldTarget};
use cairn_common::lease::Lease;
use cairn_common::lineage;

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
        let keep = tree.uncaptured && !matches!(how, Release::Ended { .. });
        if how == Release::Fenced {
            if !keep {
                workspace::remove(&tree.workspace).await;
            }
            return;
        }
        let result = async {
            let mut tx = lease.begin_fenced(&self.pool).await?;
            if keep {
                // A hold guards it (written by a failed capture, moved with an adopted
                // tree, or written now).
                let expires = hold::expiry(
                    chrono::Utc::now(),
                    subject.deadline,
                    self.settings.persistent,
                    self.settings.hold_limits,
                );
                let target = HoldTarget {
                    workspace_id: tree.workspace_id,
                    run_id: Some(subject.run_id),
                    work_context: Some(subject.work_context),
                    agent: &subject.agent,
                };
                hold::hold(&mut tx, &target, "uncaptured tree", expires).await?;
                sqlx::query(
                    "UPDATE workspaces SET state = 'stopped', updated_at = now() WHERE id = $1",
                )
                .bind(tree.workspace_id)
                .execute(&mut *tx)
                .await?;
            } else {
                super::acquire::destroy_row(&mut tx, tree.workspace_id).await?;
                if let Release::Ended { retire } = how {
                    // Any hold of a terminal task ends with it, in the same transaction.
                    hold::end_for_workspace(&mut tx, tree.workspace_id, "task_ended").await?;
                    if retire {
                        lineage::retire(&mut tx, subject.work_context, "task_completed").await?;
                    }
                }
            }
            tx.commit().await?;
            Ok::<_, CustodyError>(())
        }
        .await;
        match result {
            Ok(()) if !keep => workspace::remove(&tree.workspace).await,
            Ok(()) => {
                let _ = tokio::fs::remove_dir_all(&tree.workspace.home).await;
                tracing::info!(path = %tree.workspace.root.display(), "uncaptured tree kept under a hold");
            }
            Err(e) => tracing::warn!(error = %e, "workspace release not recorded; the tree stays"),
        }
    }
}
