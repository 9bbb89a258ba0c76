//! The moves a sandbox's owner makes, each in one fenced transaction: running (its tree
//! acquired here), stopped (with its stop snapshot, its slot released), destroyed, or
//! failed to start.

use super::operation::{self, Owner, SharedTree};
use super::tree::{self, SandboxTree, Seal, Unacquired};
use super::{HostError, SandboxRow, POLL};
use crate::context::Worker;
use crate::isolation;
use crate::preview;
use crate::workspace;
use cairn_common::lease::{Lease, LeaseError};
use cairn_common::retry::Delays;
use cairn_common::sandbox::identity::Identity;
use cairn_common::sandbox::service::ServiceSpec;
use cairn_common::sandbox::{operations, owner, volume, Operation};
use cairn_common::workspace as workspace_row;
use futures::stream::{FuturesUnordered, StreamExt};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How many times a stop's capture is tried before the sandbox fails.
const STOP_TRIES: usize = 4;

/// How a sandbox leaves this worker: stopped (for the reason its record keeps, none
/// when it was asked to), or destroyed.
enum Leaving {
    Stop(Option<&'static str>),
    Destroy,
}

/// Where a sandbox's volumes are.
enum Mounted {
    /// On this worker's disk: each directory and its name.
    Here(Vec<(std::path::PathBuf, String)>),
    /// On another worker's disk: the lease went back for that worker to place it.
    Elsewhere,
    /// It cannot start here, for this reason.
    Refused(String),
}

/// A claimed sandbox on this worker.
pub struct Host {
    pub worker: Arc<Worker>,
    pub lease: Lease,
    pub row: SandboxRow,
    /// Cancelled once the lease cannot be kept.
    pub lost: CancellationToken,
    /// The held namespaces its commands enter, where processes run in namespaces.
    pub session: Option<isolation::Session>,
}

impl Host {
    /// Acquires the tree, marks the sandbox running, then serves it until it leaves.
    pub async fn run(
        mut self,
        shutdown: &CancellationToken,
        drain: &CancellationToken,
    ) -> Result<&'static str, HostError> {
        let volumes = match self.volumes().await {
            Ok(Mounted::Here(volumes)) => volumes,
            Ok(Mounted::Elsewhere) => return Ok("volumes_elsewhere"),
            Ok(Mounted::Refused(reason)) => {
                self.failed(&reason).await?;
                return Ok("failed_to_start");
            }
            Err(e) => {
                self.lapse().await;
                return Err(e);
            }
        };
        let mut tree = match tree::acquire(&self.worker, &self.row).await {
            Ok(tree) => tree,
            Err(Unacquired::Failed(reason)) => {
                self.failed(&reason).await?;
                return Ok("failed_to_start");
            }
            Err(Unacquired::Host(e)) => {
                // The sweeper places it again (its attempts are counted).
                self.lapse().await;
                return Err(e);
            }
        };
        if matches!(tree.origin, "source" | "staged") {
            if let Some(left) = self.adopt_copy(&mut tree).await? {
                return Ok(left);
            }
        }
        let spec = isolation::Spec {
            workspace: tree.live.workspace.root.clone(),
            cwd: None,
            home: tree.live.workspace.home.clone(),
            network: self
                .row
                .effective_network(self.worker.isolation.network_default()),
            limits: self.worker.isolation.limits(None),
            identity: None,
            volumes,
        };
        let identity = match self.identity().await {
            Ok(identity) => identity,
            Err(e) => {
                self.lapse().await;
                return Err(e);
            }
        };
        self.session = match self.worker.isolation.start_session(&spec, &identity).await {
            Ok(session) => session,
            Err(reason) => {
                self.failed(&reason).await?;
                return Ok("failed_to_start");
            }
        };
        self.running(&tree).await?;
        tracing::info!(
            origin = tree.origin,
            held = self.session.is_some(),
            "sandbox running"
        );
        self.open_previews();
        let left = match self.enable_services().await {
            Ok(()) => self.serve(&mut tree, shutdown, drain).await,
            Err(e) => Err(e),
        };
        self.worker.previews.close(self.row.id, self.lease.epoch);
        // Whatever happened, no process of the sandbox outlives its hosting here.
        if let Some(session) = self.session.take() {
            session.end(&self.worker.isolation).await;
        }
        left
    }

    /// A copy of another sandbox: its identity goes, and its tree becomes this sandbox's
    /// own first checkpoint. `Some` when it cannot start.
    async fn adopt_copy(
        &mut self,
        tree: &mut SandboxTree,
    ) -> Result<Option<&'static str>, HostError> {
        let root = tree.live.workspace.root.clone();
        // A staged tree was scrubbed as it was cut to its capture.
        let staged = tree.origin == "staged";
        let scrubbed = tokio::task::spawn_blocking(move || match staged {
            true => Ok(0),
            false => super::fork::scrub(&root),
        });
        match scrubbed.await {
            Ok(Ok(removed)) if removed > 0 => tracing::info!(removed, "identity files removed"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                self.failed(&format!("scrubbing the copied tree: {e}"))
                    .await?;
                return Ok(Some("failed_to_start"));
            }
            Err(e) => return Err(HostError::Transient(e.to_string())),
        }
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        tree::record_in_use(&mut tx, &self.worker, &self.row, tree).await?;
        tx.commit().await?;
        if let Err(e) = tree::commit(&self.worker, &self.lease, &self.row, tree, Seal::Start).await
        {
            self.lapse().await;
            return Err(e);
        }
        Ok(None)
    }

    /// Previews reach the running sandbox's ports (in its namespaces, where it has them).
    fn open_previews(&self) {
        let target = match &self.session {
            Some(session) => preview::Target::Namespaces(
                session
                    .namespaces()
                    .into_iter()
                    .filter_map(|pid| std::fs::File::open(format!("/proc/{pid}/ns/net")).ok())
                    .map(Arc::new)
                    .collect(),
            ),
            None => preview::Target::Host,
        };
        self.worker
            .previews
            .open(self.row.id, self.lease.epoch, target);
    }

    /// Queues the start of each of the sandbox's services, as operations of its journal
    /// (a stop ended their processes; these start them again), but for one whose start
    /// is queued already (set while the sandbox was stopped, which resumed it).
    async fn enable_services(&self) -> Result<(), HostError> {
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        let services: sqlx::types::Json<BTreeMap<String, ServiceSpec>> =
            sqlx::query_scalar("SELECT services FROM sandboxes WHERE id = $1")
                .bind(self.row.id)
                .fetch_one(&mut *tx)
                .await?;
        let queued: Vec<String> = sqlx::query_scalar(
            "SELECT body->>'name' FROM sandbox_operations
              WHERE sandbox_id = $1 AND kind = 'service' AND state = 'pending'",
        )
        .bind(self.row.id)
        .fetch_all(&mut *tx)
        .await?;
        for (name, service) in services.0 {
            if queued.contains(&name) {
                continue;
            }
            let operation = Operation::Service {
                name,
                service: Some(service),
            };
            let body = serde_json::to_value(&operation)
                .map_err(|e| HostError::Transient(e.to_string()))?;
            operations::record(&mut tx, self.row.id, operation.kind(), &body).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The identity the sandbox keeps for its life: made here on its first run.
    async fn identity(&self) -> Result<Identity, HostError> {
        let made = isolation::identity::make(self.row.id).map_err(HostError::Transient)?;
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        let kept = owner::keep_identity(&mut tx, self.row.id, &made).await?;
        tx.commit().await?;
        Ok(kept)
    }

    /// Binds the sandbox's volumes to this worker's disk and makes their directories;
    /// a volume already on another worker's disk makes the sandbox that worker's to
    /// place: this one gives its lease back, changing nothing else.
    async fn volumes(&self) -> Result<Mounted, HostError> {
        let directory = self.worker.custody.directory.id;
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        let Some(mounts) = volume::bind(&mut tx, self.row.id, directory).await? else {
            tracing::info!(
                "the sandbox's volumes are on another worker's disk: its lease goes back"
            );
            self.release_and_commit(tx).await?;
            return Ok(Mounted::Elsewhere);
        };
        if mounts.is_empty() {
            return Ok(Mounted::Here(Vec::new()));
        }
        if !self.worker.isolation.isolates() {
            return Ok(Mounted::Refused(
                "volumes are mounted in the step sandbox, which this worker does not run (CAIRN_SANDBOX=off)".into(),
            ));
        }
        tx.commit().await?;
        let disk = self.worker.custody.disk.clone();
        let made = tokio::task::spawn_blocking(move || {
            mounts
                .into_iter()
                .map(|m| {
                    let room = u64::try_from(m.size_mb).unwrap_or(1);
                    disk.volume(m.id, room).map(|path| (path, m.name))
                })
                .collect::<std::io::Result<Vec<_>>>()
        })
        .await
        .map_err(|e| HostError::Transient(e.to_string()))?;
        made.map(Mounted::Here)
            .map_err(|e| HostError::Transient(format!("preparing a volume: {e}")))
    }

    /// Serves the running sandbox until it leaves this worker, then stops or destroys it.
    async fn serve(
        &mut self,
        tree: &mut SandboxTree,
        shutdown: &CancellationToken,
        drain: &CancellationToken,
    ) -> Result<&'static str, HostError> {
        let shared = tokio::sync::Mutex::new(tree);
        let leaving = self.lost.child_token();
        let left = self
            .serve_operations(&shared, shutdown, (drain, &leaving))
            .await?;
        let tree = shared.into_inner();
        match left {
            Leaving::Stop(reason) => {
                self.stop(tree, reason).await?;
                Ok(reason.unwrap_or("stopped"))
            }
            Leaving::Destroy => {
                self.destroy(tree).await?;
                Ok("destroyed")
            }
        }
    }

    /// Performs the sandbox's operations in order, but for an exec that takes input,
    /// which runs beside them (an open shell holds nothing up), and does what is asked
    /// of the sandbox, until it is to leave; the execs beside end first. The tree's
    /// lock is only ever awaited by an operation, polled here: never by this loop.
    async fn serve_operations(
        &self,
        tree: &SharedTree<'_>,
        shutdown: &CancellationToken,
        (drain, leaving): (&CancellationToken, &CancellationToken),
    ) -> Result<Leaving, HostError> {
        let owner = self.owner();
        let workspace_id = tree.lock().await.live.workspace_id;
        let mut in_turn = FuturesUnordered::new();
        let mut beside = FuturesUnordered::new();
        // The execs beside, until they end: the next operation is another.
        let mut launched: Vec<Uuid> = Vec::new();
        let mut paused: Option<tokio::time::Instant> = None;
        let left = loop {
            let idle = in_turn.is_empty();
            tokio::select! {
                biased;
                _ = self.lost.cancelled() => return Err(self.lost_error()),
                Some(done) = in_turn.next() => { done?; continue; }
                Some((id, done)) = beside.next() => {
                    launched.retain(|l| *l != id);
                    done?;
                    continue;
                }
                _ = shutdown.cancelled(), if idle => {
                    break Leaving::Stop(Some("worker_drained"));
                }
                _ = tokio::time::sleep(POLL), if idle => {}
            }
            let (desired, op) = match self.asked(&launched).await {
                Ok(asked) => asked,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the sandbox failed; trying again");
                    continue;
                }
            };
            match (desired.as_str(), paused) {
                ("stopped", _) => break Leaving::Stop(None),
                ("destroyed", _) => break Leaving::Destroy,
                // A pause lasts at most the limit, then it behaves like a stop.
                (_, Some(since)) if since.elapsed() >= self.worker.settings.pause_limit => {
                    break Leaving::Stop(Some("pause_expired"));
                }
                ("paused", None) => {
                    self.pause(workspace_id, true).await?;
                    paused = Some(tokio::time::Instant::now());
                    continue;
                }
                ("running", Some(_)) => {
                    self.pause(workspace_id, false).await?;
                    paused = None;
                }
                (_, Some(_)) => continue,
                _ => {}
            }
            let Some((id, body)) = op else { continue };
            let operation = Operation::deserialize(&body);
            let beside_the_rest = operation.as_ref().is_ok_and(Operation::takes_input);
            let performing = operation::perform(&owner, tree, id, operation, (drain, leaving));
            match beside_the_rest {
                true => {
                    launched.push(id);
                    beside.push(async move { (id, performing.await) });
                }
                false => in_turn.push(performing),
            }
        };
        self.end_beside(beside, paused.is_some(), leaving).await?;
        Ok(left)
    }

    /// Ends the execs beside the others, as the sandbox leaves (a stop, a destroy, the
    /// worker's drain: an open shell would hold any of them up), thawed first (a frozen
    /// process cannot end), and waits for their receipts.
    async fn end_beside<F>(
        &self,
        mut beside: FuturesUnordered<F>,
        paused: bool,
        leaving: &CancellationToken,
    ) -> Result<(), HostError>
    where
        F: std::future::Future<Output = (Uuid, Result<(), HostError>)>,
    {
        if !beside.is_empty() {
            leaving.cancel();
            if let (Some(session), true) = (&self.session, paused) {
                session.freeze(false);
            }
        }
        while let Some((_, done)) = beside.next().await {
            done?;
        }
        Ok(())
    }

    /// One row: what is asked of the sandbox, and its next operation if any (but those
    /// `launched`, which may not have started yet).
    async fn asked(
        &self,
        launched: &[Uuid],
    ) -> Result<(String, Option<(Uuid, serde_json::Value)>), sqlx::Error> {
        let next: (String, Option<Uuid>, Option<serde_json::Value>) = sqlx::query_as(
            "SELECT s.desired, o.id, o.body FROM sandboxes s
               LEFT JOIN LATERAL (SELECT id, body FROM sandbox_operations
                                   WHERE sandbox_id = s.id AND state = 'pending'
                                     AND NOT (id = ANY($2))
                                   ORDER BY seq LIMIT 1) o ON TRUE
              WHERE s.id = $1",
        )
        .bind(self.row.id)
        .bind(launched)
        .fetch_one(&self.worker.pool)
        .await?;
        let (desired, id, body) = next;
        Ok((desired, id.zip(body)))
    }

    /// Freezes every process of the sandbox in place and records it paused, or thaws
    /// them and records it running.
    async fn pause(&self, workspace_id: Uuid, frozen: bool) -> Result<(), HostError> {
        if frozen {
            // A frozen process would hold a preview's connection unanswered.
            self.worker.previews.close(self.row.id, self.lease.epoch);
        }
        if let Some(session) = &self.session {
            session.freeze(frozen);
        }
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        owner::paused(&mut tx, self.row.id, frozen).await?;
        workspace_row::set_paused(&mut tx, workspace_id, frozen).await?;
        tx.commit().await?;
        if !frozen {
            self.open_previews();
        }
        tracing::info!(frozen, "sandbox paused or thawed in place");
        Ok(())
    }

    /// What an operation needs of its owner.
    fn owner(&self) -> Owner<'_> {
        Owner {
            worker: &self.worker,
            lease: &self.lease,
            row: &self.row,
            lost: &self.lost,
            session: self.session.as_ref(),
        }
    }

    fn lost_error(&self) -> HostError {
        HostError::Lost(LeaseError::Expired {
            request_id: self.row.id,
        })
    }

    /// Lets the lease lapse now, so the sweeper places the sandbox again at once.
    async fn lapse(&self) {
        self.worker.leases.for_sandboxes().lapse(&self.lease).await;
    }

    /// Ends this owner's lease in its fenced transaction, commits it, then drops the
    /// liveness key: the last write of every way a sandbox leaves its worker but a stop
    /// (whose seal releases the lease itself).
    async fn release_and_commit(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    ) -> Result<(), HostError> {
        let leases = self.worker.leases.for_sandboxes();
        leases.release_in(&mut tx, &self.lease).await?;
        tx.commit().await?;
        leases.clear_liveness(&self.lease);
        Ok(())
    }

    /// Marks the sandbox running on this worker, its tree recorded and held.
    async fn running(&self, tree: &SandboxTree) -> Result<(), HostError> {
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        tree::record_in_use(&mut tx, &self.worker, &self.row, tree).await?;
        let worker_id = &self.worker.settings.worker_id;
        owner::running_on(
            &mut tx,
            self.row.id,
            self.row.state,
            worker_id,
            tree.live.workspace_id,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Its tree could not be acquired, for good: a sandbox being created fails with the
    /// reason; one being resumed is (or stays) stopped and says why.
    async fn failed(&self, reason: &str) -> Result<(), HostError> {
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        owner::unplaceable(&mut tx, self.row.id, self.row.state, reason).await?;
        self.release_and_commit(tx).await?;
        tracing::warn!(reason, "sandbox could not be prepared");
        Ok(())
    }

    /// Stops the sandbox here: the stop snapshot is captured and committed with the
    /// stop, then the local tree goes (the snapshot holds it). A capture that keeps
    /// failing fails the sandbox instead, and its hold keeps the tree.
    pub async fn stop(
        &self,
        tree: &mut SandboxTree,
        reason: Option<&str>,
    ) -> Result<(), HostError> {
        let (min, max) = (Duration::from_millis(200), Duration::from_secs(2));
        let mut delays = Delays::tries(min, max, STOP_TRIES);
        loop {
            let error = match tree::commit(
                &self.worker,
                &self.lease,
                &self.row,
                tree,
                Seal::Stop { reason },
            )
            .await
            {
                Ok(snapshot) => {
                    self.worker
                        .leases
                        .for_sandboxes()
                        .clear_liveness(&self.lease);
                    workspace::remove(&tree.live.workspace).await;
                    tracing::info!(snapshot = %snapshot.simple(), "sandbox stopped; its stop snapshot holds its tree");
                    return Ok(());
                }
                Err(e @ (HostError::Capture(_) | HostError::Db(_) | HostError::Transient(_))) => e,
                Err(e) => return Err(e),
            };
            tracing::warn!(error = %error, "stop capture failed; retrying");
            if delays.wait(&self.lost).await.is_none() {
                let reason = format!("its stop snapshot could not be captured: {error}");
                self.runtime_failure(&reason).await?;
                return Ok(());
            }
        }
    }

    /// Recovery failed at run time: the sandbox is in `error`; its hold keeps the tree.
    async fn runtime_failure(&self, reason: &str) -> Result<(), HostError> {
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        owner::runtime_failed(&mut tx, self.row.id, reason).await?;
        self.release_and_commit(tx).await?;
        Ok(())
    }

    /// Destroys the sandbox: everything released, the local tree removed. Its snapshots
    /// go after the reaper's grace.
    async fn destroy(&mut self, tree: &SandboxTree) -> Result<(), HostError> {
        if let Some(session) = self.session.take() {
            session.end(&self.worker.isolation).await;
        }
        let mut tx = self.lease.begin_fenced(&self.worker.pool).await?;
        owner::destroyed(&mut tx, self.row.id).await?;
        self.release_and_commit(tx).await?;
        workspace::remove(&tree.live.workspace).await;
        Ok(())
    }
}
