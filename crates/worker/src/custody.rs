//! Custody of a request's workspace: how it is acquired, checkpointed and released.
//!
//! **Acquisition order**: (1) adopt a still-held tree of the same task on this host,
//! after ownership and credential checks; (2) restore the same work context's current
//! checkpoint; (3) restore an eligible clean baseline, then fetch and normalize to the
//! ref; (4) cold start. Each failure falls back to the next; no path ever selects another
//! work context's checkpoint. Every attempt is a `snapshot_restores` row and the outcome
//! is the request's resume context.
//!
//! **Capture-before-release**: a durable hold is written, then the tree is captured and
//! appended to the lineage against the expected head; only then may the tree be
//! released. A failed or interrupted capture leaves the hold, so release never destroys
//! the only live tree.

use crate::job::{JobError, Worker};
use crate::workspace::{self, Workspace};
use cairn_common::hold::{self, HoldLimits, HoldTarget};
use cairn_common::lease::Lease;
use cairn_common::lineage::{self, LineageError, NewSnapshot};
use cairn_common::snapshot::{self, CaptureRules, Manifest, SnapshotError};
use cairn_common::store::ArtifactStore;
use serde_json::{json, Value};
use std::sync::Arc;
use uuid::Uuid;

/// Settings of workspace custody on this worker.
#[derive(Debug, Clone)]
pub struct CustodySettings {
    pub store: ArtifactStore,
    /// Name of this workspace backend (part of the baseline key).
    pub backend: String,
    /// Whether trees survive a stop here (14-day holds) or not (1-hour handoff).
    pub persistent: bool,
    pub base_image: Option<String>,
    pub rules: CaptureRules,
    pub hold_limits: HoldLimits,
}

/// What the job knows about its run for custody.
#[derive(Debug, Clone)]
pub struct Subject {
    pub request_id: Uuid,
    pub run_id: Uuid,
    /// The work context: the task id across automatic attempts and continuations.
    pub work_context: Uuid,
    pub agent: String,
    pub repository: Option<String>,
    pub git_ref: Option<String>,
    pub deadline: Option<chrono::DateTime<chrono::Utc>>,
}

/// A workspace in use, with what its next checkpoint appends to.
pub struct Held {
    pub workspace: Workspace,
    pub workspace_id: Uuid,
    /// The lineage head the next checkpoint must find.
    pub head: Option<Uuid>,
    /// The stat index for the next capture.
    pub manifest: Option<Arc<Manifest>>,
    /// Whether the live tree holds work not yet captured.
    pub uncaptured: bool,
    pub resume_context: Value,
}

#[derive(Debug, thiserror::Error)]
pub enum CustodyError {
    #[error(transparent)]
    Job(#[from] JobError),
    #[error(transparent)]
    Workspace(#[from] workspace::WorkspaceError),
}

impl From<sqlx::Error> for CustodyError {
    fn from(e: sqlx::Error) -> Self {
        CustodyError::Job(JobError::Db(e))
    }
}

impl From<cairn_common::lease::LeaseError> for CustodyError {
    fn from(e: cairn_common::lease::LeaseError) -> Self {
        CustodyError::Job(JobError::Lease(e))
    }
}

fn canonical_ref(subject: &Subject) -> String {
    subject.git_ref.clone().unwrap_or_else(|| "HEAD".into())
}

impl Worker {
    /// Acquires the workspace of a claimed request, in the fixed order.
    pub async fn acquire(&self, lease: &Lease, subject: &Subject) -> Result<Held, CustodyError> {
        let custody = &self.custody;
        let workspace = Workspace::for_request(&self.settings.workspaces_dir, subject.request_id);
        let mut attempts = Vec::new();
        let mut conn = self.pool.acquire().await?;
        let generation = lineage::credential_generation(&mut conn, &subject.agent).await?;
        drop(conn);

        // 1. Adopt a still-held tree of the same task on this host.
        if let Some(held) = self
            .adopt(lease, subject, &workspace, generation, &mut attempts)
            .await?
        {
            return Ok(held);
        }
        workspace.reset().await?;

        // 2. The same work context's current checkpoint — never another's.
        let mut conn = self.pool.acquire().await?;
        let head =
            lineage::restorable_head(&mut conn, subject.work_context, &subject.agent).await?;
        drop(conn);
        if let Some(head) = head {
            match self
                .restore_snapshot(head.id, &head.store_url, &workspace)
                .await
            {
                Ok(manifest) => {
                    attempts.push(json!({"tier": "checkpoint", "snapshot_id": head.id, "outcome": "succeeded"}));
                    self.record(
                        lease,
                        subject,
                        "checkpoint",
                        Some(head.id),
                        "succeeded",
                        None,
                    )
                    .await?;
                    return self
                        .in_use(
                            lease,
                            subject,
                            workspace,
                            generation,
                            Some(head.id),
                            Some(Arc::new(manifest)),
                            "checkpoint",
                            Some(head.id),
                            attempts,
                        )
                        .await;
                }
                Err(reason) => {
                    self.tier_failed(
                        lease,
                        subject,
                        &workspace,
                        "checkpoint",
                        head.id,
                        &reason,
                        &mut attempts,
                    )
                    .await?;
                }
            }
        } else {
            attempts.push(json!({"tier": "checkpoint", "outcome": "skipped", "reason": "no current checkpoint"}));
        }
        // The lineage continues from whatever head exists, even if it could not be used.
        let mut conn = self.pool.acquire().await?;
        let lineage_head = lineage::head(&mut conn, subject.work_context)
            .await?
            .map(|h| h.0);

        // 3. An eligible clean baseline.
        if let Some(repository) = subject.repository.as_deref() {
            let baseline = lineage::restorable_baseline(
                &mut conn,
                &subject.agent,
                repository,
                &custody.backend,
                custody.base_image.as_deref(),
                &canonical_ref(subject),
            )
            .await?;
            drop(conn);
            if let Some(baseline) = baseline {
                let restored = match self
                    .restore_snapshot(baseline.id, &baseline.store_url, &workspace)
                    .await
                {
                    Ok(manifest) => {
                        workspace::normalize(&workspace.root, subject.git_ref.as_deref())
                            .await
                            .map(|_| manifest)
                            .map_err(|e| format!("normalize: {e}"))
                    }
                    Err(reason) => Err(reason),
                };
                match restored {
                    Ok(_) => {
                        workspace::task_branch(&workspace.root, subject.work_context).await?;
                        attempts.push(json!({"tier": "baseline", "snapshot_id": baseline.id, "outcome": "succeeded"}));
                        self.record(
                            lease,
                            subject,
                            "baseline",
                            Some(baseline.id),
                            "succeeded",
                            None,
                        )
                        .await?;
                        return self
                            .in_use(
                                lease,
                                subject,
                                workspace,
                                generation,
                                lineage_head,
                                None,
                                "baseline",
                                Some(baseline.id),
                                attempts,
                            )
                            .await;
                    }
                    Err(reason) => {
                        self.tier_failed(
                            lease,
                            subject,
                            &workspace,
                            "baseline",
                            baseline.id,
                            &reason,
                            &mut attempts,
                        )
                        .await?;
                    }
                }
            } else {
                attempts.push(json!({"tier": "baseline", "outcome": "skipped", "reason": "no eligible baseline"}));
            }
        }

        // 4. Cold start; a clean clone publishes the baseline the next start can use.
        workspace::cold(
            &workspace,
            subject.repository.as_deref(),
            subject.git_ref.as_deref(),
        )
        .await?;
        self.record(lease, subject, "cold", None, "succeeded", None)
            .await?;
        attempts.push(json!({"tier": "cold", "outcome": "succeeded"}));
        if subject.repository.is_some() {
            if let Err(e) = self.publish_baseline(subject, &workspace, generation).await {
                tracing::warn!(error = %e, "baseline not published");
            }
            workspace::task_branch(&workspace.root, subject.work_context).await?;
        }
        self.in_use(
            lease,
            subject,
            workspace,
            generation,
            lineage_head,
            None,
            "cold",
            None,
            attempts,
        )
        .await
    }

    async fn adopt(
        &self,
        lease: &Lease,
        subject: &Subject,
        workspace: &Workspace,
        generation: i64,
        attempts: &mut Vec<Value>,
    ) -> Result<Option<Held>, CustodyError> {
        // Held on this host, for the same agent and task, under the current credentials,
        // with no capture running. Its run has ended: we hold the only lease on the task's
        // ticket, so whoever had the tree (a worker that died, or released it held) is gone.
        let candidate: Option<(Uuid, String, Uuid)> = sqlx::query_as(
            "SELECT w.id, w.path, h.id FROM workspaces w JOIN holds h ON h.workspace_id = w.id
              WHERE w.task_id = $1 AND w.agent = $2 AND w.host = $3 AND w.state IN ('running', 'stopped', 'paused')
                AND w.credential_generation = $4 AND h.ended_at IS NULL AND h.expires_at > now()
                AND NOT h.capture_in_progress
              ORDER BY w.updated_at DESC LIMIT 1",
        )
        .bind(subject.work_context)
        .bind(&subject.agent)
        .bind(&self.settings.worker_id)
        .bind(generation)
        .fetch_optional(&self.pool)
        .await?;
        let Some((workspace_id, path, hold_id)) = candidate else {
            attempts.push(json!({"tier": "adopt", "outcome": "skipped", "reason": "no held tree of this task here"}));
            return Ok(None);
        };
        let held_path = std::path::PathBuf::from(&path);
        if !held_path.is_dir() {
            attempts.push(
                json!({"tier": "adopt", "outcome": "failed", "reason": "the held tree is gone"}),
            );
            self.record(
                lease,
                subject,
                "adopt",
                None,
                "failed",
                Some("the held tree is gone"),
            )
            .await?;
            return Ok(None);
        }
        if held_path != workspace.root {
            let _ = tokio::fs::remove_dir_all(&workspace.root).await;
            tokio::fs::rename(&held_path, &workspace.root)
                .await
                .map_err(workspace::WorkspaceError::Io)?;
        }
        tokio::fs::create_dir_all(&workspace.home)
            .await
            .map_err(workspace::WorkspaceError::Io)?;
        let mut tx = lease.begin_fenced(&self.pool).await?;
        // Taking the tree over is the one claim on it: the hold ends with the adoption.
        hold::end(&mut tx, hold_id, "adopted").await?;
        sqlx::query("UPDATE workspaces SET state = 'destroyed', destroyed_at = now(), updated_at = now() WHERE id = $1")
            .bind(workspace_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.record(lease, subject, "adopt", None, "succeeded", None)
            .await?;
        attempts
            .push(json!({"tier": "adopt", "workspace_id": workspace_id, "outcome": "succeeded"}));
        let mut conn = self.pool.acquire().await?;
        let head = lineage::head(&mut conn, subject.work_context)
            .await?
            .map(|h| h.0);
        drop(conn);
        let held = self
            .in_use(
                lease,
                subject,
                workspace.clone(),
                generation,
                head,
                None,
                "adopt",
                None,
                std::mem::take(attempts),
            )
            .await?;
        // An adopted tree may hold work its last capture missed.
        Ok(Some(Held {
            uncaptured: true,
            ..held
        }))
    }

    /// A snapshot tier that failed: its attempt is recorded (in the resume context and in
    /// `snapshot_restores`) and the tree is emptied for the next tier.
    #[allow(clippy::too_many_arguments)]
    async fn tier_failed(
        &self,
        lease: &Lease,
        subject: &Subject,
        workspace: &Workspace,
        tier: &str,
        snapshot: Uuid,
        reason: &str,
        attempts: &mut Vec<Value>,
    ) -> Result<(), CustodyError> {
        attempts.push(
            json!({"tier": tier, "snapshot_id": snapshot, "outcome": "failed", "reason": reason}),
        );
        self.record(lease, subject, tier, Some(snapshot), "failed", Some(reason))
            .await?;
        workspace.reset().await?;
        Ok(())
    }

    /// Restores a snapshot; an integrity failure quarantines it. Returns the reason on failure.
    async fn restore_snapshot(
        &self,
        snapshot_id: Uuid,
        store_url: &str,
        workspace: &Workspace,
    ) -> Result<Manifest, String> {
        // Cleanup and restore use the store the snapshot names, not the current one.
        let store = ArtifactStore::open(store_url).map_err(|e| e.to_string())?;
        let mut conn = self.pool.acquire().await.map_err(|e| e.to_string())?;
        let _ = lineage::set_status(&mut conn, snapshot_id, &["ready"], "restoring").await;
        drop(conn);
        let _ = tokio::fs::remove_dir_all(&workspace.root).await;
        let result = async {
            let manifest = snapshot::load_manifest(&store, snapshot_id).await?;
            snapshot::restore(&store, &manifest, &workspace.root).await?;
            Ok::<_, SnapshotError>(manifest)
        }
        .await;
        let mut conn = self.pool.acquire().await.map_err(|e| e.to_string())?;
        match result {
            Ok(manifest) => {
                let _ = lineage::set_status(&mut conn, snapshot_id, &["restoring"], "ready").await;
                let _ =
                    sqlx::query("UPDATE project_snapshots SET last_used_at = now() WHERE id = $1")
                        .bind(snapshot_id)
                        .execute(&mut *conn)
                        .await;
                Ok(manifest)
            }
            Err(SnapshotError::Integrity(reason)) => {
                tracing::warn!(%snapshot_id, %reason, "snapshot failed verification; quarantined");
                let _ = lineage::set_status(
                    &mut conn,
                    snapshot_id,
                    &["restoring", "ready"],
                    "quarantined",
                )
                .await;
                Err(format!("integrity: {reason}"))
            }
            Err(e) => {
                let _ = lineage::set_status(&mut conn, snapshot_id, &["restoring"], "ready").await;
                Err(e.to_string())
            }
        }
    }

    async fn record(
        &self,
        lease: &Lease,
        subject: &Subject,
        tier: &str,
        snapshot: Option<Uuid>,
        outcome: &str,
        reason: Option<&str>,
    ) -> Result<(), CustodyError> {
        let mut tx = lease.begin_fenced(&self.pool).await?;
        lineage::record_restore(
            &mut tx,
            Some(subject.request_id),
            None,
            tier,
            snapshot,
            outcome,
            reason,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn in_use(
        &self,
        lease: &Lease,
        subject: &Subject,
        workspace: Workspace,
        generation: i64,
        head: Option<Uuid>,
        manifest: Option<Arc<Manifest>>,
        tier: &str,
        snapshot: Option<Uuid>,
        attempts: Vec<Value>,
    ) -> Result<Held, CustodyError> {
        let workspace_id = Uuid::new_v4();
        let resume_context = json!({
            "restore_tier": tier,
            "snapshot_id": snapshot,
            "attempts": attempts,
            "commit": workspace::head_commit(&workspace.root).await,
            "note": "filesystem state is not proof that an external effect happened",
        });
        let mut tx = lease.begin_fenced(&self.pool).await?;
        sqlx::query(
            "INSERT INTO workspaces (id, run_id, task_id, agent, backend, persistent, state, host, path, credential_generation)
             VALUES ($1, $2, $3, $4, $5, $6, 'running', $7, $8, $9)",
        )
        .bind(workspace_id)
        .bind(subject.run_id)
        .bind(subject.work_context)
        .bind(&subject.agent)
        .bind(&self.custody.backend)
        .bind(self.custody.persistent)
        .bind(&self.settings.worker_id)
        .bind(workspace.root.to_string_lossy().as_ref())
        .bind(generation)
        .execute(&mut *tx)
        .await?;
        // The tree at this path is now this one: older rows of the path (runs of the
        // request that were fenced or died here) describe nothing any more.
        sqlx::query(
            "WITH stale AS (
                 UPDATE workspaces SET state = 'destroyed', destroyed_at = now(), updated_at = now()
                  WHERE host = $1 AND path = $2 AND id <> $3 AND state <> 'destroyed'
              RETURNING id)
             UPDATE holds SET ended_at = now(), end_reason = 'tree_replaced'
              WHERE ended_at IS NULL AND workspace_id IN (SELECT id FROM stale)",
        )
        .bind(&self.settings.worker_id)
        .bind(workspace.root.to_string_lossy().as_ref())
        .bind(workspace_id)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE execution_requests SET resume_context = $2 WHERE id = $1")
            .bind(subject.request_id)
            .bind(&resume_context)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Held {
            workspace,
            workspace_id,
            head,
            manifest,
            uncaptured: false,
            resume_context,
        })
    }

    async fn publish_baseline(
        &self,
        subject: &Subject,
        workspace: &Workspace,
        generation: i64,
    ) -> Result<(), String> {
        let repository = subject.repository.as_deref().unwrap_or_default();
        let mut conn = self.pool.acquire().await.map_err(|e| e.to_string())?;
        let exists = lineage::restorable_baseline(
            &mut conn,
            &subject.agent,
            repository,
            &self.custody.backend,
            self.custody.base_image.as_deref(),
            &canonical_ref(subject),
        )
        .await
        .map_err(|e| e.to_string())?;
        if exists.is_some() {
            return Ok(());
        }
        workspace::validate_clean(&workspace.root)
            .await
            .map_err(|e| e.to_string())?;
        let reference = canonical_ref(subject);
        drop(conn);
        // The snapshot row is written under the credential lock (see `checkpoint`).
        let mut tx = self.pool.begin().await.map_err(|e| e.to_string())?;
        let generation = lineage::lock_generation(&mut tx, &subject.agent)
            .await
            .map_err(|e| e.to_string())?
            .max(generation);
        lineage::lock_store_for_capture(&mut tx, self.custody.store.url())
            .await
            .map_err(|e| e.to_string())?;
        let id = lineage::create(
            &mut tx,
            &NewSnapshot {
                kind: "baseline",
                agent: &subject.agent,
                repository: Some(repository),
                backend: &self.custody.backend,
                base_image: self.custody.base_image.as_deref(),
                canonical_ref: Some(&reference),
                work_context_id: None,
                workspace_id: None,
                store_url: self.custody.store.url(),
                credential_generation: generation,
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        lineage::set_status(&mut tx, id, &["creating"], "uploading")
            .await
            .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        let mut conn = self.pool.acquire().await.map_err(|e| e.to_string())?;
        match snapshot::capture(
            &self.custody.store,
            &workspace.root,
            &self.custody.rules,
            None,
            id,
        )
        .await
        {
            Ok((manifest, _)) => {
                let size = i64::try_from(manifest.total_bytes()).unwrap_or(i64::MAX);
                let mut tx = self.pool.begin().await.map_err(|e| e.to_string())?;
                let ready = lineage::mark_ready(&mut tx, id, &snapshot::manifest_key(id), size)
                    .await
                    .map_err(|e| e.to_string())?;
                if !ready {
                    return Err("the baseline was failed while it was captured".into());
                }
                lineage::record_packs(&mut tx, id, &manifest.packs)
                    .await
                    .map_err(|e| e.to_string())?;
                tx.commit().await.map_err(|e| e.to_string())?;
                tracing::info!(snapshot_id = %id, "published a clean baseline");
                Ok(())
            }
            Err(e) => {
                let _ =
                    lineage::set_status(&mut conn, id, &["creating", "uploading"], "failed").await;
                Err(e.to_string())
            }
        }
    }

    /// Capture-before-release: hold, capture, append against the expected head. A
    /// failure leaves the hold in place. Returns whether a checkpoint was appended.
    pub async fn checkpoint(
        &self,
        lease: &Lease,
        subject: &Subject,
        held: &mut Held,
    ) -> Result<bool, CustodyError> {
        held.uncaptured = true;
        let expires = hold::expiry(
            chrono::Utc::now(),
            subject.deadline,
            self.custody.persistent,
            self.custody.hold_limits,
        );
        let mut tx = lease.begin_fenced(&self.pool).await?;
        // Capture is serialized with credential rotation: the generation row is locked
        // until this snapshot row exists, so a rotation either sees it (and retires it)
        // or happened before (and it records the new generation).
        let generation = lineage::lock_generation(&mut tx, &subject.agent).await?;
        lineage::lock_store_for_capture(&mut tx, self.custody.store.url()).await?;
        let target = HoldTarget {
            workspace_id: held.workspace_id,
            run_id: Some(subject.run_id),
            task_id: Some(subject.work_context),
            agent: &subject.agent,
        };
        let hold_id = hold::hold(&mut tx, &target, "capture", expires).await?;
        hold::set_capture_in_progress(&mut tx, hold_id, true).await?;
        let snapshot_id = lineage::create(
            &mut tx,
            &NewSnapshot {
                kind: "checkpoint",
                agent: &subject.agent,
                repository: subject.repository.as_deref(),
                backend: &self.custody.backend,
                base_image: self.custody.base_image.as_deref(),
                canonical_ref: subject.git_ref.as_deref(),
                work_context_id: Some(subject.work_context),
                workspace_id: Some(held.workspace_id),
                store_url: self.custody.store.url(),
                credential_generation: generation,
            },
        )
        .await?;
        lineage::set_status(&mut tx, snapshot_id, &["creating"], "uploading").await?;
        tx.commit().await?;

        let captured = snapshot::capture(
            &self.custody.store,
            &held.workspace.root,
            &self.custody.rules,
            held.manifest.clone(),
            snapshot_id,
        )
        .await;
        let manifest = match captured {
            Ok((manifest, stats)) => {
                tracing::info!(%snapshot_id, files = stats.files, unchanged = stats.files_unchanged, new_chunks = stats.chunks_new, "checkpoint captured");
                manifest
            }
            Err(e) => {
                tracing::warn!(error = %e, %snapshot_id, "capture failed; the hold keeps the live tree");
                let mut tx = lease.begin_fenced(&self.pool).await?;
                lineage::set_status(&mut tx, snapshot_id, &["creating", "uploading"], "failed")
                    .await?;
                hold::set_capture_in_progress(&mut tx, hold_id, false).await?;
                tx.commit().await?;
                return Ok(false);
            }
        };
        let mut tx = lease.begin_fenced(&self.pool).await?;
        let size = i64::try_from(manifest.total_bytes()).unwrap_or(i64::MAX);
        let ready = lineage::mark_ready(
            &mut tx,
            snapshot_id,
            &snapshot::manifest_key(snapshot_id),
            size,
        )
        .await?;
        if !ready {
            // The row left `uploading` meanwhile (the reaper failed a capture that took
            // too long, and may have reclaimed packs it reused): never append it.
            drop(tx);
            tracing::warn!(%snapshot_id, "the snapshot was failed while it was captured; not appended, the hold keeps the tree");
            let mut tx = lease.begin_fenced(&self.pool).await?;
            hold::set_capture_in_progress(&mut tx, hold_id, false).await?;
            tx.commit().await?;
            return Ok(false);
        }
        lineage::record_packs(&mut tx, snapshot_id, &manifest.packs).await?;
        match lineage::append(
            &mut tx,
            subject.work_context,
            &subject.agent,
            held.head,
            snapshot_id,
        )
        .await
        {
            Ok(sequence) => {
                hold::set_capture_in_progress(&mut tx, hold_id, false).await?;
                hold::end(&mut tx, hold_id, "captured").await?;
                tx.commit().await?;
                held.head = Some(snapshot_id);
                held.manifest = Some(Arc::new(manifest));
                held.uncaptured = false;
                tracing::info!(%snapshot_id, sequence, "checkpoint appended");
                Ok(true)
            }
            Err(LineageError::Conflict {
                expected, actual, ..
            }) => {
                drop(tx);
                tracing::warn!(
                    ?expected,
                    ?actual,
                    "a newer checkpoint exists; this capture is stale and not appended"
                );
                // The transaction that marked it ready was rolled back: it is still
                // `uploading`, which would defer every reclamation in its store.
                let mut tx = lease.begin_fenced(&self.pool).await?;
                lineage::set_status(&mut tx, snapshot_id, &["uploading", "ready"], "failed")
                    .await?;
                hold::set_capture_in_progress(&mut tx, hold_id, false).await?;
                tx.commit().await?;
                Ok(false)
            }
            Err(LineageError::Db(e)) => Err(e.into()),
        }
    }

    /// Releases the workspace: the tree is removed only when nothing in it is
    /// uncaptured; otherwise it stays, held, for a successor of the same task. A
    /// completed task retires its lineage.
    pub async fn release(
        &self,
        lease: &Lease,
        subject: &Subject,
        held: &Held,
        terminal: bool,
        completed: bool,
        fenced: bool,
    ) {
        // A terminal task state ends custody: its tree is not kept for a successor.
        let keep = held.uncaptured && !terminal;
        if fenced {
            // Not ours any more: no writes. A tree with a capture in flight stays.
            if !keep {
                workspace::remove(&held.workspace).await;
            }
            return;
        }
        let result = async {
            let mut tx = lease.begin_fenced(&self.pool).await?;
            if keep {
                // Keep it: a hold guards it (written by the failed capture, or now).
                let expires = hold::expiry(chrono::Utc::now(), subject.deadline, self.custody.persistent, self.custody.hold_limits);
                let target = HoldTarget {
                    workspace_id: held.workspace_id,
                    run_id: Some(subject.run_id),
                    task_id: Some(subject.work_context),
                    agent: &subject.agent,
                };
                hold::hold(&mut tx, &target, "uncaptured tree", expires).await?;
                sqlx::query("UPDATE workspaces SET state = 'stopped', updated_at = now() WHERE id = $1")
                    .bind(held.workspace_id)
                    .execute(&mut *tx)
                    .await?;
            } else {
                sqlx::query("UPDATE workspaces SET state = 'destroyed', destroyed_at = now(), updated_at = now() WHERE id = $1")
                    .bind(held.workspace_id)
                    .execute(&mut *tx)
                    .await?;
                if terminal {
                    // Any hold of a terminal task ends with it, in the same transaction.
                    hold::end_for_workspace(&mut tx, held.workspace_id, "task_ended").await?;
                }
            }
            if completed {
                lineage::retire(&mut tx, subject.work_context, "task_completed").await?;
            }
            tx.commit().await?;
            Ok::<_, CustodyError>(())
        }
        .await;
        match result {
            Ok(()) if !keep => workspace::remove(&held.workspace).await,
            Ok(()) => {
                let _ = tokio::fs::remove_dir_all(&held.workspace.home).await;
                tracing::info!(path = %held.workspace.root.display(), "uncaptured tree kept under a hold");
            }
            Err(e) => tracing::warn!(error = %e, "workspace release not recorded; the tree stays"),
        }
    }
}
