//! Acquisition: the tiers in order, each yielding a tree at a known snapshot (or none).

use super::commit::{Capture, NoSeal, TreeAt};
use super::LiveTree;
use super::{Checkpoint, Custody, CustodyError, Subject, Tier, Tree};
use crate::fault;
use crate::workspace::{self, Workspace};
use cairn_common::hold;
use cairn_common::lease::Lease;
use cairn_common::lineage::{self, CapturedBy, HeldTree, RestoreOutcome, SnapshotStatus};
use cairn_common::request;
use cairn_common::retry::{self, Delays};
use cairn_common::workspace as workspace_row;
use cairn_snapshot::store::ArtifactStore;
use cairn_snapshot::{self as snapshot, Manifest, SnapshotError};
use serde_json::{json, Value};
use sqlx::PgConnection;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// A tree a tier produced, before it is recorded in use.
struct Acquired {
    tier: Tier,
    /// The snapshot restored or adopted at; `None` for a baseline or cold tree.
    position: Option<Uuid>,
    index: Option<Arc<Manifest>>,
    /// The snapshot the tier read (a baseline's too), for the record.
    snapshot: Option<Uuid>,
    /// An adopted tree: its hold and former workspace row, taken over in one step.
    adopted: Option<(Uuid, Uuid)>,
}

/// A tree's record in use: its row, an adopted tree's hold and former row, the resume
/// context and the restore record.
struct Record<'r> {
    row: workspace_row::InUse<'r>,
    adopted: Option<(Uuid, Uuid)>,
    resume_context: &'r Value,
    tier: Tier,
    snapshot: Option<Uuid>,
}

/// Transient restore failures are retried this many times before the attempt ends.
const RESTORE_TRIES: usize = 3;

fn canonical_ref(subject: &Subject) -> String {
    subject.git_ref.clone().unwrap_or_else(|| "HEAD".into())
}

/// What a job may commit with its tree's record in use, in the same fenced transaction:
/// a plan's first intent.
// Only generic callers in this crate: no `Send` bound on the futures is needed to name.
#[allow(async_fn_in_trait)]
pub trait Opening {
    /// Writes with the record of a tree acquired from `tier`, or writes nothing; it may
    /// record the request's `resume_context` with its own write of the request's row.
    async fn open(
        &self,
        conn: &mut PgConnection,
        tier: Tier,
        resume_context: &Value,
    ) -> Result<Opened, CustodyError>;
}

/// What an [`Opening`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// Nothing: the record writes the resume context itself.
    Nothing,
    /// Its write recorded the resume context too.
    WithResumeContext,
}

/// Nothing written with the tree's record.
pub struct NoOpening;

impl Opening for NoOpening {
    async fn open(&self, _: &mut PgConnection, _: Tier, _: &Value) -> Result<Opened, CustodyError> {
        Ok(Opened::Nothing)
    }
}

impl Custody {
    /// Acquires the workspace of a claimed request, in the fixed order, and commits
    /// `opening` with its record in use.
    pub async fn acquire<O: Opening>(
        &self,
        lease: &Lease,
        subject: &Subject,
        opening: &O,
    ) -> Result<Tree, CustodyError> {
        let workspace = Workspace::for_request(&self.disk, subject.request_id, self.run_disk_mb);
        let mut conn = self.pool.acquire().await?;
        let (context, agent, dir) = (subject.work_context, &subject.agent, self.directory.id);
        let mut survey = lineage::survey_in(&mut conn, context, agent, Some(dir)).await?;
        drop(conn);
        let generation = survey.generation;
        let mut held = survey.held.take();
        let mut attempts = Vec::new();
        for tier in [Tier::Adopt, Tier::Checkpoint, Tier::Baseline] {
            let acquired = match tier {
                Tier::Adopt => {
                    self.adopt(
                        lease,
                        subject,
                        &workspace,
                        held.take(),
                        survey.head,
                        &mut attempts,
                    )
                    .await?
                }
                Tier::Checkpoint => {
                    workspace.reset().await?;
                    self.restore_checkpoint(lease, subject, &workspace, &survey, &mut attempts)
                        .await?
                }
                _ => {
                    self.restore_baseline(lease, subject, &workspace, &mut attempts)
                        .await?
                }
            };
            if let Some(acquired) = acquired {
                return self
                    .in_use(
                        lease,
                        subject,
                        workspace,
                        (generation, acquired),
                        attempts,
                        opening,
                    )
                    .await;
            }
        }
        // 4. Cold start; a clean clone publishes the baseline the next start can use.
        workspace::cold(
            &workspace,
            subject.repository.as_deref(),
            subject.git_ref.as_deref(),
        )
        .await?;
        if subject.repository.is_some() {
            if let Err(e) = self.publish_baseline(lease, subject, &workspace).await {
                tracing::warn!(error = %e, "baseline not published");
            }
            workspace::task_branch(&workspace.root, subject.work_context).await?;
        }
        let cold = Acquired {
            tier: Tier::Cold,
            position: None,
            index: None,
            snapshot: None,
            adopted: None,
        };
        self.in_use(
            lease,
            subject,
            workspace,
            (generation, cold),
            attempts,
            opening,
        )
        .await
    }

    /// Tier 1: a still-held tree of the same task in this directory ([`lineage::survey_in`]),
    /// with no capture running, and at the lineage head: a tree behind the head (another
    /// worker advanced the lineage since) lacks effects the journal has.
    async fn adopt(
        &self,
        lease: &Lease,
        subject: &Subject,
        workspace: &Workspace,
        held: Option<HeldTree>,
        head: Option<(Uuid, bool)>,
        attempts: &mut Vec<Value>,
    ) -> Result<Option<Acquired>, CustodyError> {
        // We hold the only lease on the task's ticket and own this directory (locked by
        // one live process), so whoever had the tree (a worker that died, or released it
        // held) is gone; a capture it left in progress can never be appended (fenced),
        // and it only read the tree.
        let Some(HeldTree {
            workspace_id: old_workspace,
            path,
            hold_id,
            snapshot_id: position,
        }) = held
        else {
            attempts.push(json!({"tier": "adopt", "outcome": "skipped", "reason": "no tree of this task here"}));
            return Ok(None);
        };
        let held_path = std::path::PathBuf::from(&path);
        let unusable = if position != head.map(|h| h.0) {
            Some("the held tree is behind the lineage head")
        } else if !held_path.is_dir() {
            Some("the held tree is gone")
        } else {
            None
        };
        if let Some(reason) = unusable {
            // Its hold guards nothing a successor may use: end it, and remove the tree.
            let mut tx = lease.begin_fenced(&self.pool).await?;
            hold::end(&mut tx, hold_id, "not_adoptable").await?;
            workspace_row::destroy(&mut tx, old_workspace).await?;
            lineage::record_restore(
                &mut tx,
                Some(subject.request_id),
                None,
                Tier::Adopt,
                None,
                RestoreOutcome::Failed,
                Some(reason),
            )
            .await?;
            tx.commit().await?;
            if held_path.parent() == Some(self.directory.path.as_path()) {
                let _ = tokio::fs::remove_dir_all(&held_path).await;
            }
            tracing::info!(path = %held_path.display(), reason, "held tree not adopted");
            attempts.push(json!({"tier": "adopt", "workspace_id": old_workspace, "outcome": "failed", "reason": reason}));
            return Ok(None);
        }
        if held_path != workspace.root {
            let _ = tokio::fs::remove_dir_all(&workspace.root).await;
            tokio::fs::rename(&held_path, &workspace.root)
                .await
                .map_err(workspace::WorkspaceError::Io)?;
        }
        // The tree keeps what it holds and gets this claim's room.
        workspace
            .resize_tree()
            .await
            .map_err(workspace::WorkspaceError::Io)?;
        if !workspace.home.exists() {
            crate::disk::make(&self.disk, &workspace.home, workspace.quota_mb())
                .await
                .map_err(workspace::WorkspaceError::Io)?;
        }
        Ok(Some(Acquired {
            tier: Tier::Adopt,
            position,
            index: None,
            snapshot: position,
            adopted: Some((hold_id, old_workspace)),
        }))
    }

    /// Tier 2: the same work context's current checkpoint, never another's. A snapshot that
    /// fails verification is quarantined and the next tier tried; one that cannot be
    /// read now (its store does not answer) ends the attempt instead, since a fallback
    /// tree would be behind the journal while that checkpoint is still good.
    async fn restore_checkpoint(
        &self,
        lease: &Lease,
        subject: &Subject,
        workspace: &Workspace,
        survey: &lineage::Survey,
        attempts: &mut Vec<Value>,
    ) -> Result<Option<Acquired>, CustodyError> {
        let Some(checkpoint) = &survey.restorable else {
            let reason = if survey.head.is_some() {
                "the head cannot be restored (retired, failed, or taken under older credentials)"
            } else {
                "no current checkpoint"
            };
            attempts.push(json!({"tier": "checkpoint", "outcome": "skipped", "reason": reason}));
            return Ok(None);
        };
        match self.restore_snapshot(stored(checkpoint), workspace).await {
            Ok(index) => Ok(Some(Acquired {
                tier: Tier::Checkpoint,
                position: Some(checkpoint.id),
                index: Some(Arc::new(index)),
                snapshot: Some(checkpoint.id),
                adopted: None,
            })),
            Err(failure) => {
                let (Restore::Unusable(reason) | Restore::Unavailable(reason)) = &failure;
                self.tier_failed(
                    lease,
                    subject,
                    workspace,
                    Tier::Checkpoint,
                    checkpoint.id,
                    reason,
                    attempts,
                )
                .await?;
                match failure {
                    Restore::Unusable(_) => Ok(None),
                    Restore::Unavailable(reason) => {
                        Err(CustodyError::CheckpointUnavailable(reason))
                    }
                }
            }
        }
    }

    /// Tier 3: an eligible clean baseline, fetched and normalized to the ref.
    async fn restore_baseline(
        &self,
        lease: &Lease,
        subject: &Subject,
        workspace: &Workspace,
        attempts: &mut Vec<Value>,
    ) -> Result<Option<Acquired>, CustodyError> {
        let Some(repository) = subject.repository.as_deref() else {
            return Ok(None);
        };
        let mut conn = self.pool.acquire().await?;
        let baseline = lineage::restorable_baseline(
            &mut conn,
            &subject.agent,
            repository,
            &self.settings.backend,
            self.settings.base_image.as_deref(),
            &canonical_ref(subject),
        )
        .await?;
        drop(conn);
        let Some(baseline) = baseline else {
            attempts.push(
                json!({"tier": "baseline", "outcome": "skipped", "reason": "no eligible baseline"}),
            );
            return Ok(None);
        };
        let restored = match self.restore_snapshot(stored(&baseline), workspace).await {
            Ok(_) => workspace::normalize(&workspace.root, subject.git_ref.as_deref())
                .await
                .map_err(|e| format!("normalize: {e}")),
            Err(Restore::Unusable(reason) | Restore::Unavailable(reason)) => Err(reason),
        };
        match restored {
            Ok(()) => {
                workspace::task_branch(&workspace.root, subject.work_context).await?;
                Ok(Some(Acquired {
                    tier: Tier::Baseline,
                    position: None,
                    index: None,
                    snapshot: Some(baseline.id),
                    adopted: None,
                }))
            }
            Err(reason) => {
                self.tier_failed(
                    lease,
                    subject,
                    workspace,
                    Tier::Baseline,
                    baseline.id,
                    &reason,
                    attempts,
                )
                .await?;
                Ok(None)
            }
        }
    }

    /// A snapshot tier that failed: its attempt is recorded (in the resume context and in
    /// `snapshot_restores`) and the tree is emptied for the next tier.
    #[allow(clippy::too_many_arguments)]
    async fn tier_failed(
        &self,
        lease: &Lease,
        subject: &Subject,
        workspace: &Workspace,
        tier: Tier,
        snapshot: Uuid,
        reason: &str,
        attempts: &mut Vec<Value>,
    ) -> Result<(), CustodyError> {
        attempts.push(json!({"tier": tier.as_str(), "snapshot_id": snapshot, "outcome": "failed", "reason": reason}));
        let mut tx = lease.begin_fenced(&self.pool).await?;
        lineage::record_restore(
            &mut tx,
            Some(subject.request_id),
            None,
            tier,
            Some(snapshot),
            RestoreOutcome::Failed,
            Some(reason),
        )
        .await?;
        tx.commit().await?;
        workspace.reset().await?;
        Ok(())
    }

    /// Restores a snapshot into the workspace, retrying what may pass. A restore only
    /// reads: the snapshot's status changes only when it fails verification
    /// (quarantined); a restore killed midway leaves it as it was.
    /// The snapshot is its id, its store and the manifest key its record names.
    pub(crate) async fn restore_snapshot(
        &self,
        (snapshot_id, store_url, recorded): (Uuid, &str, Option<&str>),
        workspace: &Workspace,
    ) -> Result<Manifest, Restore> {
        if let Ok(mut conn) = self.pool.acquire().await {
            // Used now: the idle rule never retires what is being restored.
            let _ = lineage::touch(&mut conn, snapshot_id).await;
        }
        let (min, max) = (Duration::from_millis(200), Duration::from_secs(2));
        let mut delays = Delays::tries(min, max, RESTORE_TRIES);
        loop {
            if let Err(e) = workspace.empty_tree().await {
                return Err(Restore::Unavailable(format!("preparing the tree: {e}")));
            }
            let result = async {
                // Cleanup and restore use the store the snapshot names, not the current
                // one; a local store that is not there (an unmounted volume) is not
                // created empty.
                let store = ArtifactStore::open_existing(store_url)?;
                let manifest = snapshot::load_recorded(&store, snapshot_id, recorded).await?;
                snapshot::restore_indexed(&store, &manifest, &workspace.root, &self.settings.rules)
                    .await
            }
            .await;
            fault::point(fault::DURING_RESTORE);
            let error = match result {
                Ok(index) => return Ok(index),
                Err(SnapshotError::Integrity(reason)) => {
                    self.quarantine(snapshot_id, &reason).await;
                    return Err(Restore::Unusable(format!("integrity: {reason}")));
                }
                Err(e @ SnapshotError::UnsafeEntry(_)) => {
                    self.quarantine(snapshot_id, &e.to_string()).await;
                    return Err(Restore::Unusable(e.to_string()));
                }
                Err(e) => e.to_string(),
            };
            match delays.next() {
                Some(delay) => {
                    tracing::warn!(snapshot_id = %snapshot_id.simple(), error = %error, ?delay, "restore failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                None => return Err(Restore::Unavailable(error)),
            }
        }
    }

    async fn quarantine(&self, snapshot_id: Uuid, reason: &str) {
        tracing::warn!(snapshot_id = %snapshot_id.simple(), %reason, "snapshot failed verification; quarantined");
        if let Ok(mut conn) = self.pool.acquire().await {
            let _ = lineage::set_status(
                &mut conn,
                snapshot_id,
                &[SnapshotStatus::Ready],
                SnapshotStatus::Quarantined,
            )
            .await;
        }
    }

    /// Records the acquired tree in use, in one fenced transaction: its workspace row
    /// (at its snapshot), the adopted tree's hold moved onto it, older rows of its path
    /// retired, the resume context and the successful tier.
    async fn in_use<O: Opening>(
        &self,
        lease: &Lease,
        subject: &Subject,
        workspace: Workspace,
        (generation, acquired): (i64, Acquired),
        mut attempts: Vec<Value>,
        opening: &O,
    ) -> Result<Tree, CustodyError> {
        let workspace_id = Uuid::new_v4();
        let tier = acquired.tier;
        attempts.push(json!({"tier": tier.as_str(), "snapshot_id": acquired.snapshot, "outcome": "succeeded"}));
        let commit = match subject.repository {
            Some(_) => workspace::head_commit(&workspace.root).await,
            None => None,
        };
        let resume_context = resume_context(&acquired, attempts, commit);
        let path = workspace.root.to_string_lossy().into_owned();
        let record = Record {
            row: workspace_row::InUse {
                id: workspace_id,
                agent: &subject.agent,
                backend: &self.settings.backend,
                persistent: self.settings.persistent,
                host: &self.settings.worker_id,
                directory_id: self.directory.id,
                path: &path,
                snapshot_id: acquired.position,
                work_context_id: subject.work_context,
                run: Some((subject.run_id, subject.request_id, generation)),
            },
            adopted: acquired.adopted,
            resume_context: &resume_context,
            tier,
            snapshot: acquired.snapshot,
        };
        self.record_in_use(lease, subject, &record, opening).await?;
        if acquired.adopted.is_some() {
            fault::point(fault::AFTER_ADOPT);
        }
        Ok(Tree {
            live: LiveTree {
                workspace,
                workspace_id,
                position: acquired.position,
                index: acquired.index,
                // An adopted tree may hold work its last capture missed.
                uncaptured: acquired.adopted.is_some(),
            },
            tier,
            resume_context,
        })
    }

    /// Writes a tree's record in use, and `opening` with it, in one fenced transaction.
    /// A database fault is retried within the lease once the record reads back as not
    /// written: the transaction may have landed before the connection broke, and what
    /// `opening` wrote with it (an intent) must not be written twice, nor be left for a
    /// successor to find without its step.
    async fn record_in_use<O: Opening>(
        &self,
        lease: &Lease,
        subject: &Subject,
        record: &Record<'_>,
        opening: &O,
    ) -> Result<(), CustodyError> {
        let delays = self.settings.write_delays();
        let write = || async {
            let written = self.write_in_use(lease, subject, record, opening).await;
            written.and_then(|()| fault::lost_reply(fault::IN_USE_REPLY))
        };
        let landed = || async {
            let exists = "SELECT EXISTS (SELECT 1 FROM workspaces WHERE id = $1)";
            let found: bool = sqlx::query_scalar(exists)
                .bind(record.row.id)
                .fetch_one(&self.pool)
                .await?;
            Ok::<_, sqlx::Error>(found.then_some(()))
        };
        let rule = (CustodyError::is_transient, || false);
        retry::until_landed(delays, "the tree's record in use", rule, write, landed).await
    }

    async fn write_in_use<O: Opening>(
        &self,
        lease: &Lease,
        subject: &Subject,
        record: &Record<'_>,
        opening: &O,
    ) -> Result<(), CustodyError> {
        let workspace_id = record.row.id;
        let mut tx = lease.begin_fenced(&self.pool).await?;
        // The tree at this path is now this one: older rows of the path (runs of the
        // request that were fenced or died here) describe nothing any more.
        let stale = workspace_row::in_use_replacing(&mut tx, &record.row).await?;
        let adopted = record.adopted.map(|(_, old_workspace)| old_workspace);
        if let Some((hold_id, old_workspace)) = record.adopted {
            // The hold moves with the tree: no gap in which the tree is unguarded.
            hold::move_to(&mut tx, hold_id, workspace_id).await?;
            if !stale.contains(&old_workspace) {
                workspace_row::destroy(&mut tx, old_workspace).await?;
            }
        }
        // An adopted row at this path is among them: its holds stay as they were.
        for old in stale.into_iter().filter(|old| Some(*old) != adopted) {
            hold::end_for_workspace(&mut tx, old, "tree_replaced").await?;
        }
        lineage::record_restore(
            &mut tx,
            Some(subject.request_id),
            None,
            record.tier,
            record.snapshot,
            RestoreOutcome::Succeeded,
            None,
        )
        .await?;
        let opened = opening
            .open(&mut tx, record.tier, record.resume_context)
            .await?;
        if opened == Opened::Nothing {
            request::resume::record(&mut tx, subject.request_id, record.resume_context).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Publishes the clean tree of a cold clone as the baseline of its key.
    async fn publish_baseline(
        &self,
        lease: &Lease,
        subject: &Subject,
        workspace: &Workspace,
    ) -> Result<(), String> {
        let repository = subject.repository.as_deref().unwrap_or_default();
        let reference = canonical_ref(subject);
        let mut conn = self.pool.acquire().await.map_err(|e| e.to_string())?;
        let exists = lineage::restorable_baseline(
            &mut conn,
            &subject.agent,
            repository,
            &self.settings.backend,
            self.settings.base_image.as_deref(),
            &reference,
        )
        .await
        .map_err(|e| e.to_string())?;
        drop(conn);
        if exists.is_some() {
            return Ok(());
        }
        workspace::validate_clean(&workspace.root)
            .await
            .map_err(|e| e.to_string())?;
        let capture = Capture {
            kind: "baseline",
            agent: &subject.agent,
            repository: Some(repository),
            git_ref: Some(&reference),
            work_context: None,
            by: CapturedBy::Request(lease.request_id),
            name: None,
            hold: None,
            appends: false,
        };
        let (mut position, mut index, mut uncaptured) = (None, None, true);
        let at = TreeAt {
            root: &workspace.root,
            workspace_id: None,
            position: &mut position,
            index: &mut index,
            uncaptured: &mut uncaptured,
            index_is_position: false,
        };
        match self.commit(lease, &capture, at, &NoSeal).await {
            Ok(Checkpoint::Stands(id)) => {
                tracing::info!(snapshot_id = %id.simple(), "published a clean baseline");
                Ok(())
            }
            Ok(Checkpoint::Failed(reason)) => Err(reason),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// What the request's resume context says of an acquired tree: its tier, the snapshot
/// it came from, its position, every tier tried, and its commit.
fn resume_context(acquired: &Acquired, attempts: Vec<Value>, commit: Option<String>) -> Value {
    json!({
        "restore_tier": acquired.tier.as_str(),
        "snapshot_id": acquired.snapshot,
        // The snapshot whose effects the tree holds (none for a baseline or cold tree).
        "position": acquired.position,
        "attempts": attempts,
        "commit": commit,
        "note": "filesystem state is not proof that an external effect happened",
    })
}

/// How a restore failed.
pub(crate) enum Restore {
    /// The snapshot is bad (quarantined) or was never restorable here: try the next tier.
    Unusable(String),
    /// It could not be read now: its store did not answer.
    Unavailable(String),
}

/// What [`Custody::restore_snapshot`] needs of a restorable snapshot's record.
fn stored(snapshot: &lineage::Restorable) -> (Uuid, &str, Option<&str>) {
    let recorded = snapshot.manifest_key.as_deref();
    (snapshot.id, &snapshot.store_url, recorded)
}
