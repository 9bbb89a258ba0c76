//! The contract's limits, checked wherever work is claimed or recorded: at claim, at
//! every intent and at completion (invariant 12). A cancel, a continuation's window, the
//! run's deadline and its budgets (wall time included, interrupted steps too) are read
//! from the request as it stands, in the caller's fenced transaction, so what the worker
//! remembers from its claim never decides.

use super::action;
use super::cancel::cancel_now;
use super::requeue::Continuation;
use super::state::transition;
use super::stop::stop_at_checkpoint;
use super::table::{ActionEvent, AdoptionEvent, Error, RequestEvent};
use crate::handoff;
use sqlx::PgConnection;
use uuid::Uuid;

/// Where a limit is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// A worker claimed the request and has started nothing yet.
    Claim,
    /// Another step (or check) is about to start: it needs room in the budgets.
    Intent,
    /// Every step has its receipt and the request is about to complete.
    Completion,
}

/// A limit the request has reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Breach {
    /// Cancellation was asked: a cancel that wins is a cancel.
    Cancelled,
    /// The admitting continuation's window ended.
    WindowEnded,
    /// The run's deadline passed.
    DeadlinePassed,
    CommandsSpent {
        max: i32,
    },
    WallSpent {
        max_seconds: i32,
    },
}

impl Breach {
    /// The reason recorded on the request.
    pub fn reason(&self, at: Moment, next: Option<&str>) -> String {
        let before = match (at, next) {
            (Moment::Intent, Some(step)) => format!(" before step {step}"),
            (Moment::Claim, _) => " before it started".to_string(),
            _ => String::new(),
        };
        match self {
            Breach::Cancelled => match at {
                Moment::Claim => "cancelled before it started".into(),
                _ => "cancelled while running".into(),
            },
            Breach::WindowEnded => "continuation_window_ended".into(),
            Breach::DeadlinePassed => format!("the run's deadline passed{before}"),
            Breach::CommandsSpent { max } => {
                format!("budget exhausted: max_commands ({max}) spent{before}")
            }
            Breach::WallSpent { max_seconds } => {
                format!("budget exhausted: max_wall_seconds ({max_seconds}) spent{before}")
            }
        }
    }
}

/// A request's limits as they stand.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Limits {
    pub cancel_requested: bool,
    pub deadline_passed: bool,
    pub window_ended: bool,
    pub used_commands: i32,
    pub max_commands: i32,
    pub used_wall_ms: i64,
    pub max_wall_seconds: i32,
}

impl Limits {
    /// The first limit reached at `at`. At an intent a budget must have room for one
    /// more command; at claim and completion only an overspent budget counts, so a run
    /// whose last step fitted its budget exactly still completes.
    pub fn breach(&self, at: Moment) -> Option<Breach> {
        if self.cancel_requested {
            return Some(Breach::Cancelled);
        }
        if self.window_ended {
            return Some(Breach::WindowEnded);
        }
        if self.deadline_passed {
            return Some(Breach::DeadlinePassed);
        }
        let max_wall_ms = i64::from(self.max_wall_seconds) * 1000;
        let (commands_out, wall_out) = match at {
            Moment::Intent => (
                self.used_commands >= self.max_commands,
                self.used_wall_ms >= max_wall_ms,
            ),
            Moment::Claim | Moment::Completion => (
                self.used_commands > self.max_commands,
                self.used_wall_ms > max_wall_ms,
            ),
        };
        if commands_out {
            return Some(Breach::CommandsSpent {
                max: self.max_commands,
            });
        }
        if wall_out {
            return Some(Breach::WallSpent {
                max_seconds: self.max_wall_seconds,
            });
        }
        None
    }

    /// Wall time left in the budget, in milliseconds.
    pub fn wall_left_ms(&self) -> i64 {
        (i64::from(self.max_wall_seconds) * 1000 - self.used_wall_ms).max(0)
    }
}

/// The columns of [`Limits`] that are not the request's budgets, for a query of the
/// request `e` joined to its run `r` that reads the budgets too: `window_ends` is the SQL
/// of the admitting continuation's window end (NULL where none applies).
pub fn conditions(window_ends: &str) -> String {
    format!(
        "e.cancel_requested_at IS NOT NULL AS cancel_requested,
         -- The run's deadline bounds its work; its publication comes after it.
         COALESCE(e.kind <> 'publication' AND r.deadline <= now(), FALSE) AS deadline_passed,
         COALESCE({window_ends} <= now(), FALSE) AS window_ended"
    )
}

/// Reads a request's limits in the caller's transaction; `continuation` names the action
/// whose window applies.
pub async fn read(
    conn: &mut PgConnection,
    request_id: Uuid,
    continuation: Continuation,
) -> Result<Limits, sqlx::Error> {
    let action_id = match continuation {
        Continuation::Checkpoint(id) | Continuation::FinalOutcome(id) => Some(id),
        Continuation::None | Continuation::Verification(_) => None,
    };
    let window = "(SELECT a.window_ends_at FROM continuation_actions a WHERE a.id = $2)";
    sqlx::query_as(&format!(
        "SELECT {}, e.used_commands, e.max_commands, e.used_wall_ms, e.max_wall_seconds
           FROM execution_requests e JOIN runs r ON r.id = e.run_id
          WHERE e.id = $1",
        conditions(window)
    ))
    .bind(request_id)
    .bind(action_id)
    .fetch_one(conn)
    .await
}

/// How a request ended for a breach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    Cancelled,
    /// Back at its checkpoint (a checkpoint continuation's window ended).
    StoppedAtCheckpoint,
    /// A person decides (a final-outcome continuation's window ended unclaimed).
    NeedsReconciliation,
    Failed(String),
}

/// Ends a request for `breach`, in the caller's fenced transaction, with whatever
/// continuation admitted it: a cancel cancels; a checkpoint continuation whose window
/// ended fails its action (or expires it, unclaimed) and stops at the checkpoint again;
/// a final-outcome continuation's expires and the report waits for another review; a
/// deadline or a budget fails the request and its action or adoption.
pub async fn end_for(
    conn: &mut PgConnection,
    request_id: Uuid,
    continuation: Continuation,
    breach: &Breach,
    at: Moment,
    next: Option<&str>,
) -> Result<Ended, Error> {
    let reason = breach.reason(at, next);
    // An action that no worker claimed yet admitted nothing: it expires.
    let unclaimed = at == Moment::Claim;
    match (breach, continuation) {
        (Breach::Cancelled, _) => {
            cancel_now(&mut *conn, request_id, &reason).await?;
            return Ok(Ended::Cancelled);
        }
        (Breach::WindowEnded, Continuation::Checkpoint(action_id)) => {
            let event = if unclaimed {
                ActionEvent::Expire
            } else {
                ActionEvent::Fail
            };
            action::transition(&mut *conn, action_id, event).await?;
            stop_at_checkpoint(&mut *conn, request_id, &reason).await?;
            return Ok(Ended::StoppedAtCheckpoint);
        }
        (Breach::WindowEnded, Continuation::FinalOutcome(action_id)) => {
            action::transition(&mut *conn, action_id, ActionEvent::Expire).await?;
            let event = RequestEvent::Reconcile;
            transition(&mut *conn, request_id, event, Some(&reason), None).await?;
            return Ok(Ended::NeedsReconciliation);
        }
        (_, Continuation::Checkpoint(id) | Continuation::FinalOutcome(id)) => {
            action::transition(&mut *conn, id, ActionEvent::Fail).await?;
        }
        (_, Continuation::Verification(adoption_id)) => {
            let event = AdoptionEvent::Fail;
            handoff::adoption_transition(&mut *conn, adoption_id, event, Some(&reason)).await?;
            handoff::fail_unless_passed(&mut *conn, adoption_id).await?;
        }
        (_, Continuation::None) => {}
    }
    transition(
        &mut *conn,
        request_id,
        RequestEvent::Fail,
        Some(&reason),
        None,
    )
    .await?;
    Ok(Ended::Failed(reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            cancel_requested: false,
            deadline_passed: false,
            window_ended: false,
            used_commands: 2,
            max_commands: 2,
            used_wall_ms: 1000,
            max_wall_seconds: 4,
        }
    }

    #[test]
    fn a_budget_spent_exactly_stops_the_next_step_but_not_the_completion() {
        let l = limits();
        assert_eq!(
            l.breach(Moment::Intent),
            Some(Breach::CommandsSpent { max: 2 })
        );
        assert_eq!(l.breach(Moment::Completion), None);
        assert_eq!(l.breach(Moment::Claim), None);
        let over = Limits {
            used_wall_ms: 4001,
            used_commands: 1,
            ..limits()
        };
        assert_eq!(
            over.breach(Moment::Claim),
            Some(Breach::WallSpent { max_seconds: 4 })
        );
    }

    #[test]
    fn a_cancel_wins_over_every_other_limit() {
        let l = Limits {
            cancel_requested: true,
            window_ended: true,
            deadline_passed: true,
            ..limits()
        };
        for at in [Moment::Claim, Moment::Intent, Moment::Completion] {
            assert_eq!(l.breach(at), Some(Breach::Cancelled));
        }
        let window = Limits {
            cancel_requested: false,
            ..l
        };
        assert_eq!(window.breach(Moment::Completion), Some(Breach::WindowEnded));
    }
}
