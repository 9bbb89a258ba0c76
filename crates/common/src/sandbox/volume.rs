//! Volumes: the one writer of `volumes`. A volume is storage on one worker's disk that
//! one sandbox at a time attaches (at `/volumes/<name>`), kept across the sandbox's
//! stops and its worker's restarts, and never snapshotted, forked or restored.
//!
//! A volume is bound to a workspaces directory (see the worker's `directory`) by the
//! first worker that hosts a sandbox attaching it. From then on that sandbox is placed
//! by that directory's worker alone, which looks for it in the database ([`waiting`])
//! rather than on the shared queue: host-bound storage is only where its host is.

use sqlx::PgConnection;
use uuid::Uuid;

/// A volume's size bounds, in MiB.
pub const MIN_SIZE_MB: i32 = 1;
pub const MAX_SIZE_MB: i32 = 1024 * 1024;
/// The size of a volume created without one.
pub const DEFAULT_SIZE_MB: i32 = 1024;
/// How many volumes one sandbox attaches at most.
pub const MAX_PER_SANDBOX: usize = 4;

/// A volume's name: 1 to 63 of `a-z0-9._-`, starting with a letter or digit (it names a
/// directory under `/volumes`).
pub fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && name.as_bytes()[0].is_ascii_alphanumeric()
}

/// A volume as the API shows it (no host field: where it lives is the worker's).
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct Volume {
    pub id: Uuid,
    pub name: String,
    pub size_mb: i32,
    /// `available`, `deleting` (its worker removes its data) or `deleted`.
    pub state: String,
    /// The sandbox that has it attached, if one has.
    pub attached_to: Option<Uuid>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub deleted_at: Option<chrono::DateTime<chrono::Utc>>,
}

const COLUMNS: &str = "id, name, size_mb, state, attached_to, created_at, deleted_at";

/// Records a volume; `None` if the tenant has a live volume of that name.
pub async fn create(
    conn: &mut PgConnection,
    tenant: &str,
    name: &str,
    size_mb: i32,
) -> Result<Option<Volume>, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO volumes (id, tenant_id, name, size_mb) VALUES ($1, $2, $3, $4)
         ON CONFLICT (tenant_id, name) WHERE state <> 'deleted' DO NOTHING
         RETURNING {COLUMNS}"
    ))
    .bind(Uuid::new_v4())
    .bind(tenant)
    .bind(name)
    .bind(size_mb)
    .fetch_optional(conn)
    .await
}

/// The volume `id` (the API's tenancy guard has checked whose it is).
pub async fn get(conn: &mut PgConnection, id: Uuid) -> Result<Option<Volume>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM volumes WHERE id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await
}

/// The volumes not deleted, of `tenant` (`None`: of every tenant), by name; at most 500.
pub async fn list(
    conn: &mut PgConnection,
    tenant: Option<&str>,
) -> Result<Vec<Volume>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM volumes
          WHERE ($1::text IS NULL OR tenant_id = $1) AND state <> 'deleted'
          ORDER BY name, id LIMIT 500"
    ))
    .bind(tenant)
    .fetch_all(conn)
    .await
}

/// The names of the volumes a sandbox has attached.
pub async fn names_of(conn: &mut PgConnection, sandbox: Uuid) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT name FROM volumes WHERE attached_to = $1 ORDER BY name")
        .bind(sandbox)
        .fetch_all(conn)
        .await
}

/// Why volumes could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("no volume named {0}")]
    Missing(String),
    #[error("the volume {0} is attached to another sandbox")]
    Attached(String),
    #[error(
        "the volumes are on different workers' disks: a sandbox attaches volumes of one worker"
    )]
    Apart,
    #[error("the volume {0} is on the disk of a worker that is not running: nothing could start the sandbox until it is back")]
    HostDown(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Attaches the tenant's volumes `names` to a new sandbox, in its creating transaction;
/// each is attached to one sandbox at a time.
pub async fn attach(
    conn: &mut PgConnection,
    tenant: &str,
    sandbox: Uuid,
    names: &[String],
) -> Result<(), AttachError> {
    // Locked in name order, so two creations naming the same volumes cannot deadlock.
    let found: Vec<(String, Option<Uuid>, Option<Uuid>, bool)> = sqlx::query_as(
        "SELECT v.name, v.attached_to, v.directory_id,
                v.directory_id IS NULL OR EXISTS (
                    SELECT 1 FROM worker_heartbeats h
                     WHERE h.directory_id = v.directory_id
                       AND h.beat_at > clock_timestamp() - $3 * interval '1 millisecond')
           FROM volumes v
          WHERE v.tenant_id = $1 AND v.name = ANY($2) AND v.state = 'available'
          ORDER BY v.name FOR UPDATE OF v",
    )
    .bind(tenant)
    .bind(names)
    .bind(crate::heartbeat::lapse_ms())
    .fetch_all(&mut *conn)
    .await?;
    if let Some(missing) = names.iter().find(|n| !found.iter().any(|f| &f.0 == *n)) {
        return Err(AttachError::Missing(missing.clone()));
    }
    if let Some((name, ..)) = found.iter().find(|f| f.1.is_some()) {
        return Err(AttachError::Attached(name.clone()));
    }
    if let Some((name, ..)) = found.iter().find(|f| !f.3) {
        return Err(AttachError::HostDown(name.clone()));
    }
    let mut directories: Vec<Uuid> = found.iter().filter_map(|f| f.2).collect();
    directories.sort();
    directories.dedup();
    if directories.len() > 1 {
        return Err(AttachError::Apart);
    }
    sqlx::query(
        "UPDATE volumes SET attached_to = $3
          WHERE tenant_id = $1 AND name = ANY($2) AND state = 'available'",
    )
    .bind(tenant)
    .bind(names)
    .bind(sandbox)
    .execute(conn)
    .await?;
    Ok(())
}

/// Detaches the volumes of a destroyed sandbox: another sandbox may attach them.
pub async fn detach_all(conn: &mut PgConnection, sandbox: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE volumes SET attached_to = NULL WHERE attached_to = $1")
        .bind(sandbox)
        .execute(conn)
        .await?;
    Ok(())
}

/// What a delete came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Deleted {
    /// Never bound to a disk: gone at once.
    Gone,
    /// Its worker removes its data, then marks it deleted.
    Deleting,
    /// Attached to this sandbox: destroy it first.
    Attached(Uuid),
    NotFound,
}

/// Deletes the volume `id`, unless a sandbox has it attached.
pub async fn delete(conn: &mut PgConnection, id: Uuid) -> Result<Deleted, sqlx::Error> {
    let row: Option<(Option<Uuid>, Option<Uuid>, String)> = sqlx::query_as(
        "SELECT attached_to, directory_id, state FROM volumes WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((attached, directory, state)) = row else {
        return Ok(Deleted::NotFound);
    };
    match (attached, directory, state.as_str()) {
        (Some(sandbox), ..) => Ok(Deleted::Attached(sandbox)),
        (None, _, "deleted") => Ok(Deleted::Gone),
        (None, _, "deleting") => Ok(Deleted::Deleting),
        (None, None, _) => {
            removed(conn, id).await?;
            Ok(Deleted::Gone)
        }
        (None, Some(_), _) => {
            sqlx::query("UPDATE volumes SET state = 'deleting' WHERE id = $1")
                .bind(id)
                .execute(conn)
                .await?;
            Ok(Deleted::Deleting)
        }
    }
}

/// A volume's data is gone from its disk (or it never had any).
pub async fn removed(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE volumes SET state = 'deleted', deleted_at = now() WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// The directory whose worker alone places the sandbox (its volumes' disk), if any.
pub async fn directory_of(
    conn: &mut PgConnection,
    sandbox: Uuid,
) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT directory_id FROM volumes
          WHERE attached_to = $1 AND directory_id IS NOT NULL LIMIT 1",
    )
    .bind(sandbox)
    .fetch_optional(conn)
    .await
}

/// A volume attached to a sandbox being hosted, as its worker mounts it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Mount {
    pub id: Uuid,
    pub name: String,
    pub size_mb: i32,
}

/// Binds the sandbox's volumes to `directory`, the disk of the worker hosting it, in
/// that owner's fenced transaction; `None` if one is bound to another directory (the
/// sandbox is that directory's worker's to place).
pub async fn bind(
    conn: &mut PgConnection,
    sandbox: Uuid,
    directory: Uuid,
) -> Result<Option<Vec<Mount>>, sqlx::Error> {
    let elsewhere: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM volumes WHERE attached_to = $1 AND directory_id <> $2)",
    )
    .bind(sandbox)
    .bind(directory)
    .fetch_one(&mut *conn)
    .await?;
    if elsewhere {
        return Ok(None);
    }
    sqlx::query_as(
        "UPDATE volumes SET directory_id = $2 WHERE attached_to = $1
         RETURNING id, name, size_mb",
    )
    .bind(sandbox)
    .bind(directory)
    .fetch_all(conn)
    .await
    .map(Some)
}

/// The sandboxes, with their tenants, that want placing and whose volumes are on
/// `directory`'s disk: only its worker places them. (A fork meant for it is handed
/// over when its source's tree is staged, or goes anywhere after
/// `record::STAGED_WAIT_MS`: found here, it could be taken before its tree is staged.)
pub async fn waiting(
    conn: &mut PgConnection,
    directory: Uuid,
) -> Result<Vec<(Uuid, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT DISTINCT s.id, s.tenant_id FROM volumes v JOIN sandboxes s ON s.id = v.attached_to
          WHERE v.directory_id = $1 AND v.attached_to IS NOT NULL
            AND s.desired = 'running' AND s.state IN ('creating', 'stopped', 'paused')
            AND s.lease_owner IS NULL",
    )
    .bind(directory)
    .fetch_all(conn)
    .await
}

/// The volumes on `directory`'s disk being deleted: its worker removes their data.
pub async fn deleting(conn: &mut PgConnection, directory: Uuid) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM volumes WHERE directory_id = $1 AND state = 'deleting'")
        .bind(directory)
        .fetch_all(conn)
        .await
}
