//! Stopping a request at its last checkpoint.

use super::fence::fence_out;
use super::state::transition;
use super::table::{Error, RequestEvent};
use crate::journal;
use sqlx::PgConnection;
use uuid::Uuid;

/// Stops a request at its last checkpoint: the journal as it stands is retained
/// (digest, next sequence, and the digest of the tree a continuation would go on from:
/// the work context's head, which the request's own captures wrote; and the source
/// profile it was retained under), the lease is fenced out, and only a reviewed
/// checkpoint continuation can take it further.
pub async fn stop_at_checkpoint(
    conn: &mut PgConnection,
    request_id: Uuid,
    reason: &str,
) -> Result<(), Error> {
    let digest = journal::digest(&mut *conn, request_id).await?;
    fence_out(&mut *conn, request_id).await?;
    sqlx::query(&format!(
        "UPDATE execution_requests
            SET checkpoint = jsonb_build_object(
                    'sequence', COALESCE((checkpoint->>'sequence')::bigint, 0) + 1,
                    'journal_digest', $2::text,
                    'source_digest', {source},
                    'receipts', (SELECT count(*) FROM journal_receipts WHERE request_id = $1),
                    'stopped_at', now(),
                    'implementation_profile', $4::text)
          WHERE id = $1",
        source = crate::lineage::current_tree_sql(
            "(SELECT work_context_id FROM runs WHERE id = execution_requests.run_id)",
            "$3"
        ),
    ))
    .bind(request_id)
    .bind(digest)
    .bind(crate::lineage::empty_tree_digest())
    .bind(crate::qualification::current())
    .execute(&mut *conn)
    .await?;
    let event = RequestEvent::StopAtCheckpoint;
    transition(&mut *conn, request_id, event, Some(reason), None).await?;
    Ok(())
}
