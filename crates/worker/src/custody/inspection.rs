//! A failed step's tree, kept for an operator to look at: captured as an `inspection`
//! snapshot, never appended to the lineage (so no continuation adopts it), retired as it
//! is made (so the reclaim rule deletes its bytes 7 days later), and named in the
//! journal beside the step's receipt. A sandbox can start from it.

use super::commit::{Capture, Seal, TreeAfter};
use super::{Checkpoint, Custody, CustodyError, Subject, Tree};
use cairn_common::journal;
use cairn_common::lease::Lease;
use cairn_common::lineage::{retention, CapturedBy};
use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

/// What an inspection snapshot is sealed with: its retirement and its journal entry.
struct InspectionSeal<'a> {
    step_key: &'a str,
}

impl Seal for InspectionSeal<'_> {
    type Error = CustodyError;

    fn stands_on_unchanged(&self) -> bool {
        false
    }

    async fn seal(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        snapshot: Uuid,
    ) -> Result<TreeAfter, CustodyError> {
        retention::kept_for_inspection(&mut *conn, snapshot).await?;
        journal::entry(
            conn,
            lease,
            "inspection_snapshot",
            &json!({"step_key": self.step_key, "snapshot_id": snapshot.simple().to_string()}),
        )
        .await?;
        Ok(TreeAfter::Stays)
    }
}

impl Custody {
    /// Keeps the tree a failed step left, for inspection; its snapshot, or why not.
    pub async fn keep_for_inspection(
        &self,
        lease: &Lease,
        subject: &Subject,
        tree: &mut Tree,
        step_key: &str,
    ) -> Result<Checkpoint, CustodyError> {
        let capture = Capture {
            kind: "inspection",
            agent: &subject.agent,
            repository: subject.repository.as_deref(),
            git_ref: subject.git_ref.as_deref(),
            work_context: Some(subject.work_context),
            by: CapturedBy::Request(lease.request_id),
            name: None,
            hold: None,
            appends: false,
        };
        // Read only what changed since the tree's position, but never stand on it.
        let at = tree.live.at(false);
        self.commit(lease, &capture, at, &InspectionSeal { step_key })
            .await
    }
}
