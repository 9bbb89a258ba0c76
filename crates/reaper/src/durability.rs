//! Off-host durability: a sandbox's snapshot counts as `replicated` once a process on a
//! node other than its writer's has read it back from its store: its manifest read and
//! decoded, every pack it names there. Until then its bytes may be on one host only.
//! What this shows is that the snapshot is reachable, whole, from another node; a store
//! that itself keeps its bytes on the writer's host (a MinIO beside it) is not told
//! apart.
//!
//! Nodes are known only by name (`CAIRN_NODE_NAME`, which the chart sets from the
//! pod's node): without one, a worker records no node and the reaper reads nothing
//! back, so nothing is called off-host on a guess. The reaper reads back what other
//! nodes wrote, newest first; one that could not be read is tried again an hour later.

use cairn_common::lineage;
use cairn_snapshot::store::ArtifactStore;
use cairn_snapshot::{load_recorded, pack_key};
use sqlx::PgPool;
use std::collections::HashSet;
use uuid::Uuid;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    pub verified: u64,
    /// Not read back whole (an object missing, a store that did not answer): left
    /// unverified, tried again an hour later.
    pub failed: u64,
}

/// Reads back at most `batch` unverified sandbox snapshots that another node wrote.
pub async fn verify(pool: &PgPool, node: &str, batch: i64) -> Result<Verified, sqlx::Error> {
    let due: Vec<(Uuid, String, Option<String>)> = sqlx::query_as(
        "SELECT id, store_url, manifest_key FROM project_snapshots
          WHERE verified_at IS NULL AND status = 'ready' AND sandbox_id IS NOT NULL
            AND retention = 'current' AND writer_node IS NOT NULL AND writer_node <> $1
            AND (verify_failed_at IS NULL OR verify_failed_at < now() - interval '1 hour')
          ORDER BY created_at DESC LIMIT $2",
    )
    .bind(node)
    .bind(batch)
    .fetch_all(pool)
    .await?;
    let mut done = Verified::default();
    let mut first_failure = None;
    for (id, store_url, recorded) in due {
        let packs: Vec<Uuid> =
            sqlx::query_scalar("SELECT pack_id FROM snapshot_packs WHERE snapshot_id = $1")
                .bind(id)
                .fetch_all(pool)
                .await?;
        let mut conn = pool.acquire().await?;
        match read_back(&store_url, (id, recorded.as_deref()), &packs).await {
            Ok(()) => {
                lineage::verified(&mut conn, id, node).await?;
                done.verified += 1;
            }
            Err(why) => {
                lineage::verify_failed(&mut conn, id).await?;
                first_failure.get_or_insert((id, why));
                done.failed += 1;
            }
        }
    }
    if let Some((id, why)) = first_failure {
        tracing::warn!(failed = done.failed, first = %id.simple(), reason = %why, "snapshots could not be read back from their stores; they stay local_only, tried again in an hour");
    }
    Ok(done)
}

/// Whether the store holds the snapshot's manifest (decoded, naming exactly the packs
/// recorded for it; an empty tree's names none and is not stored) and every one of
/// those packs.
async fn read_back(
    store_url: &str,
    (id, recorded): (Uuid, Option<&str>),
    packs: &[Uuid],
) -> Result<(), String> {
    let store = ArtifactStore::open_existing(store_url).map_err(|e| e.to_string())?;
    let manifest = load_recorded(&store, id, recorded);
    let manifest = manifest.await.map_err(|e| e.to_string())?;
    let named: HashSet<Uuid> = manifest.packs.iter().copied().collect();
    if named != packs.iter().copied().collect::<HashSet<_>>() {
        return Err("its manifest names other packs than its record".into());
    }
    for pack in packs {
        let key = pack_key(*pack);
        match store.exists(&key).await {
            Ok(true) => {}
            Ok(false) => return Err(format!("{key} is not in {store_url}")),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}
