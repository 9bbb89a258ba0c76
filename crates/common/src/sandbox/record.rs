//! Writes every component makes to a sandbox's row: a state move through the transition
//! table, a placement announced through the outbox, and an owner fenced out.

use super::state::{SandboxEvent, SandboxState};
use crate::outbox;
use crate::request::table::{apply, Error};
use crate::run::{JobKind, JobMessage};
use sqlx::PgConnection;
use uuid::Uuid;

/// A sandbox to record in `creating`.
#[derive(Debug, Clone)]
pub struct NewSandbox<'a> {
    pub agent: &'a str,
    pub persistent: bool,
    pub always_on: bool,
    pub timeout_sec: i32,
    pub idle_timeout_sec: i32,
    pub disk_mb: i32,
    pub repository: Option<&'a str>,
    pub git_ref: Option<&'a str>,
    pub source_snapshot_id: Option<Uuid>,
    pub forked_from: Option<Uuid>,
    pub idempotency_key: Option<&'a str>,
    pub request_digest: &'a str,
    /// The tenant it belongs to (a fork: its source's).
    pub tenant: &'a str,
    /// Its network policy (a fork: its source's); `None`: the worker's default.
    pub network: Option<serde_json::Value>,
    /// Its labels (a fork: its source's), a JSON object of strings.
    pub metadata: serde_json::Value,
    /// The template version it starts from, if any.
    pub template_id: Option<Uuid>,
    /// The ports a preview reaches (a fork: its source's).
    pub ports: Vec<i32>,
    /// Its services, a JSON object of `ServiceSpec`s by name (a fork: its source's).
    pub services: serde_json::Value,
    /// The directory whose worker places it first (a fork's, where its source's tree is
    /// staged); `None`: any worker, through the queue.
    pub placement_directory: Option<Uuid>,
}

/// Records a new sandbox in `creating` and announces its placement, in the caller's
/// transaction. A unique violation means its idempotency key is taken.
pub async fn create(conn: &mut PgConnection, s: &NewSandbox<'_>) -> Result<Uuid, sqlx::Error> {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO sandboxes (id, agent, state, persistent, always_on, timeout_sec, idle_timeout_sec,
                                disk_mb, repository, git_ref, source_snapshot_id, forked_from,
                                idempotency_key, request_digest, tenant_id, network, metadata,
                                template_id, ports, services, placement_directory, created_at)
         VALUES ($1, $2, 'creating', $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                 $17, $18, $19, $20, clock_timestamp())",
    )
    .bind(id)
    .bind(s.agent)
    .bind(s.persistent)
    .bind(s.always_on)
    .bind(s.timeout_sec)
    .bind(s.idle_timeout_sec)
    .bind(s.disk_mb)
    .bind(s.repository)
    .bind(s.git_ref)
    .bind(s.source_snapshot_id)
    .bind(s.forked_from)
    .bind(s.idempotency_key)
    .bind(s.request_digest)
    .bind(s.tenant)
    .bind(&s.network)
    .bind(&s.metadata)
    .bind(s.template_id)
    .bind(&s.ports)
    .bind(&s.services)
    .bind(s.placement_directory)
    .execute(&mut *conn)
    .await?;
    announce_placement(conn, id).await?;
    Ok(id)
}

/// Moves the sandbox by `event`, or [`Error::Refused`] naming its current state.
pub async fn transition(
    conn: &mut PgConnection,
    id: Uuid,
    event: SandboxEvent,
) -> Result<SandboxState, Error> {
    apply::<SandboxState>(conn, id, event).await
}

/// Announces the sandbox's placement: a worker claims it from `cairn.sandboxes`. A
/// sandbox whose volumes are on one worker's disk, or a fork meant for the worker that
/// staged its source's tree, is announced to no queue: that worker finds it in the
/// database (see [`super::volume::waiting`]).
pub async fn announce_placement(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    let directed: bool = sqlx::query_scalar(
        "SELECT placement_directory IS NOT NULL AND state = 'creating'
                OR EXISTS (SELECT 1 FROM volumes WHERE attached_to = $1 AND directory_id IS NOT NULL)
           FROM sandboxes WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?
    .unwrap_or(false);
    if directed {
        return Ok(());
    }
    outbox::announce(
        conn,
        &JobMessage {
            tenant: None,
            kind: JobKind::Sandbox,
            run_id: id,
            request_id: id,
            action_id: None,
            attempt: None,
        },
    )
    .await?;
    Ok(())
}

/// How long a fork may wait for the worker that staged its source's tree, counted from
/// its record (made before its capture's commit, so it bounds a capture too): that
/// worker takes it at once, or hands it to every worker itself.
pub const STAGED_WAIT_MS: i64 = 30_000;

/// Forks meant for the worker that staged their source's tree, which any worker places
/// now, from the capture: `forks` (that worker cannot take them), or, with `None`,
/// every one still waiting past [`STAGED_WAIT_MS`] (that worker is gone). Their ids.
pub async fn place_anywhere(
    conn: &mut PgConnection,
    forks: Option<&[Uuid]>,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let late: Vec<Uuid> = sqlx::query_scalar(
        "UPDATE sandboxes SET placement_directory = NULL
          WHERE placement_directory IS NOT NULL AND state = 'creating' AND lease_owner IS NULL
            AND CASE WHEN $2::uuid[] IS NULL
                     THEN created_at < clock_timestamp() - $1 * interval '1 millisecond'
                     ELSE id = ANY($2) END
          RETURNING id",
    )
    .bind(STAGED_WAIT_MS)
    .bind(forks)
    .fetch_all(&mut *conn)
    .await?;
    for id in &late {
        announce_placement(conn, *id).await?;
    }
    Ok(late)
}

/// Ends the current owner's lease: the epoch moves on, so it writes nothing more.
pub async fn fence_out(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE sandboxes SET lease_epoch = lease_epoch + 1, lease_owner = NULL,
                lease_deadline = NULL, updated_at = now()
          WHERE id = $1",
    )
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Ends the operations that will not get a receipt from this owner: those never started
/// (`reason`), and those that were running when its owner was lost (their outcome
/// unknown).
pub async fn interrupt_operations(
    conn: &mut PgConnection,
    id: Uuid,
    reason: &str,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE sandbox_operations
            SET state = 'interrupted', finished_at = now(),
                result = jsonb_build_object('error', CASE WHEN state = 'running'
                    THEN 'its worker was lost while it ran: its outcome is unknown'
                    ELSE $2 END)
          WHERE sandbox_id = $1 AND state IN ('pending', 'running')",
    )
    .bind(id)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// Ends the holds on the sandbox's tree (its worker keeps it no longer).
pub async fn end_holds(conn: &mut PgConnection, id: Uuid, reason: &str) -> Result<(), sqlx::Error> {
    crate::hold::end_for_sandbox(conn, id, reason).await
}

/// The sandbox's tree is on no worker any more (it stopped, or its worker was lost):
/// its holds end, and its one workspace row (which the reaper's sandbox rules follow)
/// stays `stopped` with no directory, so no worker's janitor ever takes it for a tree
/// of its own to destroy.
pub async fn tree_released(
    conn: &mut PgConnection,
    id: Uuid,
    reason: &str,
) -> Result<(), sqlx::Error> {
    end_holds(conn, id, reason).await?;
    crate::workspace::leave_worker_of_sandbox(conn, id).await
}

/// Destroys a sandbox no worker holds: released, its pending operations ended, its
/// tree's holds ended and its workspace row destroyed (its snapshots go after the
/// reaper's grace).
pub async fn destroy_unowned(
    conn: &mut PgConnection,
    id: Uuid,
    event: SandboxEvent,
) -> Result<(), Error> {
    transition(conn, id, event).await?;
    fence_out(conn, id).await?;
    sqlx::query(
        "UPDATE sandboxes SET desired = 'destroyed', destroyed_at = now(), paused_at = NULL WHERE id = $1",
    )
    .bind(id)
    .execute(&mut *conn)
    .await?;
    interrupt_operations(conn, id, "the sandbox was destroyed first").await?;
    end_holds(conn, id, "sandbox_destroyed").await?;
    super::volume::detach_all(conn, id).await?;
    crate::workspace::destroy_of_sandbox(conn, id).await?;
    Ok(())
}
