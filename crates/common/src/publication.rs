//! Publication: a completed run's result delivered as a patch in the artifact store,
//! with its receipt; and delivery holds. The one writer of `publications` and
//! `delivery_holds`.
//!
//! A publication is an execution request of its own (kind `publication`) on the run, so
//! it shows in the run's execution-request list and a worker claims it under a fenced
//! lease like any job. It is admitted only while nothing holds it ([`holds`]): the run
//! completed, no delivery hold stands, and the run's final tree is still readable. The
//! worker checks the same again in the transaction that records the delivery.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use utoipa::ToSchema;
use uuid::Uuid;

/// Where delivery artifacts are kept in the artifact store.
pub const ARTIFACT_PREFIX: &str = "deliveries/";

/// A publication's attempts and time: it runs no agent command.
const MAX_ATTEMPTS: i32 = 3;
const MAX_WALL_SECONDS: i32 = 600;

/// What a publication stands on, read in the caller's transaction.
#[derive(Debug, Clone, Default, sqlx::FromRow)]
pub struct Standing {
    pub run_state: String,
    pub hold_reason: Option<String>,
    /// The run's final tree: the snapshot its last receipt stands on, and its status.
    pub final_snapshot: Option<Uuid>,
    pub final_store_url: Option<String>,
    /// The manifest key its record names.
    pub final_manifest_key: Option<String>,
    pub final_status: Option<String>,
    pub repository: Option<String>,
    pub git_ref: Option<String>,
    /// The commit the run's tree was at when its request last acquired it.
    pub base_commit: Option<String>,
}

/// Why a publication cannot go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HoldReason {
    /// The run has not completed (it failed, was cancelled, or still waits for work,
    /// a person or its verification).
    NotCompleted,
    /// A delivery hold stands on the run.
    DeliveryHold,
    /// The run's final tree is not readable any more (or there never was one).
    MissingCustody,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Hold {
    pub reason: HoldReason,
    pub message: String,
}

/// The holds on publishing a run that stands so.
pub fn holds(s: &Standing) -> Vec<Hold> {
    let mut holds = Vec::new();
    let mut add = |reason, message: String| holds.push(Hold { reason, message });
    if s.run_state != "completed" {
        add(
            HoldReason::NotCompleted,
            format!(
                "the run is {}, not completed",
                s.run_state.replace('_', " ")
            ),
        );
    }
    if let Some(reason) = &s.hold_reason {
        add(
            HoldReason::DeliveryHold,
            format!("a delivery hold stands on the run: {reason}"),
        );
    }
    match (s.final_snapshot, s.final_status.as_deref()) {
        (Some(_), Some("ready")) => {}
        (Some(_), status) => add(
            HoldReason::MissingCustody,
            format!(
                "the run's final tree is {}: it can no longer be read",
                status.unwrap_or("gone")
            ),
        ),
        (None, _) => add(
            HoldReason::MissingCustody,
            "no receipt of the run stands on a captured tree".into(),
        ),
    }
    holds
}

/// What `run_id`'s publication stands on now; `None` for an unknown run.
pub async fn standing(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Option<Standing>, sqlx::Error> {
    sqlx::query_as(
        "SELECT r.state AS run_state, d.reason AS hold_reason, f.id AS final_snapshot,
                f.store_url AS final_store_url, f.manifest_key AS final_manifest_key,
                f.status AS final_status, r.repository, r.git_ref,
                (SELECT e.resume_context->>'commit' FROM execution_requests e
                  WHERE e.run_id = r.id AND e.kind = 'run') AS base_commit
           FROM runs r
           LEFT JOIN delivery_holds d ON d.run_id = r.id
           LEFT JOIN LATERAL (
                SELECT s.id, s.store_url, s.manifest_key, s.status
                  FROM execution_requests e
                  JOIN journal_receipts jr ON jr.request_id = e.id AND jr.snapshot_id IS NOT NULL
                  JOIN project_snapshots s ON s.id = jr.snapshot_id
                 WHERE e.run_id = r.id AND e.kind = 'run'
                 ORDER BY jr.finished_at DESC LIMIT 1) f ON TRUE
          WHERE r.id = $1",
    )
    .bind(run_id)
    .fetch_optional(conn)
    .await
}

/// A publication to admit.
#[derive(Debug, Clone, Copy)]
pub struct NewPublication<'a> {
    pub request_id: Uuid,
    pub run_id: Uuid,
    pub operator_id: Uuid,
    pub input_digest: &'a str,
}

/// Admits a publication: its execution request (queued), its row, and its announcement,
/// in the caller's transaction.
pub async fn admit(conn: &mut PgConnection, new: &NewPublication<'_>) -> Result<(), sqlx::Error> {
    let limits = (MAX_ATTEMPTS, MAX_WALL_SECONDS);
    crate::request::admit::publication(&mut *conn, new.request_id, new.run_id, limits).await?;
    sqlx::query(
        "INSERT INTO publications (request_id, run_id, operator_id, input_digest) VALUES ($1, $2, $3, $4)",
    )
    .bind(new.request_id)
    .bind(new.run_id)
    .bind(new.operator_id)
    .bind(new.input_digest)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The run and input digest a publication id was saved with, if it was.
pub async fn saved(
    conn: &mut PgConnection,
    request_id: Uuid,
) -> Result<Option<(Uuid, String)>, sqlx::Error> {
    sqlx::query_as("SELECT run_id, input_digest FROM publications WHERE request_id = $1")
        .bind(request_id)
        .fetch_optional(conn)
        .await
}

/// A publication as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema, sqlx::FromRow)]
pub struct PublicationView {
    #[schema(value_type = String)]
    pub request_id: Uuid,
    #[schema(value_type = String)]
    pub run_id: Uuid,
    /// The publication request's state: `queued`, `executing`, `completed` (delivered),
    /// `needs_reconciliation` (held when it ran), `failed`.
    pub state: String,
    pub stop_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    /// The delivery receipt, once delivered.
    #[sqlx(skip)]
    pub delivery: Option<Delivery>,
}

/// A delivery receipt: the artifact, what it holds and what it was made from.
#[derive(Debug, Clone, Serialize, ToSchema, sqlx::FromRow)]
pub struct Delivery {
    /// The artifact's key in the artifact store (`deliveries/<request_id>.patch`).
    pub artifact_key: String,
    /// SHA-256 of the artifact's bytes.
    pub sha256: String,
    pub bytes: i64,
    pub files_changed: i32,
    /// What the patch applies to: `empty` (a run without a repository) or
    /// `REPOSITORY@REF`.
    pub base: String,
    #[schema(value_type = String)]
    pub final_snapshot_id: Uuid,
    pub delivered_at: DateTime<Utc>,
}

/// A publication of `run_id`, with its receipt once delivered.
pub async fn view(
    conn: &mut PgConnection,
    run_id: Uuid,
    request_id: Uuid,
) -> Result<Option<PublicationView>, sqlx::Error> {
    let found: Option<PublicationView> = sqlx::query_as(
        "SELECT p.request_id, p.run_id, e.state, e.stop_reason, p.created_at
           FROM publications p JOIN execution_requests e ON e.id = p.request_id
          WHERE p.request_id = $1 AND p.run_id = $2",
    )
    .bind(request_id)
    .bind(run_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(mut found) = found else {
        return Ok(None);
    };
    found.delivery = sqlx::query_as(
        "SELECT artifact_key, sha256, bytes, files_changed, base, final_snapshot_id, delivered_at
           FROM publications WHERE request_id = $1 AND delivered_at IS NOT NULL",
    )
    .bind(request_id)
    .fetch_optional(conn)
    .await?;
    Ok(Some(found))
}

/// The delivery as the worker made it.
#[derive(Debug, Clone, Copy)]
pub struct Delivered<'a> {
    pub artifact_key: &'a str,
    pub store_url: &'a str,
    pub sha256: &'a str,
    pub bytes: i64,
    pub files_changed: i32,
    pub base: &'a str,
    pub final_snapshot_id: Uuid,
}

/// Records the delivery receipt, in the worker's fenced transaction.
pub async fn record_delivery(
    conn: &mut PgConnection,
    request_id: Uuid,
    d: &Delivered<'_>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE publications SET artifact_key = $2, store_url = $3, sha256 = $4, bytes = $5,
                files_changed = $6, base = $7, final_snapshot_id = $8, delivered_at = now()
          WHERE request_id = $1",
    )
    .bind(request_id)
    .bind(d.artifact_key)
    .bind(d.store_url)
    .bind(d.sha256)
    .bind(d.bytes)
    .bind(d.files_changed)
    .bind(d.base)
    .bind(d.final_snapshot_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// A run's delivery hold, as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema, sqlx::FromRow)]
pub struct DeliveryHold {
    #[schema(value_type = String)]
    pub run_id: Uuid,
    pub held: bool,
    pub reason: Option<String>,
    pub set_at: Option<DateTime<Utc>>,
}

/// The delivery hold of `run_id` (`held: false` when none stands); `None` for an
/// unknown run.
pub async fn hold_of(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Option<DeliveryHold>, sqlx::Error> {
    sqlx::query_as(
        "SELECT r.id AS run_id, d.run_id IS NOT NULL AS held, d.reason, d.set_at
           FROM runs r LEFT JOIN delivery_holds d ON d.run_id = r.id WHERE r.id = $1",
    )
    .bind(run_id)
    .fetch_optional(conn)
    .await
}

/// Locks the run's row against a delivery hold's change until the caller's transaction
/// ends: a delivery recorded under it saw the holds as they stay until it commits.
pub async fn lock_for_delivery(conn: &mut PgConnection, run_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR SHARE")
        .bind(run_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Locks the run's row for a change of its delivery hold: it waits for a delivery
/// being recorded, and the next one sees the change.
async fn lock_for_hold(conn: &mut PgConnection, run_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
        .bind(run_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Sets (or replaces) the delivery hold of an existing run.
pub async fn set_hold(
    conn: &mut PgConnection,
    run_id: Uuid,
    reason: &str,
    by: Uuid,
) -> Result<(), sqlx::Error> {
    lock_for_hold(&mut *conn, run_id).await?;
    sqlx::query(
        "INSERT INTO delivery_holds (run_id, reason, set_by) VALUES ($1, $2, $3)
         ON CONFLICT (run_id) DO UPDATE SET reason = EXCLUDED.reason, set_by = EXCLUDED.set_by, set_at = now()",
    )
    .bind(run_id)
    .bind(reason)
    .bind(by)
    .execute(conn)
    .await?;
    Ok(())
}

/// Clears the delivery hold of a run, if one stands.
pub async fn clear_hold(conn: &mut PgConnection, run_id: Uuid) -> Result<(), sqlx::Error> {
    lock_for_hold(&mut *conn, run_id).await?;
    sqlx::query("DELETE FROM delivery_holds WHERE run_id = $1")
        .bind(run_id)
        .execute(conn)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publishable() -> Standing {
        Standing {
            run_state: "completed".into(),
            final_snapshot: Some(Uuid::from_u128(1)),
            final_status: Some("ready".into()),
            ..Standing::default()
        }
    }

    fn reasons(s: &Standing) -> Vec<HoldReason> {
        holds(s).into_iter().map(|h| h.reason).collect()
    }

    #[test]
    fn a_completed_run_with_a_readable_tree_and_no_hold_is_publishable() {
        assert_eq!(reasons(&publishable()), []);
    }

    #[test]
    fn each_hold_fires() {
        for state in [
            "awaiting_verification",
            "needs_reconciliation",
            "failed",
            "queued",
        ] {
            let s = Standing {
                run_state: state.into(),
                ..publishable()
            };
            assert_eq!(reasons(&s), [HoldReason::NotCompleted], "{state}");
        }
        let held = Standing {
            hold_reason: Some("legal review".into()),
            ..publishable()
        };
        assert_eq!(reasons(&held), [HoldReason::DeliveryHold]);
        let reclaimed = Standing {
            final_status: Some("deleted".into()),
            ..publishable()
        };
        assert_eq!(reasons(&reclaimed), [HoldReason::MissingCustody]);
        let never = Standing {
            final_snapshot: None,
            final_status: None,
            ..publishable()
        };
        assert_eq!(reasons(&never), [HoldReason::MissingCustody]);
    }
}
