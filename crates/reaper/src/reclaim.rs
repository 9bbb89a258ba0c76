//! Rules 2, 6 and 7: the bytes of retired, superseded, failed and quarantined snapshots
//! are deleted once their window has passed, through the store each snapshot records.
//!
//! A store is known by its identity (the `store-id` object inside it, recorded on each
//! snapshot as `store_id`), never by the spelling of its URL: one store mounted at two
//! paths, or named by two URLs, is one store. Each store is reclaimed on its own, in
//! batches of its own transactions, so one hung store delays no other; each batch holds
//! that store's lock only while it deletes that batch, and captures never wait for it.
//! A pack goes only when no live snapshot anywhere references it (pack ids are random,
//! so no other store can name the same pack), and not while a capture of that store is
//! in progress. What cannot be deleted waits for repair, retried with backoff.

use crate::retention::{Batches, Sweep, SweepReport};
use cairn_common::lineage::retention;
use cairn_snapshot as snapshot;
use cairn_snapshot::store::ArtifactStore;
use chrono::{DateTime, Duration, Utc};
use sqlx::PgConnection;
use std::collections::HashSet;
use uuid::Uuid;

/// The snapshots whose bytes are due, in SQL (`$1` the reclaim cutoff, `$2` now, `$3` the
/// quarantine cutoff). A quarantined snapshot counts from its quarantine, for its own
/// period; a snapshot in a capture or a restore is never due.
const DUE: &str = "status <> 'deleted'
    AND (status = 'quarantined' AND COALESCE(quarantined_at, created_at) <= $3
         OR status <> 'quarantined'
            AND (retention IN ('retired', 'superseded') OR status = 'failed')
            AND (COALESCE(retired_at, created_at) <= $1
                 OR retire_reason IN ('workspace_destroyed', 'memory_expired'))
            AND status NOT IN ('creating', 'uploading', 'restoring')
         OR retention = 'pending_operator_repair' AND next_repair_at <= $2)";

/// A store's key: its identity, or the URL of rows written before identities.
const STORE_KEY: &str = "COALESCE(store_id::text, store_url)";

impl Sweep<'_> {
    pub(crate) async fn reclaim(
        &self,
        batches: &mut Batches<'_>,
        report: &mut SweepReport,
    ) -> Result<(), sqlx::Error> {
        let stores: Vec<String> = {
            let mut tx = batches.begin().await?;
            let (reclaim, now, quarantine) = self.cutoffs();
            let stores = sqlx::query_scalar(&format!(
                "SELECT DISTINCT {STORE_KEY} FROM project_snapshots WHERE {DUE}"
            ))
            .bind(reclaim)
            .bind(now)
            .bind(quarantine)
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            stores
        };
        match batches {
            // One transaction at a time: the stores one after another.
            Batches::Dry(_) => {
                for store in &stores {
                    self.reclaim_store(batches, store, report).await?;
                }
            }
            Batches::Pool(pool) => {
                let pool = *pool;
                let each = stores.iter().map(|store| async move {
                    let mut report = SweepReport::default();
                    let done = self
                        .reclaim_store(&mut Batches::Pool(pool), store, &mut report)
                        .await;
                    (done, report)
                });
                for (done, one) in futures::future::join_all(each).await {
                    report.add(&one);
                    done?;
                }
            }
        }
        Ok(())
    }

    /// The reclaim cutoff, now, and the quarantine cutoff: `$1`–`$3` of [`DUE`].
    fn cutoffs(&self) -> (DateTime<Utc>, DateTime<Utc>, DateTime<Utc>) {
        (
            self.now - self.durations.reclaim_after,
            self.now,
            self.now - self.durations.quarantine_kept,
        )
    }

    /// Reclaims one store's due snapshots, a batch per transaction, until a batch finds
    /// less than a full batch or makes no progress.
    async fn reclaim_store(
        &self,
        batches: &mut Batches<'_>,
        store: &str,
        report: &mut SweepReport,
    ) -> Result<(), sqlx::Error> {
        loop {
            let mut tx = batches.begin().await?;
            let (found, progressed) = self.reclaim_batch(&mut tx, store, report).await?;
            tx.commit().await?;
            if found < self.batch || !progressed {
                return Ok(());
            }
        }
    }

    async fn reclaim_batch(
        &self,
        conn: &mut PgConnection,
        store: &str,
        report: &mut SweepReport,
    ) -> Result<(i64, bool), sqlx::Error> {
        // Captures of this store never wait for this lock (they try it, and retry); a
        // dry run deletes nothing, so it takes no lock at all.
        if !self.dry_run {
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                .bind(store)
                .execute(&mut *conn)
                .await?;
        }
        let (reclaim, now, quarantine) = self.cutoffs();
        let due: Vec<(Uuid, String, i32)> = sqlx::query_as(&format!(
            "SELECT id, store_url, repair_attempts FROM project_snapshots
              WHERE {STORE_KEY} = $4 AND {DUE}
              LIMIT $5 FOR UPDATE SKIP LOCKED"
        ))
        .bind(reclaim)
        .bind(now)
        .bind(quarantine)
        .bind(store)
        .bind(self.batch)
        .fetch_all(&mut *conn)
        .await?;
        let found = due.len() as i64;
        if due.is_empty() {
            return Ok((0, false));
        }
        let ids: Vec<Uuid> = due.iter().map(|d| d.0).collect();
        let capturing: bool = sqlx::query_scalar(&format!(
            "SELECT EXISTS (SELECT 1 FROM project_snapshots
                             WHERE {STORE_KEY} = $1 AND status IN ('creating', 'uploading'))"
        ))
        .bind(store)
        .fetch_one(&mut *conn)
        .await?;
        if capturing {
            report.reclaim_deferred += ids.len() as u64;
            return Ok((found, false));
        }
        let packs: Vec<Uuid> = orphans(&mut *conn, "snapshot_packs", "pack_id", &ids).await?;
        let chunks: Vec<String> = orphans(&mut *conn, "snapshot_chunks", "chunk_id", &ids).await?;
        // Any URL of the store reaches its bytes; the one recorded on the first row.
        let url = &due[0].1;
        let deleted = if self.dry_run {
            // What it would free, read without changing the store.
            measure(url, &ids, &packs, &chunks).await
        } else {
            delete_objects(url, &ids, &packs, &chunks).await
        };
        match deleted {
            Ok(bytes) => {
                report.snapshots_reclaimed += retention::reclaimed(&mut *conn, &ids).await?;
                report.bytes_reclaimed += bytes;
            }
            Err(reason) => {
                tracing::warn!(store = url, %reason, count = ids.len(), "cannot reclaim; pending operator repair");
                for (id, _, attempts) in &due {
                    let minutes = 1i64 << (*attempts).clamp(0, 20);
                    let wait = Duration::minutes(minutes).min(self.durations.repair_backoff_max);
                    retention::pending_repair(&mut *conn, *id, &reason, self.now + wait).await?;
                }
                report.reclaim_failed += ids.len() as u64;
            }
        }
        Ok((found, true))
    }
}

/// The keys of what reclaiming `snapshots` deletes: their manifests, then for each
/// orphan pack its index before the pack (so no capture finds a chunk in a pack that is
/// gone), and the first format's orphan chunk objects.
fn keys(snapshots: &[Uuid], packs: &[Uuid], legacy_chunks: &[String]) -> Vec<String> {
    let mut keys: Vec<String> = snapshots
        .iter()
        .flat_map(|id| {
            [
                snapshot::manifest_key(*id),
                snapshot::legacy_manifest_key(*id),
            ]
        })
        .collect();
    keys.extend(
        packs
            .iter()
            .flat_map(|p| [snapshot::index_key(*p), snapshot::pack_key(*p)]),
    );
    keys.extend(legacy_chunks.iter().map(|c| snapshot::legacy_chunk_key(c)));
    keys
}

/// The bytes the objects would free.
async fn measure(
    store_url: &str,
    snapshots: &[Uuid],
    packs: &[Uuid],
    legacy_chunks: &[String],
) -> Result<u64, String> {
    // Never create a missing local store: an empty directory would look "deleted".
    let store = ArtifactStore::open_existing(store_url).map_err(|e| e.to_string())?;
    let mut bytes = 0;
    for key in keys(snapshots, packs, legacy_chunks) {
        bytes += store
            .size(&key)
            .await
            .map_err(|e| e.to_string())?
            .unwrap_or(0);
    }
    Ok(bytes)
}

/// Deletes manifests and orphan packs through the store the snapshots name (never the
/// current configuration), the indexes in one bulk delete before the packs in another.
/// Returns the bytes freed.
async fn delete_objects(
    store_url: &str,
    snapshots: &[Uuid],
    packs: &[Uuid],
    legacy_chunks: &[String],
) -> Result<u64, String> {
    let bytes = measure(store_url, snapshots, packs, legacy_chunks).await?;
    let store = ArtifactStore::open_existing(store_url).map_err(|e| e.to_string())?;
    let indexes: HashSet<String> = packs.iter().map(|p| snapshot::index_key(*p)).collect();
    let rest: Vec<String> = keys(snapshots, packs, legacy_chunks)
        .into_iter()
        .filter(|k| !indexes.contains(k))
        .collect();
    let indexes: Vec<String> = indexes.into_iter().collect();
    store
        .delete_many(&indexes)
        .await
        .map_err(|e| e.to_string())?;
    store.delete_many(&rest).await.map_err(|e| e.to_string())?;
    Ok(bytes)
}

/// The objects (`column` of `table`) the snapshots `ids` reference that no other live
/// snapshot references, in any store: an object id is unique across stores, and a
/// reference from a row whose store URL is spelled differently must still keep it.
async fn orphans<T>(
    conn: &mut PgConnection,
    table: &str,
    column: &str,
    ids: &[Uuid],
) -> Result<Vec<T>, sqlx::Error>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar(&format!(
        "SELECT DISTINCT c.{column} FROM {table} c
          WHERE c.snapshot_id = ANY($1)
            AND NOT EXISTS (SELECT 1 FROM {table} o JOIN project_snapshots p ON p.id = o.snapshot_id
                             WHERE o.{column} = c.{column} AND NOT (o.snapshot_id = ANY($1))
                               AND p.status <> 'deleted')"
    ))
    .bind(ids)
    .fetch_all(conn)
    .await
}
