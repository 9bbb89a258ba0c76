//! Off-host durability: a sandbox's snapshot counts as `replicated` once a process on a
//! node other than its writer's has read it back from its store (its manifest and every
//! pack it names). Until then its bytes may be on one host only, whatever its store's
//! URL says: an `s3://` store served from the writer's own host is not off-host, and a
//! directory on a shared volume is.
//!
//! The reaper reads back what other nodes wrote, newest first; a snapshot its own node
//! wrote, it leaves for a reaper elsewhere (or for ever `local_only`, which is true).

use cairn_common::lineage;
use cairn_snapshot::store::ArtifactStore;
use cairn_snapshot::{manifest_key, pack_key};
use sqlx::PgPool;
use uuid::Uuid;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    pub verified: u64,
    /// Read back incompletely (an object missing, or a store that did not answer):
    /// left unverified, tried again next sweep.
    pub failed: u64,
}

/// Reads back at most `batch` unverified sandbox snapshots that another node wrote.
pub async fn verify(pool: &PgPool, node: &str, batch: i64) -> Result<Verified, sqlx::Error> {
    let due: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT id, store_url FROM project_snapshots
          WHERE verified_at IS NULL AND status = 'ready' AND sandbox_id IS NOT NULL
            AND retention = 'current' AND writer_node IS NOT NULL AND writer_node <> $1
          ORDER BY created_at DESC LIMIT $2",
    )
    .bind(node)
    .bind(batch)
    .fetch_all(pool)
    .await?;
    let mut done = Verified::default();
    for (id, store_url) in due {
        let packs: Vec<Uuid> =
            sqlx::query_scalar("SELECT pack_id FROM snapshot_packs WHERE snapshot_id = $1")
                .bind(id)
                .fetch_all(pool)
                .await?;
        match read_back(&store_url, id, &packs).await {
            Ok(()) => {
                lineage::verified(&mut *pool.acquire().await?, id, node).await?;
                done.verified += 1;
            }
            Err(why) => {
                tracing::warn!(snapshot_id = %id.simple(), reason = %why, "a snapshot could not be read back; it stays local_only");
                done.failed += 1;
            }
        }
    }
    Ok(done)
}

/// Whether the store holds the snapshot's manifest and every pack it names.
async fn read_back(store_url: &str, id: Uuid, packs: &[Uuid]) -> Result<(), String> {
    let store = ArtifactStore::open_existing(store_url).map_err(|e| e.to_string())?;
    let keys = std::iter::once(manifest_key(id)).chain(packs.iter().map(|p| pack_key(*p)));
    for key in keys {
        match store.exists(&key).await {
            Ok(true) => {}
            Ok(false) => return Err(format!("{key} is not in {store_url}")),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}
