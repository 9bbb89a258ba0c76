//! The one transition table of requests, continuation actions, verification adoptions
//! and handoffs: for each typed event, the states it may leave and the state it enters.
//!
//! Every writer of a status goes through [`Machine::rule`]: its `UPDATE` is guarded by
//! `status = ANY(sources)` inside the transaction that holds the row, so a move the table
//! does not allow changes nothing and comes back as [`Refused`]. Terminal states are
//! the ones no event leaves, so they accept no event.

use super::states::{ActionStatus, AdoptionStatus, HandoffState, RequestState};
use sqlx::PgConnection;
use std::fmt::Debug;
use uuid::Uuid;

/// A typed state machine stored in one text column.
pub trait Machine: Copy + Eq + Debug + std::fmt::Display + Send + Sync + 'static {
    type Event: Copy + Eq + Debug + Send + Sync + 'static;
    /// What the machine is, for errors (`request`, `action`, ...).
    const NAME: &'static str;
    /// The table and the column that hold the state.
    const TABLE: &'static str;
    const COLUMN: &'static str;
    /// Every event, for tests and documentation.
    const EVENTS: &'static [Self::Event];

    /// The states `event` may leave, and the state it enters.
    fn rule(event: Self::Event) -> (&'static [Self], Self);

    fn parse_state(text: &str) -> Option<Self>;

    /// The state `event` moves to from `self`, or `None` when the table forbids it.
    fn next(self, event: Self::Event) -> Option<Self> {
        let (sources, target) = Self::rule(event);
        sources.contains(&self).then_some(target)
    }

    /// No event leaves a terminal state.
    fn accepts_nothing(self) -> bool {
        Self::EVENTS.iter().all(|e| self.next(*e).is_none())
    }
}

crate::text_enum! {
    /// What happens to an execution request.
    pub enum RequestEvent {
        /// A worker claimed it and runs it.
        Claim => "claim",
        /// Queued again: a new automatic attempt, a hand-back, or a claim that never
        /// started.
        Requeue => "requeue",
        /// A reviewed checkpoint continuation admitted it again.
        ContinueFromCheckpoint => "continue_from_checkpoint",
        /// A reviewed final-outcome continuation admitted it to accept its report.
        ReadmitReport => "readmit_report",
        /// An adopted verification admitted it.
        AdoptVerification => "adopt_verification",
        /// Its verification passed: queued for the fresh worker round that finishes it
        /// on the verified source.
        QueueFinishingRound => "queue_finishing_round",
        /// Stopped at its last checkpoint: attempts spent, a window ended, a pause
        /// expired, a capture kept failing.
        StopAtCheckpoint => "stop_at_checkpoint",
        /// A person decides (unknown outcome, tree behind its journal, report unaccepted).
        Reconcile => "reconcile",
        /// A step failed under its retry policy: queued again, on the same attempt, to run
        /// it after its backoff.
        RetryStep => "retry_step",
        /// A person decided every uncertain step: it continues from its journal, on the
        /// same attempt and budgets.
        ContinueReconciled => "continue_reconciled",
        /// A person decided the run fails rather than decide its uncertain steps.
        FailReconciled => "fail_reconciled",
        /// Its report was accepted and asks for verification (or a verification's
        /// attempts were spent).
        AwaitVerification => "await_verification",
        Complete => "complete",
        Fail => "fail",
        Cancel => "cancel",
    }
}

crate::text_enum! {
    /// What happens to a continuation action.
    pub enum ActionEvent {
        Claim => "claim",
        /// Drained inside its window: queued again for another worker.
        HandBack => "hand_back",
        Complete => "complete",
        Fail => "fail",
        Reconcile => "reconcile",
        /// Its window ended before any worker claimed it: it admitted nothing, and its
        /// checkpoint (or report) is free for another review.
        Expire => "expire",
    }
}

crate::text_enum! {
    /// What happens to a verification adoption.
    pub enum AdoptionEvent {
        Claim => "claim",
        Requeue => "requeue",
        /// Its checks passed: it waits for the fresh worker round that finishes the run.
        ChecksPassed => "checks_passed",
        Complete => "complete",
        Fail => "fail",
        Cancel => "cancel",
    }
}

crate::text_enum! {
    /// What happens to a verification handoff.
    pub enum HandoffEvent {
        Adopt => "adopt",
        /// Its adoption's attempts were spent: it waits for a new adoption.
        Reopen => "reopen",
        Pass => "pass",
        Fail => "fail",
    }
}

impl Machine for RequestState {
    type Event = RequestEvent;
    const NAME: &'static str = "request";
    const TABLE: &'static str = "execution_requests";
    const COLUMN: &'static str = "state";
    const EVENTS: &'static [RequestEvent] = RequestEvent::ALL;

    fn rule(event: RequestEvent) -> (&'static [Self], Self) {
        use RequestState::*;
        const LIVE: &[RequestState] = &[Queued, Executing];
        const OPEN: &[RequestState] = &[
            Queued,
            Executing,
            AwaitingVerification,
            StoppedAtCheckpoint,
            NeedsReconciliation,
        ];
        match event {
            RequestEvent::Claim => (&[Queued], Executing),
            RequestEvent::Requeue => (LIVE, Queued),
            RequestEvent::ContinueFromCheckpoint => (&[StoppedAtCheckpoint], Queued),
            RequestEvent::ReadmitReport => (&[NeedsReconciliation], Queued),
            RequestEvent::AdoptVerification => (&[AwaitingVerification], Queued),
            RequestEvent::QueueFinishingRound => (&[Executing], Queued),
            RequestEvent::StopAtCheckpoint => (LIVE, StoppedAtCheckpoint),
            RequestEvent::Reconcile => (LIVE, NeedsReconciliation),
            RequestEvent::RetryStep => (&[Executing], Queued),
            RequestEvent::ContinueReconciled => (&[NeedsReconciliation], Queued),
            RequestEvent::FailReconciled => (&[NeedsReconciliation], Failed),
            RequestEvent::AwaitVerification => (LIVE, AwaitingVerification),
            RequestEvent::Complete => (LIVE, Completed),
            RequestEvent::Fail => (LIVE, Failed),
            RequestEvent::Cancel => (OPEN, Cancelled),
        }
    }

    fn parse_state(text: &str) -> Option<Self> {
        RequestState::parse(text)
    }
}

impl Machine for ActionStatus {
    type Event = ActionEvent;
    const NAME: &'static str = "continuation action";
    const TABLE: &'static str = "continuation_actions";
    const COLUMN: &'static str = "status";
    const EVENTS: &'static [ActionEvent] = ActionEvent::ALL;

    fn rule(event: ActionEvent) -> (&'static [Self], Self) {
        use ActionStatus::*;
        const LIVE: &[ActionStatus] = &[Queued, Executing];
        match event {
            ActionEvent::Claim => (&[Queued], Executing),
            ActionEvent::HandBack => (&[Executing], Queued),
            ActionEvent::Complete => (LIVE, Completed),
            ActionEvent::Fail => (LIVE, Failed),
            ActionEvent::Reconcile => (LIVE, NeedsReconciliation),
            ActionEvent::Expire => (&[Queued], Expired),
        }
    }

    fn parse_state(text: &str) -> Option<Self> {
        ActionStatus::parse(text)
    }
}

impl Machine for AdoptionStatus {
    type Event = AdoptionEvent;
    const NAME: &'static str = "verification adoption";
    const TABLE: &'static str = "verification_adoptions";
    const COLUMN: &'static str = "status";
    const EVENTS: &'static [AdoptionEvent] = AdoptionEvent::ALL;

    fn rule(event: AdoptionEvent) -> (&'static [Self], Self) {
        use AdoptionStatus::*;
        const LIVE: &[AdoptionStatus] = &[Queued, Executing];
        match event {
            AdoptionEvent::Claim => (&[Queued], Executing),
            AdoptionEvent::Requeue => (LIVE, Queued),
            AdoptionEvent::ChecksPassed => (&[Executing], Queued),
            AdoptionEvent::Complete => (&[Executing], Completed),
            AdoptionEvent::Fail => (LIVE, Failed),
            AdoptionEvent::Cancel => (LIVE, Cancelled),
        }
    }

    fn parse_state(text: &str) -> Option<Self> {
        AdoptionStatus::parse(text)
    }
}

impl Machine for HandoffState {
    type Event = HandoffEvent;
    const NAME: &'static str = "verification handoff";
    const TABLE: &'static str = "verification_handoffs";
    const COLUMN: &'static str = "state";
    const EVENTS: &'static [HandoffEvent] = HandoffEvent::ALL;

    fn rule(event: HandoffEvent) -> (&'static [Self], Self) {
        use HandoffState::*;
        match event {
            HandoffEvent::Adopt => (&[Pending], Adopted),
            HandoffEvent::Reopen => (&[Adopted], Pending),
            HandoffEvent::Pass => (&[Adopted], Passed),
            HandoffEvent::Fail => (&[Pending, Adopted], Failed),
        }
    }

    fn parse_state(text: &str) -> Option<Self> {
        HandoffState::parse(text)
    }
}

/// A move the table does not allow: nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{machine} {} is {from}: the transition table allows no {event} from there", id.simple())]
pub struct Refused {
    pub machine: &'static str,
    pub id: Uuid,
    pub from: String,
    pub event: String,
}

/// Why a transition did not happen.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Refused(#[from] Refused),
}

impl Error {
    /// Whether the table refused the move (as opposed to the database failing).
    pub fn refused(&self) -> Option<&Refused> {
        match self {
            Error::Refused(r) => Some(r),
            Error::Db(_) => None,
        }
    }
}

/// The guard of an event: the states it may leave (for `= ANY($n)`) and its target.
pub fn guard<M: Machine>(event: M::Event) -> (Vec<String>, M) {
    let (sources, target) = M::rule(event);
    (sources.iter().map(|s| s.to_string()).collect(), target)
}

/// The error for a guarded update that changed no row: the table refused the move from
/// the row's current state, or there is no such row.
pub async fn refusal<M: Machine>(conn: &mut PgConnection, id: Uuid, event: M::Event) -> Error
where
    M::Event: std::fmt::Display,
{
    let current: Result<Option<String>, sqlx::Error> = sqlx::query_scalar(&format!(
        "SELECT {} FROM {} WHERE id = $1",
        M::COLUMN,
        M::TABLE
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await;
    match current {
        Ok(Some(from)) => Error::Refused(Refused {
            machine: M::NAME,
            id,
            from,
            event: event.to_string(),
        }),
        Ok(None) => Error::Db(sqlx::Error::RowNotFound),
        Err(e) => Error::Db(e),
    }
}

/// Moves one row of `M`'s table by `event`, setting only its state and `updated_at`.
pub async fn apply<M: Machine>(
    conn: &mut PgConnection,
    id: Uuid,
    event: M::Event,
) -> Result<M, Error>
where
    M::Event: std::fmt::Display,
{
    let (sources, target) = guard::<M>(event);
    let moved = sqlx::query(&format!(
        "UPDATE {table} SET {column} = $2, updated_at = now() WHERE id = $1 AND {column} = ANY($3)",
        table = M::TABLE,
        column = M::COLUMN
    ))
    .bind(id)
    .bind(target.to_string())
    .bind(&sources)
    .execute(&mut *conn)
    .await?;
    if moved.rows_affected() == 0 {
        return Err(refusal::<M>(conn, id, event).await);
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terminal_states_accept_nothing<M: Machine>(all: &[M], terminal: &[M]) {
        for state in all {
            assert_eq!(
                state.accepts_nothing(),
                terminal.contains(state),
                "{} {state}: terminal in the table exactly when it is declared terminal",
                M::NAME
            );
        }
    }

    #[test]
    fn the_declared_terminal_states_are_the_ones_no_event_leaves() {
        let terminal: Vec<RequestState> = RequestState::ALL
            .iter()
            .copied()
            .filter(|s| s.is_terminal())
            .collect();
        terminal_states_accept_nothing(RequestState::ALL, &terminal);
        use ActionStatus as A;
        terminal_states_accept_nothing(
            ActionStatus::ALL,
            &[A::Completed, A::Failed, A::NeedsReconciliation, A::Expired],
        );
        use AdoptionStatus as D;
        terminal_states_accept_nothing(
            AdoptionStatus::ALL,
            &[D::Completed, D::Failed, D::Cancelled],
        );
        use HandoffState as H;
        terminal_states_accept_nothing(HandoffState::ALL, &[H::Passed, H::Failed]);
    }

    #[test]
    fn a_cancel_ends_every_request_that_has_not_ended() {
        for state in RequestState::ALL {
            let next = state.next(RequestEvent::Cancel);
            assert_eq!(
                next.is_some(),
                !state.is_terminal(),
                "cancel from {state}: {next:?}"
            );
        }
    }
}
