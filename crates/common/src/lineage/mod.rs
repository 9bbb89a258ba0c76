//! Snapshot records and checkpoint lineage.
//!
//! A snapshot row moves `creating → uploading → ready` (or `failed`, or `quarantined` on
//! an integrity failure) and records the store URL that holds its bytes, and who
//! captures it (request and lease epoch). A restore only reads: it is recorded in
//! `snapshot_restores`, never in the snapshot's own status.
//!
//! A checkpoint has a work-context id, a sequence and a predecessor (the snapshot its
//! tree was derived from). An append creates sequence N+1 only against the expected
//! head, so a stale or concurrent capture fails with a conflict and never overwrites a
//! newer head. A tree that derives from no snapshot (a baseline or cold start), or
//! from an older one, may replace the head only when that head can no longer be
//! restored (its lineage retired, or the snapshot itself retired, failed or
//! quarantined): then the lineage starts again from it.

pub mod credentials;
pub mod durability;
pub mod retention;

pub use credentials::{lock_for_capture, rotate_credentials};
pub use durability::{verified, verify_failed};

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};
use uuid::Uuid;

crate::text_enum! {
    /// Where a snapshot's bytes stand. (`restoring` is never set on a checkpoint or a
    /// baseline: a restore only reads, and is recorded in `snapshot_restores`.)
    pub enum SnapshotStatus {
        Creating => "creating",
        Uploading => "uploading",
        Ready => "ready",
        Restoring => "restoring",
        Failed => "failed",
        /// It failed verification: never restored again.
        Quarantined => "quarantined",
        Deleted => "deleted",
    }
}

crate::text_enum! {
    /// How a tree was acquired, in the order tried.
    pub enum Tier {
        /// A still-held tree of the same task.
        Adopt => "adopt",
        /// The work context's current checkpoint.
        Checkpoint => "checkpoint",
        /// A clean baseline of the repository.
        Baseline => "baseline",
        /// A fresh clone, or an empty directory.
        Cold => "cold",
    }
}

crate::text_enum! {
    /// How one acquisition attempt went.
    pub enum RestoreOutcome {
        Succeeded => "succeeded",
        Failed => "failed",
        Skipped => "skipped",
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LineageError {
    #[error(
        "lineage {} moved: expected head {}, found {}",
        work_context.simple(),
        head_text(expected),
        head_text(actual)
    )]
    Conflict {
        work_context: Uuid,
        expected: Option<Uuid>,
        actual: Option<Uuid>,
    },
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
}

/// A lineage head in an error: its id as 32 hex characters, or `none`.
fn head_text(position: &Option<Uuid>) -> String {
    position.map_or_else(|| "none".into(), |p| p.simple().to_string())
}

/// What a new snapshot row describes.
#[derive(Debug, Clone)]
pub struct NewSnapshot<'a> {
    pub kind: &'a str,
    pub agent: &'a str,
    pub repository: Option<&'a str>,
    pub backend: &'a str,
    pub base_image: Option<&'a str>,
    pub canonical_ref: Option<&'a str>,
    pub work_context_id: Option<Uuid>,
    pub workspace_id: Option<Uuid>,
    pub store_url: &'a str,
    /// The identity of the store (see [`store_key`]).
    pub store_id: Uuid,
    pub credential_generation: i64,
    /// Who captures it, under which lease epoch: once that lease can no longer commit,
    /// the capture is abandoned (the reaper fails it).
    pub owner: Option<(CapturedBy, i64)>,
    /// The snapshot the captured tree derives from.
    pub predecessor: Option<Uuid>,
    /// A snapshot resource's name.
    pub name: Option<&'a str>,
    /// The node of the process writing it (see [`crate::component::node_name`]).
    pub writer_node: Option<&'a str>,
}

/// The job capturing a snapshot: a request's, or a sandbox's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapturedBy {
    Request(Uuid),
    Sandbox(Uuid),
}

impl CapturedBy {
    fn request(self) -> Option<Uuid> {
        match self {
            CapturedBy::Request(id) => Some(id),
            CapturedBy::Sandbox(_) => None,
        }
    }

    fn sandbox(self) -> Option<Uuid> {
        match self {
            CapturedBy::Sandbox(id) => Some(id),
            CapturedBy::Request(_) => None,
        }
    }
}

/// Inserts a snapshot in `creating`.
pub async fn create(conn: &mut PgConnection, s: &NewSnapshot<'_>) -> Result<Uuid, sqlx::Error> {
    insert(conn, s, SnapshotStatus::Creating).await
}

/// Inserts a snapshot already `uploading`, for a capture that starts writing it once its
/// transaction commits: one row version, where `creating` then `uploading` made two.
pub async fn create_uploading(
    conn: &mut PgConnection,
    s: &NewSnapshot<'_>,
) -> Result<Uuid, sqlx::Error> {
    insert(conn, s, SnapshotStatus::Uploading).await
}

async fn insert(
    conn: &mut PgConnection,
    s: &NewSnapshot<'_>,
    status: SnapshotStatus,
) -> Result<Uuid, sqlx::Error> {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO project_snapshots (id, kind, status, agent, repository, backend, base_image, canonical_ref,
                                        work_context_id, workspace_id, store_url, credential_generation,
                                        request_id, lease_epoch, store_id, sandbox_id, predecessor_id, name,
                                        writer_node)
         VALUES ($1, $2, $15, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $16, $17, $18, $19)",
    )
    .bind(id)
    .bind(s.kind)
    .bind(s.agent)
    .bind(s.repository)
    .bind(s.backend)
    .bind(s.base_image)
    .bind(s.canonical_ref)
    .bind(s.work_context_id)
    .bind(s.workspace_id)
    .bind(s.store_url)
    .bind(s.credential_generation)
    .bind(s.owner.and_then(|o| o.0.request()))
    .bind(s.owner.map(|o| o.1))
    .bind(s.store_id)
    .bind(status)
    .bind(s.owner.and_then(|o| o.0.sandbox()))
    .bind(s.predecessor)
    .bind(s.name)
    .bind(s.writer_node)
    .execute(conn)
    .await?;
    Ok(id)
}

/// Records what a capture left out of the durable tree.
pub async fn record_skipped(
    conn: &mut PgConnection,
    id: Uuid,
    skipped: &cairn_snapshot::Skipped,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE project_snapshots SET skipped = $2 WHERE id = $1")
        .bind(id)
        .bind(sqlx::types::Json(skipped))
        .execute(conn)
        .await?;
    Ok(())
}

/// Marks a snapshot used now (a restore starts), so the idle rule never retires a head
/// that is being restored.
pub async fn touch(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE project_snapshots SET last_used_at = now() WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Moves a snapshot from `from` to `to` (compare-and-set); false if it was elsewhere.
pub async fn set_status(
    conn: &mut PgConnection,
    id: Uuid,
    from: &[SnapshotStatus],
    to: SnapshotStatus,
) -> Result<bool, sqlx::Error> {
    let from: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
    let done = sqlx::query(
        "UPDATE project_snapshots SET status = $3,
                quarantined_at = CASE WHEN $3 = 'quarantined' THEN now() ELSE quarantined_at END
          WHERE id = $1 AND status = ANY($2)",
    )
    .bind(id)
    .bind(&from)
    .bind(to)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// What a finished capture stored: where its manifest is, its size, the digest of its
/// tree and the packs it references.
pub struct Stored<'a> {
    pub manifest_key: &'a str,
    pub size_bytes: i64,
    pub tree_digest: &'a str,
    pub pack_ids: &'a [Uuid],
}

/// Marks a snapshot durable and usable, with what it stored, and records which packs it
/// references (in one statement), so the reaper deletes a pack only when no snapshot of
/// its store references it. False, recording nothing, unless the snapshot was still
/// being captured.
pub async fn mark_ready(
    conn: &mut PgConnection,
    id: Uuid,
    stored: &Stored<'_>,
) -> Result<bool, sqlx::Error> {
    let marked: i64 = sqlx::query_scalar(
        "WITH ready AS (UPDATE project_snapshots
                           SET status = 'ready', manifest_key = $2, size_bytes = $3, tree_digest = $5,
                               last_used_at = now()
                         WHERE id = $1 AND status IN ('creating', 'uploading') RETURNING id),
              packs AS (INSERT INTO snapshot_packs (snapshot_id, pack_id)
                        SELECT ready.id, p FROM ready, UNNEST($4::uuid[]) AS p ON CONFLICT DO NOTHING)
         SELECT count(*) FROM ready",
    )
    .bind(id)
    .bind(stored.manifest_key)
    .bind(stored.size_bytes)
    .bind(stored.pack_ids)
    .bind(stored.tree_digest)
    .fetch_one(conn)
    .await?;
    Ok(marked == 1)
}

/// Records which packs a snapshot references, apart from [`mark_ready`] (which records
/// them with the snapshot's readiness).
pub async fn record_packs(
    conn: &mut PgConnection,
    snapshot_id: Uuid,
    pack_ids: &[Uuid],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO snapshot_packs (snapshot_id, pack_id) SELECT $1, p FROM UNNEST($2::uuid[]) AS p
         ON CONFLICT DO NOTHING",
    )
    .bind(snapshot_id)
    .bind(pack_ids)
    .execute(conn)
    .await?;
    Ok(())
}

/// What keys a store's reclaim lock and capture deferral: its identity, the same for
/// every URL or mount path of it (the reaper's SQL spells it
/// `COALESCE(store_id::text, store_url)` for rows older than identities).
pub fn store_key(store_id: Uuid) -> String {
    store_id.to_string()
}

/// The digest of the empty tree: a work context with no lineage yet has this tree.
pub fn empty_tree_digest() -> String {
    cairn_snapshot::Manifest::default().tree_digest()
}

/// SQL for the digest of the tree a continuation of the work context `work_context` (an
/// expression) goes on from: its head's, or `empty` (the bound digest of the empty
/// tree, [`empty_tree_digest`]) when it has no live head. NULL when the head is not a
/// ready, current snapshot with a recorded digest: nothing then proves the tree.
pub fn current_tree_sql(work_context: &str, empty: &str) -> String {
    format!(
        "CASE WHEN EXISTS (SELECT 1 FROM lineage_heads h
                            WHERE h.work_context_id = {work_context} AND h.retired_at IS NULL)
              THEN (SELECT s.tree_digest FROM lineage_heads h JOIN project_snapshots s ON s.id = h.head_id
                     WHERE h.work_context_id = {work_context} AND h.retired_at IS NULL
                       AND s.status = 'ready' AND s.retention = 'current')
              ELSE {empty}::text END"
    )
}

/// The digest of the tree a continuation of `work_context` goes on from now
/// ([`current_tree_sql`]); `None` when nothing proves it.
pub async fn current_tree(
    conn: &mut PgConnection,
    work_context: Uuid,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(&format!("SELECT {}", current_tree_sql("$1", "$2")))
        .bind(work_context)
        .bind(empty_tree_digest())
        .fetch_one(conn)
        .await
}

/// Whether the snapshot `p` still stands as a source a new sandbox may start from: a
/// current one, or a failed step's tree kept for inspection (retired as it was made,
/// readable until its bytes are reclaimed), unless its agent's credentials rotated since.
pub const RESTORABLE_SOURCE: &str = "(p.retention = 'current'
    OR (p.kind = 'inspection' AND p.retention = 'retired' AND p.retire_reason = 'inspection'
        AND p.credential_generation >= COALESCE(
              (SELECT g.generation FROM credential_generations g WHERE g.agent = p.agent), 0)))";

/// The current head of a work context: `(snapshot id, sequence)`, unless retired.
pub async fn head(
    conn: &mut PgConnection,
    work_context: Uuid,
) -> Result<Option<(Uuid, i64)>, sqlx::Error> {
    sqlx::query_as("SELECT head_id, sequence FROM lineage_heads WHERE work_context_id = $1 AND retired_at IS NULL")
        .bind(work_context)
        .fetch_optional(conn)
        .await
}

/// One statement of [`append`], put together at compile time: `$head` (a
/// compare-and-set of the head returning the new sequence, and any further common
/// table expressions) then, if it moved, snapshot `$3` takes its place after
/// predecessor `$2` in context `$1`.
macro_rules! placed {
    ($head:literal $(,)?) => {
        concat!(
            "WITH head AS (",
            $head,
            ")
         UPDATE project_snapshots s SET work_context_id = $1, sequence = head.sequence, predecessor_id = $2
           FROM head WHERE s.id = $3
         RETURNING head.sequence"
        )
    };
}

/// Appends a ready checkpoint as sequence N+1 of its work context. `expected` is the
/// snapshot the captured tree derives from (its predecessor). It must be the head, which
/// then becomes `superseded`; or, when it is not, the head must be one that can no longer
/// be restored (see the module's header), and the lineage starts again from this one.
pub async fn append(
    conn: &mut PgConnection,
    work_context: Uuid,
    agent: &str,
    expected: Option<Uuid>,
    snapshot_id: Uuid,
) -> Result<i64, LineageError> {
    let conflict = |actual: Option<Uuid>| LineageError::Conflict {
        work_context,
        expected,
        actual,
    };
    // Each compare-and-set is one statement, atomic with or without a transaction, and
    // records the snapshot's place (and supersedes the head it replaced) in the same
    // statement: the rows differ, so neither update sees the other's.
    let sequence: Option<i64> = if expected.is_some() {
        sqlx::query_scalar(placed!(
            "UPDATE lineage_heads SET head_id = $3, sequence = sequence + 1, retired_at = NULL, updated_at = now()
              WHERE work_context_id = $1 AND head_id = $2
          RETURNING sequence),
             superseded AS (
                 UPDATE project_snapshots SET retention = 'superseded', retired_at = now()
                  WHERE id = $2 AND retention = 'current' AND EXISTS (SELECT 1 FROM head)",
        ))
        .bind(work_context)
        .bind(expected)
        .bind(snapshot_id)
        .fetch_optional(&mut *conn)
        .await?
    } else {
        sqlx::query_scalar(placed!(
            "INSERT INTO lineage_heads (work_context_id, agent, head_id, sequence) VALUES ($1, $4, $3, 1)
             ON CONFLICT (work_context_id) DO NOTHING RETURNING sequence",
        ))
        .bind(work_context)
        .bind(expected)
        .bind(snapshot_id)
        .bind(agent)
        .fetch_optional(&mut *conn)
        .await?
    };
    if let Some(sequence) = sequence {
        return Ok(sequence);
    }
    // Not derived from the head: it may replace only a head that can no longer be
    // restored, never one this tree lacks while it still can be.
    let replaced: Option<i64> = sqlx::query_scalar(placed!(
        "UPDATE lineage_heads h SET head_id = $3, sequence = h.sequence + 1, retired_at = NULL, updated_at = now()
           FROM project_snapshots s
          WHERE h.work_context_id = $1 AND s.id = h.head_id AND h.head_id IS DISTINCT FROM $2
            AND NOT (h.retired_at IS NULL AND s.status = 'ready' AND s.retention = 'current')
      RETURNING h.sequence",
    ))
    .bind(work_context)
    .bind(expected)
    .bind(snapshot_id)
    .fetch_optional(&mut *conn)
    .await?;
    match replaced {
        Some(sequence) => Ok(sequence),
        None => {
            let actual = head_of(&mut *conn, work_context).await?.map(|h| h.0);
            Err(conflict(actual))
        }
    }
}

/// A snapshot and its predecessors, newest first: the snapshots whose effects a tree at
/// `snapshot` holds.
pub async fn ancestry(conn: &mut PgConnection, snapshot: Uuid) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "WITH RECURSIVE chain (id, predecessor_id, depth) AS (
             SELECT id, predecessor_id, 0 FROM project_snapshots WHERE id = $1
             UNION ALL
             SELECT p.id, p.predecessor_id, c.depth + 1
               FROM project_snapshots p JOIN chain c ON p.id = c.predecessor_id
              WHERE c.depth < 100000)
         SELECT id FROM chain ORDER BY depth",
    )
    .bind(snapshot)
    .fetch_all(conn)
    .await
}

/// The head of a work context whether retired or not, and whether it is restorable.
pub async fn head_of(
    conn: &mut PgConnection,
    work_context: Uuid,
) -> Result<Option<(Uuid, bool)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT h.head_id, h.retired_at IS NULL AND s.status = 'ready' AND s.retention = 'current'
           FROM lineage_heads h JOIN project_snapshots s ON s.id = h.head_id
          WHERE h.work_context_id = $1",
    )
    .bind(work_context)
    .fetch_optional(conn)
    .await
}

/// Retires a work context's lineage (its task is done): the head and its current
/// checkpoints leave reuse; the reaper reclaims them after the retention window.
pub async fn retire(
    conn: &mut PgConnection,
    work_context: Uuid,
    reason: &str,
) -> Result<(), sqlx::Error> {
    // One statement: the two tables are disjoint, so neither update sees the other's.
    sqlx::query(
        "WITH head AS (
             UPDATE lineage_heads SET retired_at = now() WHERE work_context_id = $1 AND retired_at IS NULL
         )
         UPDATE project_snapshots SET retention = 'retired', retired_at = now(), retire_reason = $2
          WHERE work_context_id = $1 AND kind = 'checkpoint' AND retention = 'current'",
    )
    .bind(work_context)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// Retires the idle heads the reaper picked (their contexts, and the snapshots they
/// point at, still unused since `cutoff`); the snapshots retired.
pub async fn retire_idle_heads(
    conn: &mut PgConnection,
    contexts: &[Uuid],
    heads: &[Uuid],
    now: DateTime<Utc>,
    cutoff: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    sqlx::query(
        "UPDATE lineage_heads SET retired_at = $2 WHERE work_context_id = ANY($1) AND retired_at IS NULL",
    )
    .bind(contexts)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    let done = sqlx::query(
        "UPDATE project_snapshots SET retention = 'retired', retired_at = $2, retire_reason = 'idle'
          WHERE id = ANY($1) AND retention = 'current' AND last_used_at <= $3",
    )
    .bind(heads)
    .bind(now)
    .bind(cutoff)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// A ready snapshot that may be restored: its row, if usable.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Restorable {
    pub id: Uuid,
    pub store_url: String,
    pub work_context_id: Option<Uuid>,
    pub credential_generation: i64,
    pub created_at: DateTime<Utc>,
    /// The manifest key its record names (an empty tree's is not stored).
    pub manifest_key: Option<String>,
}

/// What acquiring a task's tree needs to know of its lineage, read in one statement.
#[derive(Debug, Clone)]
pub struct Survey {
    /// The agent's current credential generation (0 until the first rotation).
    pub generation: i64,
    /// The head, whether retired or not, and whether it is restorable.
    pub head: Option<(Uuid, bool)>,
    /// The head checkpoint of exactly this work context, if it is ready and was taken
    /// under the agent's current credential generation. Never another context's.
    pub restorable: Option<Restorable>,
    /// The newest still-held live tree of the task in the directory asked about, under
    /// the current generation: none when no directory was asked about.
    pub held: Option<HeldTree>,
}

/// A task's live tree that a hold still keeps: its workspace row, path, the hold, and the
/// snapshot it is at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldTree {
    pub workspace_id: Uuid,
    pub path: String,
    pub hold_id: Uuid,
    pub snapshot_id: Option<Uuid>,
}

/// Reads a task's [`Survey`], with no held tree.
pub async fn survey(
    conn: &mut PgConnection,
    work_context: Uuid,
    agent: &str,
) -> Result<Survey, sqlx::Error> {
    survey_in(conn, work_context, agent, None).await
}

/// Reads a task's [`Survey`] and its held tree in `directory` (a worker's workspaces
/// directory), in one statement: the tree must be under the generation the same
/// statement reads.
pub async fn survey_in(
    conn: &mut PgConnection,
    work_context: Uuid,
    agent: &str,
    directory: Option<Uuid>,
) -> Result<Survey, sqlx::Error> {
    let row = sqlx::query(
        "SELECT COALESCE(g.generation, 0), h.head_id,
                h.retired_at IS NULL AND s.status = 'ready' AND s.retention = 'current',
                h.retired_at IS NULL AND s.work_context_id = $1 AND s.agent = $2
                  AND s.kind = 'checkpoint' AND s.status = 'ready' AND s.retention = 'current'
                  AND s.credential_generation >= COALESCE(g.generation, 0),
                s.store_url, s.work_context_id, s.credential_generation, s.created_at,
                s.manifest_key, t.id, t.path, t.hold_id, t.snapshot_id
           FROM (SELECT 1) one
           LEFT JOIN credential_generations g ON g.agent = $2
           LEFT JOIN (lineage_heads h JOIN project_snapshots s ON s.id = h.head_id)
                  ON h.work_context_id = $1
           LEFT JOIN LATERAL (
                SELECT w.id, w.path, d.id AS hold_id, w.snapshot_id
                  FROM workspaces w JOIN holds d ON d.workspace_id = w.id
                 WHERE w.work_context_id = $1 AND w.agent = $2 AND w.directory_id = $3
                   AND w.state IN ('running', 'stopped', 'paused')
                   AND w.credential_generation = COALESCE(g.generation, 0)
                   AND d.ended_at IS NULL AND d.expires_at > now()
                 ORDER BY w.updated_at DESC LIMIT 1) t ON TRUE",
    )
    .bind(work_context)
    .bind(agent)
    .bind(directory)
    .fetch_one(conn)
    .await?;
    // Thirteen columns: more than sqlx decodes into one tuple.
    let generation: i64 = row.try_get(0)?;
    let head_id: Option<Uuid> = row.try_get(1)?;
    let (usable, restorable): (Option<bool>, Option<bool>) = (row.try_get(2)?, row.try_get(3)?);
    let store_url: Option<String> = row.try_get(4)?;
    let (context, taken_under): (Option<Uuid>, Option<i64>) = (row.try_get(5)?, row.try_get(6)?);
    let created_at: Option<DateTime<Utc>> = row.try_get(7)?;
    let manifest_key: Option<String> = row.try_get(8)?;
    let tree: (Option<Uuid>, Option<String>, Option<Uuid>, Option<Uuid>) = (
        row.try_get(9)?,
        row.try_get(10)?,
        row.try_get(11)?,
        row.try_get(12)?,
    );
    let head = head_id.map(|id| (id, usable.unwrap_or(false)));
    let restorable = match (head_id, restorable, store_url, taken_under, created_at) {
        (Some(id), Some(true), Some(store_url), Some(credential_generation), Some(created_at)) => {
            Some(Restorable {
                id,
                store_url,
                work_context_id: context,
                credential_generation,
                created_at,
                manifest_key,
            })
        }
        _ => None,
    };
    let held = match tree {
        (Some(workspace_id), Some(path), Some(hold_id), snapshot_id) => Some(HeldTree {
            workspace_id,
            path,
            hold_id,
            snapshot_id,
        }),
        _ => None,
    };
    Ok(Survey {
        generation,
        head,
        restorable,
        held,
    })
}

/// The eligible clean baseline for a key.
pub async fn restorable_baseline(
    conn: &mut PgConnection,
    agent: &str,
    repository: &str,
    backend: &str,
    base_image: Option<&str>,
    canonical_ref: &str,
) -> Result<Option<Restorable>, sqlx::Error> {
    sqlx::query_as(
        "SELECT s.id, s.store_url, s.work_context_id, s.credential_generation, s.created_at,
                s.manifest_key
           FROM project_snapshots s LEFT JOIN credential_generations g ON g.agent = s.agent
          WHERE s.kind = 'baseline' AND s.status = 'ready' AND s.retention = 'current'
            AND s.agent = $1 AND s.repository = $2 AND s.backend = $3
            AND s.base_image IS NOT DISTINCT FROM $4 AND s.canonical_ref = $5
            AND s.credential_generation >= COALESCE(g.generation, 0)
          ORDER BY s.created_at DESC LIMIT 1",
    )
    .bind(agent)
    .bind(repository)
    .bind(backend)
    .bind(base_image)
    .bind(canonical_ref)
    .fetch_optional(conn)
    .await
}

/// Records one acquisition attempt.
pub async fn record_restore(
    conn: &mut PgConnection,
    request_id: Option<Uuid>,
    workspace_id: Option<Uuid>,
    tier: Tier,
    snapshot_id: Option<Uuid>,
    outcome: RestoreOutcome,
    reason: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO snapshot_restores (id, request_id, workspace_id, tier, snapshot_id, outcome, reason)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(Uuid::new_v4())
    .bind(request_id)
    .bind(workspace_id)
    .bind(tier)
    .bind(snapshot_id)
    .bind(outcome)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}
