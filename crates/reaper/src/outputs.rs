//! Retention of live output: that of a request that finished (completed, failed or
//! cancelled) is deleted from the artifact stores it went to `reclaim_after` after it
//! finished, the same 7 days as snapshots; that of a sandbox's exec, `reclaim_after`
//! after the exec ended. A request is marked reclaimed only
//! once every store holding its output answered; one that did not is tried again at
//! the next sweep. A dry run counts and deletes nothing.

use crate::retention::{Batches, Sweep, SweepReport};
use cairn_snapshot::store::ArtifactStore;
use uuid::Uuid;

/// Whose live output a pass reclaims: finished requests' steps, or ended execs.
#[derive(Clone, Copy)]
enum Owners {
    Requests,
    Execs,
}

impl Owners {
    /// `(id, store URL, store identity)` of the outputs due (`$1` the cutoff, `$2` the
    /// batch, `$3` the ids that failed this sweep), each owner's rows locked; a request
    /// has a row per store its steps wrote to.
    fn due(self) -> &'static str {
        match self {
            Owners::Requests => {
                "SELECT DISTINCT e.id, i.output_store_url, i.output_store
                   FROM execution_requests e JOIN journal_intents i ON i.request_id = e.id
                  WHERE e.id IN (SELECT x.id FROM execution_requests x
                                  WHERE x.state IN ('completed', 'failed', 'cancelled')
                                    AND x.finished_at <= $1 AND x.output_reclaimed_at IS NULL
                                    AND x.id <> ALL($3)
                                    AND EXISTS (SELECT 1 FROM journal_intents j
                                                 WHERE j.request_id = x.id AND j.output_store_url IS NOT NULL)
                                  LIMIT $2 FOR UPDATE OF x SKIP LOCKED)
                    AND i.output_store_url IS NOT NULL AND i.output_store IS NOT NULL"
            }
            Owners::Execs => {
                "SELECT id, output_store_url, output_store FROM sandbox_operations
                  WHERE output_store_url IS NOT NULL AND output_store IS NOT NULL
                    AND output_reclaimed_at IS NULL AND finished_at <= $1 AND id <> ALL($3)
                  LIMIT $2 FOR UPDATE SKIP LOCKED"
            }
        }
    }

    /// Marks the owners' output deleted, through each table's owner.
    async fn mark(
        self,
        conn: &mut sqlx::PgConnection,
        ids: &[Uuid],
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), sqlx::Error> {
        match self {
            Owners::Requests => {
                cairn_common::request::marks::outputs_reclaimed(conn, ids, at).await
            }
            Owners::Execs => {
                cairn_common::sandbox::operations::outputs_reclaimed(conn, ids, at).await
            }
        }
    }
}

impl Sweep<'_> {
    /// Deletes the live output of requests and of execs that ended `reclaim_after` ago.
    pub(crate) async fn reclaim_outputs(
        &self,
        batches: &mut Batches<'_>,
        report: &mut SweepReport,
    ) -> Result<(), sqlx::Error> {
        self.reclaim_outputs_of(Owners::Requests, batches, report)
            .await?;
        self.reclaim_outputs_of(Owners::Execs, batches, report)
            .await
    }

    /// One kind of owner's due outputs, batch by batch; an owner whose store did not
    /// answer is tried again at the next sweep, not in this one.
    async fn reclaim_outputs_of(
        &self,
        owners: Owners,
        batches: &mut Batches<'_>,
        report: &mut SweepReport,
    ) -> Result<(), sqlx::Error> {
        let mut failed: Vec<Uuid> = Vec::new();
        loop {
            let mut tx = batches.begin().await?;
            let rows: Vec<(Uuid, String, Uuid)> = sqlx::query_as(owners.due())
                .bind(self.now - self.durations.reclaim_after)
                .bind(self.batch)
                .bind(&failed)
                .fetch_all(&mut *tx)
                .await?;
            let mut due: Vec<(Uuid, Vec<(String, Uuid)>)> = Vec::new();
            for (id, url, store) in rows {
                match due.iter_mut().find(|(owner, _)| *owner == id) {
                    Some((_, stores)) => stores.push((url, store)),
                    None => due.push((id, vec![(url, store)])),
                }
            }
            let mut reclaimed = Vec::new();
            let (mut first_error, mut failures) = (None, 0u64);
            for (id, stores) in &due {
                if self.dry_run {
                    reclaimed.push(*id);
                    continue;
                }
                match delete_everywhere(*id, stores).await {
                    Ok(()) => reclaimed.push(*id),
                    Err(e) => {
                        first_error.get_or_insert(e);
                        failures += 1;
                        failed.push(*id);
                    }
                }
            }
            // One line per batch: with stores this reaper never reaches (each worker's
            // own directory), a line per owner would drown the log.
            if let Some(error) = first_error {
                tracing::warn!(failed = failures, first = %error, "live output not reclaimed; retried at the next sweep");
            }
            owners.mark(&mut tx, &reclaimed, self.now).await?;
            tx.commit().await?;
            report.outputs_reclaimed += reclaimed.len() as u64;
            report.outputs_failed += failures;
            if (due.len() as i64) < self.batch {
                return Ok(());
            }
        }
    }
}

/// Deletes the request's (or exec's) output in each store, found at its URL with its identity. A
/// URL that reaches another store here (a worker's local directory) deletes nothing
/// and is an error, never done.
async fn delete_everywhere(request_id: Uuid, stores: &[(String, Uuid)]) -> Result<(), String> {
    let prefix = cairn_common::output::live_request_prefix(request_id);
    for (url, identity) in stores {
        let deleted = match ArtifactStore::open_existing(url) {
            Ok(store) => match store.existing_identity().await {
                Ok(found) if found == *identity => store
                    .delete_prefix(&prefix)
                    .await
                    .map_err(|e| e.to_string()),
                Ok(found) => Err(format!("another store answers there ({})", found.simple())),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        deleted.map_err(|e| format!("{url}: {e}"))?;
    }
    Ok(())
}
