//! The runs that change, as server-sent events: the console's live list and run page.
//!
//! Each run row carries the id of the transaction that last wrote it (`change_xid`, set
//! by the database). A poll reads, in `(change_xid, id)` order, the rows written after
//! the client's position by transactions that have all ended (below the snapshot's
//! xmin), so a writer that commits after a later one is still read. The position is
//! each event's `id`; a client that reconnects with it as `Last-Event-ID` gets every run
//! that changed since, once per change, and nothing it already had. A stream opened
//! without one starts at the horizon, so it may first send runs that changed just before
//! it opened (each event is a run as it is now, so a repeat changes nothing). A write
//! transaction held open anywhere on the server holds the horizon, and the stream,
//! until it ends; Cairn's own last milliseconds.

use super::view::{RunView, RUN_SELECT};
use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::live_output::last_event_id;
use crate::api::path_id;
use crate::api::AppState;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cairn_common::ids::Id;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// How often a stream looks for changes.
const POLL: Duration = Duration::from_millis(250);

/// The most runs one poll reads.
const BATCH: i64 = 200;

/// A reconnect that missed more changes than this gets a `reset` instead of them all.
const MAX_REPLAY: i64 = 1000;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only this run's changes.
    #[param(pattern = "^[0-9a-f]{32}$")]
    pub run_id: Option<String>,
}

/// One server-sent event of the stream (documentation only: the body is
/// `text/event-stream`).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunEvent {
    /// `run` (data: the run as `GET /api/v1/runs/{run_id}` shows it), `ready` (data `{}`:
    /// what changed before the connection has been sent; live from here) or `reset`
    /// (data `{}`: more changed since `Last-Event-ID` than is replayed; read the list
    /// again).
    pub event: String,
    /// The stream's position after this event: send it back as `Last-Event-ID`.
    pub id: String,
    pub data: String,
}

/// Where a stream stands: every change by a transaction below `xid` has been sent, and
/// of the rows `xid` itself wrote, those with an id up to `after` (none when `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    xid: u64,
    /// The last run sent of those written by `xid`; `None`: none of them yet.
    after: Option<Uuid>,
}

impl Position {
    fn text(self) -> String {
        match self.after {
            Some(id) => format!("{}_{}", self.xid, Id::from(id)),
            None => self.xid.to_string(),
        }
    }

    fn parse(text: &str) -> Option<Position> {
        let (xid, after) = match text.split_once('_') {
            Some((xid, id)) => (xid, Some(id.parse::<Id>().ok()?.uuid())),
            None => (text, None),
        };
        Some(Position {
            xid: xid.parse().ok()?,
            after,
        })
    }
}

/// The runs of the caller's tenant (or one run) as they change: `run` events, each with
/// the run as it is now (its state, cancel, pause or flow-control hold changed), and a
/// `ready` event once what changed since `Last-Event-ID` has been sent. Without one the
/// stream starts now, and may first repeat runs that changed just before. Comments keep
/// the connection alive.
#[utoipa::path(get, operation_id = "get_run_events", tag = "runs", path = "/api/v1/runs/events",
    params(EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event the client had: the stream goes on after it")),
    responses(
        (status = 200, description = "Server-sent events", content((RunEvent = "text/event-stream"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn events(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    caller.require(Role::Viewer)?;
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let run = query
        .run_id
        .as_deref()
        .map(|id| path_id(id, "run_id"))
        .transpose()?;
    let asked = last_event_id(&headers)?
        .map(|text| {
            Position::parse(text).ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_query",
                    "Last-Event-ID is not the id of an event this stream sent",
                )
                .with_field("last_event_id")
            })
        })
        .transpose()?;
    let filter = Filter {
        tenant: caller.scope().map(str::to_string),
        run,
    };
    let now = Position {
        xid: horizon(&state.pool).await?,
        after: None,
    };
    let mut pending = Vec::new();
    let start = match asked {
        Some(from) if behind(&state.pool, &filter, from).await? > MAX_REPLAY => {
            pending.push(marker("reset", now));
            now
        }
        Some(from) => from,
        None => now,
    };
    let stream = Stream {
        pool: state.pool.clone(),
        filter,
        at: start,
        pending,
        ready_sent: false,
    };
    Ok(Sse::new(futures::stream::unfold(stream, next))
        .keep_alive(KeepAlive::default())
        .into_response())
}

struct Filter {
    tenant: Option<String>,
    run: Option<Uuid>,
}

struct Stream {
    pool: PgPool,
    filter: Filter,
    at: Position,
    /// Events read and not yet sent, in order.
    pending: Vec<Event>,
    ready_sent: bool,
}

/// The stream's next event: what a poll found, `ready` after the first poll that found
/// the replay done, or a wait for the next poll.
async fn next(mut s: Stream) -> Option<(Result<Event, std::convert::Infallible>, Stream)> {
    loop {
        if !s.pending.is_empty() {
            let event = s.pending.remove(0);
            return Some((Ok(event), s));
        }
        match changed(&s.pool, &s.filter, s.at).await {
            Ok(batch) => {
                let caught_up = batch.runs.len() < BATCH as usize;
                for (position, run) in batch.runs {
                    let data = serde_json::to_string(&run).unwrap_or_default();
                    s.pending
                        .push(Event::default().event("run").id(position.text()).data(data));
                    s.at = position;
                }
                if caught_up {
                    s.at = s.at.max_with(batch.horizon);
                    if !s.ready_sent {
                        s.ready_sent = true;
                        s.pending.push(marker("ready", s.at));
                    }
                }
                if !s.pending.is_empty() {
                    continue;
                }
            }
            // A failed read is read again at the next poll, from the same position.
            Err(e) => tracing::debug!(error = %e, "run events not read"),
        }
        tokio::time::sleep(POLL).await;
    }
}

impl Position {
    /// This position, or the horizon when every transaction below it has ended and
    /// nothing of its own xid remains to send.
    fn max_with(self, horizon: u64) -> Position {
        if horizon > self.xid {
            Position {
                xid: horizon,
                after: None,
            }
        } else {
            self
        }
    }
}

fn marker(kind: &str, at: Position) -> Event {
    Event::default().event(kind).id(at.text()).data("{}")
}

/// The oldest transaction still running (the snapshot's xmin): every writer below it has
/// ended.
async fn horizon(pool: &PgPool) -> Result<u64, sqlx::Error> {
    let text: String = sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")
        .fetch_one(pool)
        .await?;
    Ok(text.parse().unwrap_or_default())
}

/// How many runs changed after `from` (counted up to one past the replay's limit).
async fn behind(pool: &PgPool, filter: &Filter, from: Position) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM (
            SELECT 1 FROM runs r
             WHERE r.change_xid >= $1::text::xid8
               AND ($2::text IS NULL OR r.tenant_id = $2)
               AND ($3::uuid IS NULL OR r.id = $3)
             LIMIT $4) x",
    )
    .bind(from.xid.to_string())
    .bind(&filter.tenant)
    .bind(filter.run)
    .bind(MAX_REPLAY + 1)
    .fetch_one(pool)
    .await
}

struct Batch {
    /// Each run read, with the position after it.
    runs: Vec<(Position, RunView)>,
    /// The xmin of the snapshot the batch was read in.
    horizon: u64,
}

/// The runs written after `at` by transactions that have ended, in order, up to
/// [`BATCH`]; read in one statement, so the horizon is that of the rows' snapshot.
async fn changed(pool: &PgPool, filter: &Filter, at: Position) -> Result<Batch, sqlx::Error> {
    let (horizon, ids, xids): (String, Vec<Uuid>, Vec<String>) = sqlx::query_as(
        "WITH snap AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin),
              found AS (
                SELECT r.id, r.change_xid FROM runs r, snap
                 WHERE r.change_xid >= $1::text::xid8
                   AND ($2::uuid IS NULL OR r.change_xid > $1::text::xid8 OR r.id > $2)
                   AND r.change_xid < snap.xmin
                   AND ($3::text IS NULL OR r.tenant_id = $3)
                   AND ($4::uuid IS NULL OR r.id = $4)
                 ORDER BY r.change_xid, r.id
                 LIMIT $5)
         SELECT (SELECT xmin::text FROM snap),
                COALESCE(array_agg(id ORDER BY change_xid, id), '{}'),
                COALESCE(array_agg(change_xid::text ORDER BY change_xid, id), '{}')
           FROM found",
    )
    .bind(at.xid.to_string())
    .bind(at.after)
    .bind(&filter.tenant)
    .bind(filter.run)
    .bind(BATCH)
    .fetch_one(pool)
    .await?;
    let horizon = horizon.parse().unwrap_or(at.xid);
    if ids.is_empty() {
        return Ok(Batch {
            runs: Vec::new(),
            horizon,
        });
    }
    let rows: Vec<super::view::RunRow> =
        sqlx::query_as(&format!("{RUN_SELECT} WHERE r.id = ANY($1)"))
            .bind(&ids)
            .fetch_all(pool)
            .await?;
    let mut views: std::collections::HashMap<Uuid, RunView> = rows
        .into_iter()
        .map(|row| (row.id, RunView::from(row)))
        .collect();
    let runs = ids
        .iter()
        .zip(&xids)
        .filter_map(|(id, xid)| {
            let position = Position {
                xid: xid.parse().ok()?,
                after: Some(*id),
            };
            views.remove(id).map(|view| (position, view))
        })
        .collect();
    Ok(Batch { runs, horizon })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_reads_back_as_it_was_written() {
        let id = Uuid::new_v4();
        for at in [
            Position {
                xid: 7,
                after: None,
            },
            Position {
                xid: 123_456_789_012,
                after: Some(id),
            },
        ] {
            assert_eq!(Position::parse(&at.text()), Some(at));
        }
        for bad in ["", "x", "7_", "7_zz", "-1", "7_1234"] {
            assert_eq!(Position::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_horizon_moves_a_position_only_forward() {
        let at = Position {
            xid: 10,
            after: Some(Uuid::nil()),
        };
        assert_eq!(at.max_with(9), at);
        assert_eq!(at.max_with(10), at);
        assert_eq!(
            at.max_with(11),
            Position {
                xid: 11,
                after: None
            }
        );
    }
}
