//! Retention of step output: the live output of a request that finished (completed,
//! failed or cancelled) is deleted from the artifact stores it went to `reclaim_after`
//! after it finished, the same 7 days as snapshots. A request is marked reclaimed only
//! once every store holding its output answered; one that did not is tried again at
//! the next sweep. A dry run counts and deletes nothing.

use crate::retention::{Batches, Sweep, SweepReport};
use cairn_snapshot::store::ArtifactStore;
use uuid::Uuid;

impl Sweep<'_> {
    pub(crate) async fn reclaim_outputs(
        &self,
        batches: &mut Batches<'_>,
        report: &mut SweepReport,
    ) -> Result<(), sqlx::Error> {
        // Requests whose stores failed this sweep are not picked again in it.
        let mut failed: Vec<Uuid> = Vec::new();
        loop {
            let mut tx = batches.begin().await?;
            let due: Vec<(Uuid, Vec<String>)> = sqlx::query_as(
                "SELECT e.id, array_agg(DISTINCT i.output_store_url)
                   FROM execution_requests e JOIN journal_intents i ON i.request_id = e.id
                  WHERE e.id IN (SELECT x.id FROM execution_requests x
                                  WHERE x.state IN ('completed', 'failed', 'cancelled')
                                    AND x.finished_at <= $1 AND x.output_reclaimed_at IS NULL
                                    AND x.id <> ALL($3)
                                    AND EXISTS (SELECT 1 FROM journal_intents j
                                                 WHERE j.request_id = x.id AND j.output_store_url IS NOT NULL)
                                  LIMIT $2 FOR UPDATE OF x SKIP LOCKED)
                    AND i.output_store_url IS NOT NULL
                  GROUP BY e.id",
            )
            .bind(self.now - self.durations.reclaim_after)
            .bind(self.batch)
            .bind(&failed)
            .fetch_all(&mut *tx)
            .await?;
            let mut reclaimed = Vec::new();
            for (request_id, stores) in &due {
                if self.dry_run || delete_everywhere(*request_id, stores).await {
                    reclaimed.push(*request_id);
                } else {
                    failed.push(*request_id);
                }
            }
            sqlx::query(
                "UPDATE execution_requests SET output_reclaimed_at = $2 WHERE id = ANY($1)",
            )
            .bind(&reclaimed)
            .bind(self.now)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            report.outputs_reclaimed += reclaimed.len() as u64;
            report.outputs_failed = failed.len() as u64;
            if (due.len() as i64) < self.batch {
                return Ok(());
            }
        }
    }
}

/// Deletes the request's output in each store; whether every one answered.
async fn delete_everywhere(request_id: Uuid, stores: &[String]) -> bool {
    let prefix = format!("outputs/{}/", request_id.simple());
    let mut all = true;
    for url in stores {
        let deleted = match ArtifactStore::open_existing(url) {
            Ok(store) => store.delete_prefix(&prefix).await,
            Err(e) => Err(e),
        };
        if let Err(e) = deleted {
            tracing::warn!(error = %e, store = %url, request_id = %request_id.simple(), "step output not reclaimed; retried at the next sweep");
            all = false;
        }
    }
    all
}
