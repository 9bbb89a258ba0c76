//! Sandboxes whose owner's lease lapsed (its worker died, stalled or was cut off).
//!
//! - `running` or `paused`: stopped at its last durable tree (`stop_reason:
//!   worker_lost`); the operation it was running has an unknown outcome. Resume then
//!   restores it on any worker.
//! - `creating` (or a `stopped` one being resumed): placed again, up to
//!   [`PLACEMENTS`] times; then a `creating` one ends in `error`.
//! - A fork still waiting for the worker that staged its source's tree, past
//!   `record::STAGED_WAIT_MS`: announced to every worker.
//!
//! Every change moves the lease epoch on, so a stalled former owner writes nothing.

use cairn_common::sandbox::{ask, record};
use cairn_common::sandbox::{SandboxEvent, SandboxState};
use sqlx::PgPool;
use uuid::Uuid;

/// How many times a sandbox is placed before its creation fails.
pub const PLACEMENTS: i32 = 3;

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SandboxSweep {
    pub stopped: u64,
    pub placed_again: u64,
    pub failed: u64,
}

/// Sweeps one batch of lapsed sandbox leases, each in its own savepoint.
pub async fn sweep(pool: &PgPool, batch: i64) -> Result<SandboxSweep, sqlx::Error> {
    let mut report = SandboxSweep::default();
    let mut tx = pool.begin().await?;
    let lapsed: Vec<(Uuid, SandboxState, i32)> = sqlx::query_as(
        "SELECT id, state, placement_attempt FROM sandboxes
          WHERE lease_owner IS NOT NULL AND lease_deadline < clock_timestamp()
          ORDER BY lease_deadline LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    for (id, state, attempt) in lapsed {
        let mut savepoint = sqlx::Connection::begin(&mut *tx).await?;
        record::fence_out(&mut savepoint, id).await?;
        match state {
            SandboxState::Running | SandboxState::Paused => {
                record::transition(&mut savepoint, id, SandboxEvent::Stop)
                    .await
                    .map_err(into_db)?;
                ask::lost_worker(&mut savepoint, id, true).await?;
                record::interrupt_operations(&mut savepoint, id, "its worker was lost first")
                    .await?;
                record::tree_released(&mut savepoint, id, "worker_lost").await?;
                tracing::info!(sandbox_id = %id.simple(), "sandbox's worker lost; stopped at its last durable tree");
                report.stopped += 1;
            }
            SandboxState::Creating | SandboxState::Stopped if attempt < PLACEMENTS => {
                ask::place_again(&mut savepoint, id, false).await?;
                report.placed_again += 1;
            }
            SandboxState::Creating => {
                record::transition(&mut savepoint, id, SandboxEvent::BootFailure)
                    .await
                    .map_err(into_db)?;
                let why = format!("placement failed {PLACEMENTS} times: each worker was lost while it prepared the sandbox");
                ask::failed(&mut savepoint, id, &why).await?;
                record::interrupt_operations(&mut savepoint, id, "the sandbox failed to start")
                    .await?;
                report.failed += 1;
            }
            // A resume whose placements were all lost: it stays stopped, and says why.
            SandboxState::Stopped => {
                ask::lost_worker(&mut savepoint, id, false).await?;
                record::interrupt_operations(&mut savepoint, id, "its worker was lost first")
                    .await?;
                report.stopped += 1;
            }
            SandboxState::Error | SandboxState::Destroyed => {}
        }
        savepoint.commit().await?;
    }
    // Forks whose staging worker has not taken them in time: anywhere, from the capture.
    report.placed_again += record::place_anywhere(&mut tx, None).await?.len() as u64;
    tx.commit().await?;
    Ok(report)
}

fn into_db(e: cairn_common::request::Error) -> sqlx::Error {
    match e {
        cairn_common::request::Error::Db(e) => e,
        refused => sqlx::Error::Protocol(refused.to_string()),
    }
}
