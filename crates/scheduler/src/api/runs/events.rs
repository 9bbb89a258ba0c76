//! The runs that change, as server-sent events: the console's live list and run page.
//!
//! Each run row carries the id of the transaction that last wrote it (`change_xid`, set
//! by the database). A stream's position is a PostgreSQL snapshot whose visible rows
//! have all been sent ([`Position`]); a poll reads, in `(change_xid, id)` order, the rows
//! its own snapshot sees and that one did not, so a writer that commits after a later
//! one is read when it commits, and a transaction held open elsewhere holds back only
//! its own rows. The position is each event's `id`; a client that reconnects with it as
//! `Last-Event-ID` gets every run that changed since, once per change, and nothing it
//! already had. A stream lasts at most [`LIFETIME`], so a revoked token stops receiving
//! at its next reconnect.

use super::position::{Position, Snapshot};
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
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::time::{Duration, Instant};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// How often a stream looks for changes.
const POLL: Duration = Duration::from_millis(250);

/// The most runs one poll reads.
const BATCH: i64 = 200;

/// A reconnect that missed more changes than this gets a `reset` instead of them all.
const MAX_REPLAY: i64 = 1000;

/// How long one stream lasts before the server ends it (the client reconnects with its
/// last id, and its token is checked again).
pub const LIFETIME: Duration = Duration::from_secs(600);

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

/// The runs of the caller's tenant (or one run) as they change: `run` events, each with
/// the run as it is now (its state, cancel, pause or flow-control hold changed), and a
/// `ready` event once what changed since `Last-Event-ID` has been sent (without one,
/// the stream starts now). Comments keep the connection alive; the server ends a stream
/// after 10 minutes, and the client reconnects with its last id.
#[utoipa::path(get, operation_id = "get_run_events", tag = "runs", path = "/api/v1/runs/events",
    params(EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event the client had: the stream goes on after it")),
    responses(
        (status = 200, description = "Server-sent events", content((RunEvent = "text/event-stream"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 422, description = "A Last-Event-ID this stream did not write", body = ErrorBody)),
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
        .map(|text| Position::parse(text).ok_or_else(|| refused(text)))
        .transpose()?;
    let filter = Filter {
        tenant: caller.scope().map(str::to_string),
        run,
    };
    let now = Position::Caught {
        seen: current(&state.pool).await?,
    };
    let mut pending = Vec::new();
    let start = match asked {
        // A position from another server, or from before a restore, is reset.
        Some(from) if from.reach().xmax > now.reach().xmax => {
            pending.push(marker("reset", &now));
            now
        }
        Some(from) if behind(&state.pool, &filter, from.reach()).await? > MAX_REPLAY => {
            pending.push(marker("reset", &now));
            now
        }
        Some(from) => from,
        None => now,
    };
    let stream = Stream {
        pool: state.pool.clone(),
        filter,
        at: start,
        pending: pending.into(),
        ready_sent: false,
        opened: Instant::now(),
    };
    Ok(Sse::new(futures::stream::unfold(stream, next))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Why a `Last-Event-ID` is refused: a 400 when it is not made of what a position is
/// made of, a 422 when it is but is no position this stream wrote.
fn refused(text: &str) -> ApiError {
    let made_of = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c) || ":,;".contains(c);
    if text.len() <= 50_000 && !text.is_empty() && text.chars().all(made_of) {
        ApiError::unprocessable(
            "last_event_id",
            "Last-Event-ID is not the id of an event this stream sent",
        )
    } else {
        ApiError::bad_request(
            "invalid_query",
            "Last-Event-ID is not the id of an event this stream sent",
        )
        .with_field("last_event_id")
    }
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
    pending: std::collections::VecDeque<Event>,
    ready_sent: bool,
    opened: Instant,
}

/// The stream's next event: what a poll found, `ready` after the first poll that found
/// the replay done, or a wait for the next poll; none once its lifetime is over.
async fn next(mut s: Stream) -> Option<(Result<Event, std::convert::Infallible>, Stream)> {
    loop {
        if let Some(event) = s.pending.pop_front() {
            return Some((Ok(event), s));
        }
        if s.opened.elapsed() >= LIFETIME {
            return None;
        }
        match changed(&s.pool, &s.filter, &s.at).await {
            Ok(batch) => {
                for (position, run) in batch.runs {
                    // A run always serializes; were it not to, it is left out, never
                    // sent empty.
                    if let Ok(data) = serde_json::to_string(&run) {
                        let event = Event::default().event("run").id(position.text());
                        s.pending.push_back(event.data(data));
                    }
                }
                s.at = batch.next;
                if batch.caught_up && !s.ready_sent {
                    s.ready_sent = true;
                    s.pending.push_back(marker("ready", &s.at));
                }
                if !s.pending.is_empty() {
                    continue;
                }
            }
            // A failed read is read again at the next poll, from the same position.
            Err(e) => tracing::warn!(error = %e, "run events not read"),
        }
        tokio::time::sleep(POLL).await;
    }
}

fn marker(kind: &str, at: &Position) -> Event {
    Event::default().event(kind).id(at.text()).data("{}")
}

/// The database's snapshot now.
async fn current(pool: &PgPool) -> Result<Snapshot, sqlx::Error> {
    let text: String = sqlx::query_scalar("SELECT pg_current_snapshot()::text")
        .fetch_one(pool)
        .await?;
    parsed(&text)
}

/// A snapshot the database wrote; one that does not parse is the database's fault.
fn parsed(text: &str) -> Result<Snapshot, sqlx::Error> {
    Snapshot::parse(text)
        .ok_or_else(|| sqlx::Error::Protocol(format!("a snapshot that is not one: {text:?}")))
}

/// How many runs changed since `seen` (counted up to one past the replay's limit; from
/// the target of a position part way through a batch, whose rest is not counted).
async fn behind(pool: &PgPool, filter: &Filter, seen: &Snapshot) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM (
            SELECT 1 FROM runs r
             WHERE (r.change_xid >= pg_snapshot_xmax($1::pg_snapshot)
                    OR r.change_xid = ANY(ARRAY(SELECT pg_snapshot_xip($1::pg_snapshot))))
               AND ($2::text IS NULL OR r.tenant_id = $2)
               AND ($3::uuid IS NULL OR r.id = $3)
             LIMIT $4) x",
    )
    .bind(seen.text())
    .bind(&filter.tenant)
    .bind(filter.run)
    .bind(MAX_REPLAY + 1)
    .fetch_one(pool)
    .await
}

struct Batch {
    /// Each run read, with the position after it.
    runs: Vec<(Position, RunView)>,
    /// Where the stream stands after the batch.
    next: Position,
    /// Whether the batch read everything up to its target.
    caught_up: bool,
}

/// The next runs, in order, up to [`BATCH`]: those the target snapshot sees and `seen`
/// did not (the target is the statement's own snapshot when the stream is caught up).
/// The transactions `seen` did not see are those from its xmax on and those it lists as
/// running, both read on the index; a row written by a transaction from beyond the
/// target's xmax (copied by a restore) is not read until the server's ids pass it.
async fn changed(pool: &PgPool, filter: &Filter, at: &Position) -> Result<Batch, sqlx::Error> {
    let (seen, target, after) = match at {
        Position::Caught { seen } => (seen, None, None),
        Position::Within {
            seen,
            target,
            xid,
            run,
        } => (seen, Some(target), Some((*xid, *run))),
    };
    let (now, ids, xids): (String, Vec<Uuid>, Vec<String>) = sqlx::query_as(
        "WITH found AS (
                SELECT r.id, r.change_xid FROM runs r
                 WHERE (r.change_xid >= pg_snapshot_xmax($1::pg_snapshot)
                        OR r.change_xid = ANY(ARRAY(SELECT pg_snapshot_xip($1::pg_snapshot))))
                   AND r.change_xid < pg_snapshot_xmax(COALESCE($2::pg_snapshot, pg_current_snapshot()))
                   AND ($2::text IS NULL OR pg_visible_in_snapshot(r.change_xid, $2::pg_snapshot))
                   AND ($3::text IS NULL OR (r.change_xid, r.id) > ($3::xid8, $4::uuid))
                   AND ($5::text IS NULL OR r.tenant_id = $5)
                   AND ($6::uuid IS NULL OR r.id = $6)
                 ORDER BY r.change_xid, r.id
                 LIMIT $7)
         SELECT pg_current_snapshot()::text,
                COALESCE(array_agg(id ORDER BY change_xid, id), '{}'),
                COALESCE(array_agg(change_xid::text ORDER BY change_xid, id), '{}')
           FROM found",
    )
    .bind(seen.text())
    .bind(target.map(Snapshot::text))
    .bind(after.map(|(xid, _)| xid.to_string()))
    .bind(after.map(|(_, run)| run))
    .bind(&filter.tenant)
    .bind(filter.run)
    .bind(BATCH)
    .fetch_one(pool)
    .await?;
    let now = parsed(&now)?;
    let target = target.cloned().unwrap_or(now);
    let caught_up = (ids.len() as i64) < BATCH;
    let views = load(pool, &ids).await?;
    let mut runs = Vec::new();
    let mut last = None;
    for (id, xid) in ids.iter().zip(&xids) {
        let xid = xid
            .parse::<u64>()
            .map_err(|_| sqlx::Error::Protocol(format!("an xid that is not one: {xid:?}")))?;
        let position = Position::Within {
            seen: seen.clone(),
            target: target.clone(),
            xid,
            run: *id,
        };
        last = Some(position.clone());
        if let Some(view) = views.get(id) {
            runs.push((position, view.clone()));
        }
    }
    let next = match last {
        Some(last) if !caught_up => last,
        _ => Position::Caught { seen: target },
    };
    Ok(Batch {
        runs,
        next,
        caught_up,
    })
}

/// The runs `ids` as the API shows them.
async fn load(
    pool: &PgPool,
    ids: &[Uuid],
) -> Result<std::collections::HashMap<Uuid, RunView>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Default::default());
    }
    let rows: Vec<super::view::RunRow> =
        sqlx::query_as(&format!("{RUN_SELECT} WHERE r.id = ANY($1)"))
            .bind(ids)
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.id, RunView::from(row)))
        .collect())
}
