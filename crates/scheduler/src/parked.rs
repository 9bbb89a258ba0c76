//! Deliveries parked on a worker that does not take them. RabbitMQ pushes deliveries
//! ahead to each consumer; a worker that stalls (SIGSTOP, a frozen node) keeps them
//! until the broker drops its connection. When a request stays queued long after its
//! announcement while a live worker has waited for work all that time, the lease
//! sweeper announces it again (see `heartbeat::parked_sql`). The duplicate is harmless:
//! whichever delivery comes second finds the request claimed, and is dropped.

use cairn_common::heartbeat;
use cairn_common::outbox;
use cairn_common::request::action::ActionKind;
use cairn_common::request::requeue;
use sqlx::PgPool;
use uuid::Uuid;

type Parked = (
    Uuid,
    Uuid,
    i32,
    Option<Uuid>,
    Option<ActionKind>,
    Option<Uuid>,
    String,
);

/// Announces again, in one transaction, up to `batch` queued requests whose delivery is
/// parked; returns how many.
pub async fn announce_again(pool: &PgPool, batch: i64) -> Result<u64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let parked: Vec<Parked> = sqlx::query_as(&format!(
        "SELECT e.id, e.run_id, e.attempt, q.id, q.kind,
                (SELECT v.id FROM verification_adoptions v
                  WHERE v.execution_request_id = e.id AND v.status = 'queued'
                  ORDER BY v.created_at DESC LIMIT 1), e.kind
           FROM execution_requests e
           LEFT JOIN LATERAL (SELECT a.id, a.kind FROM continuation_actions a
                               WHERE a.request_id = e.id AND a.status = 'queued'
                               ORDER BY a.created_at DESC LIMIT 1) q ON TRUE
          WHERE {parked}
          ORDER BY e.updated_at
          LIMIT $1
            FOR UPDATE OF e SKIP LOCKED",
        parked = heartbeat::parked_sql("$2"),
    ))
    .bind(batch)
    .bind(i64::try_from(heartbeat::PARKED_AFTER.as_millis()).unwrap_or(i64::MAX))
    .fetch_all(&mut *tx)
    .await?;
    for (request_id, run_id, attempt, action_id, action_kind, verification, kind) in &parked {
        let action = action_id.zip(*action_kind);
        let mut message =
            requeue::queued_message(*run_id, *request_id, *attempt, action, *verification);
        if action.is_none() && verification.is_none() {
            // A request that runs by itself: a run's, or a publication's.
            message.kind = cairn_common::request::job_kind_of(kind);
        }
        outbox::announce(&mut tx, &message).await?;
        // The announcement's time: the next one waits for fresh evidence.
        cairn_common::request::marks::announced_again(&mut tx, *request_id).await?;
        tracing::info!(request_id = %request_id.simple(), "the request's delivery is parked on a worker that does not take it; announced again");
    }
    tx.commit().await?;
    Ok(parked.len() as u64)
}
