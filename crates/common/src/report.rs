//! A run's final report: retained with its last step's receipt, accepted (consumed)
//! exactly once. The one writer of `final_reports` and `report_consumptions`.

use crate::handoff;
use crate::journal;
use crate::lease::Lease;
use crate::request::action;
use crate::request::{transition, ActionEvent, Error, RequestEvent};
use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

/// What asks for a verification handoff.
pub const VERIFICATION: &str = "verification";

/// A final report as it is retained.
#[derive(Debug, Clone, Copy)]
pub struct RetainedReport<'a> {
    /// `complete`, `blocked`, `clarification` or `failed`.
    pub outcome: &'a str,
    pub followup_kind: Option<&'a str>,
    pub body: &'a serde_json::Value,
    /// The source a verification it asks for will verify.
    pub source_digest: Option<&'a str>,
}

/// The digest of a retained report: what its acceptance receipt records, and what a
/// candidate and the finishing round compare it with.
pub fn digest(outcome: &str, followup_kind: Option<&str>, body: &serde_json::Value) -> String {
    crate::digest::of(&json!({
        "outcome": outcome,
        "followup_kind": followup_kind,
        "body": body,
    }))
}

/// Retains a report, in the transaction of the last step's receipt.
pub async fn retain(
    conn: &mut PgConnection,
    lease: &Lease,
    report: &RetainedReport<'_>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO final_reports (request_id, outcome, followup_kind, body, lease_epoch, source_digest)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (request_id) DO NOTHING",
    )
    .bind(lease.request_id)
    .bind(report.outcome)
    .bind(report.followup_kind)
    .bind(report.body)
    .bind(lease.epoch)
    .bind(report.source_digest)
    .execute(conn)
    .await?;
    Ok(())
}

/// Where a request's retained report stands at its completion; all `false` without one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    /// Retained and not yet accepted.
    pub awaits_acceptance: bool,
    /// It asks for more than completion (blocked, a clarification, or a follow-up):
    /// the task then stays open.
    pub asks_for_more: bool,
}

/// Reads the [`Standing`] of the request's retained report, in one statement.
pub async fn standing(conn: &mut PgConnection, request_id: Uuid) -> Result<Standing, sqlx::Error> {
    let row: Option<(bool, bool)> = sqlx::query_as(
        "SELECT NOT EXISTS (SELECT 1 FROM report_consumptions c WHERE c.request_id = f.request_id),
                f.outcome IN ('blocked', 'clarification') OR f.followup_kind IS NOT NULL
           FROM final_reports f WHERE f.request_id = $1",
    )
    .bind(request_id)
    .fetch_optional(conn)
    .await?;
    Ok(
        row.map_or_else(Standing::default, |(awaits_acceptance, asks_for_more)| {
            Standing {
                awaits_acceptance,
                asks_for_more,
            }
        }),
    )
}

/// How an acceptance ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acceptance {
    /// Accepted now: the request completed, or awaits its verification.
    Accepted { verification: bool },
    /// There was no report to accept (or it was accepted before): a person decides.
    Missing,
}

/// Accepts the retained final report exactly once (a unique consumption record), in the
/// caller's fenced transaction: journals the acceptance, opens the verification handoff
/// it asks for, and moves the request (and the admitting action, if any) on.
pub async fn accept(
    conn: &mut PgConnection,
    lease: &Lease,
    action_id: Option<Uuid>,
    worker_id: &str,
) -> Result<Acceptance, Error> {
    let report: Option<(String, Option<String>, serde_json::Value, Option<String>)> = sqlx::query_as(
        "SELECT outcome, followup_kind, body, source_digest FROM final_reports WHERE request_id = $1",
    )
    .bind(lease.request_id)
    .fetch_optional(&mut *conn)
    .await?;
    let consumed = sqlx::query(
        "INSERT INTO report_consumptions (request_id, action_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    )
    .bind(lease.request_id)
    .bind(action_id)
    .execute(&mut *conn)
    .await;
    let consumed = match (report.as_ref(), consumed) {
        (Some(_), Ok(done)) => done.rows_affected() == 1,
        _ => false,
    };
    let Some((outcome, followup_kind, body, source_digest)) = report.filter(|_| consumed) else {
        let reason = Some("no retained report to accept");
        transition(
            &mut *conn,
            lease.request_id,
            RequestEvent::Reconcile,
            reason,
            None,
        )
        .await?;
        if let Some(action_id) = action_id {
            action::transition(&mut *conn, action_id, ActionEvent::Reconcile).await?;
        }
        return Ok(Acceptance::Missing);
    };
    journal::entry(
        &mut *conn,
        lease,
        "final_report_accepted",
        &json!({
            "outcome": outcome,
            "followup_kind": followup_kind,
            "report_digest": digest(&outcome, followup_kind.as_deref(), &body),
            "action_id": action_id,
            "worker": worker_id,
        }),
    )
    .await?;
    let verification = followup_kind.as_deref() == Some(VERIFICATION);
    if verification {
        handoff::open(
            &mut *conn,
            lease.request_id,
            &body,
            source_digest.as_deref(),
        )
        .await?;
    }
    let event = if verification {
        RequestEvent::AwaitVerification
    } else {
        RequestEvent::Complete
    };
    transition(&mut *conn, lease.request_id, event, None, None).await?;
    if let Some(action_id) = action_id {
        action::transition(&mut *conn, action_id, ActionEvent::Complete).await?;
    }
    Ok(Acceptance::Accepted { verification })
}
