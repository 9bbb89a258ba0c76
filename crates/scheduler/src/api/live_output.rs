//! Live output read from the artifact store a worker streams it to (a run's step, a
//! sandbox's exec): all of it, its last bytes, or followed as server-sent events until
//! what writes it ends.

use crate::api::error::ApiError;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cairn_common::output::escape;
use cairn_snapshot::store::ArtifactStore;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// How often a follower looks for new chunks (workers upload every 250 ms).
const POLL: Duration = Duration::from_millis(250);
/// Chunks in one event, at most (each is at most 64 KiB).
const BATCH_CHUNKS: usize = 16;
/// Polls (of [`POLL`]) a chunk that is listed but unreadable is waited for.
const STUCK_POLLS: u32 = 40;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OutputQuery {
    /// `stdout` (the default) or `stderr`.
    #[param(pattern = "^(stdout|stderr)$")]
    pub stream: Option<String>,
    /// Follow the output as server-sent events until its step or command ends.
    pub follow: Option<bool>,
    /// Only the last this many bytes (1 to 1,048,576), read from the last chunks alone;
    /// not with `follow`.
    #[param(minimum = 1, maximum = 1048576)]
    pub tail_bytes: Option<u64>,
}

/// The largest `tail_bytes`.
pub const MAX_TAIL_BYTES: u64 = 1024 * 1024;

/// One server-sent event of a followed output.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutputEvent {
    /// `output` or `end`.
    pub event: String,
    /// JSON: `{"seq": N, "text": …}` for `output` (the bytes in the escaped text form),
    /// `{"epoch": N}` for `end`.
    pub data: String,
}

/// What writes an output, and so when it has ended.
pub enum Source {
    /// A run's step, at one attempt's lease epoch.
    Step {
        request_id: Uuid,
        step_key: String,
        epoch: i64,
    },
    /// A sandbox's exec, at its owner's lease epoch.
    Operation { id: Uuid, epoch: i64 },
}

impl Source {
    fn epoch(&self) -> i64 {
        match self {
            Source::Step { epoch, .. } | Source::Operation { epoch, .. } => *epoch,
        }
    }
}

/// Where one stream of an output is: its store and its chunks' prefix
/// (`outputs/<request or operation>/<epoch>/<index>/<stream>/`).
pub struct LiveStream {
    pub source: Source,
    pub store: ArtifactStore,
    pub prefix: String,
}

/// What a query asks: which stream, whether to follow, and how much of the tail.
pub struct Asked {
    pub stream: &'static str,
    pub following: bool,
    pub tail: Option<usize>,
    /// When following again: the `id` of the last `output` event the client had (its
    /// `Last-Event-ID`), `EPOCH:SEQ`; the stream goes on after that chunk if it follows
    /// the same attempt, and from the start of the one it follows now otherwise.
    pub after: Option<(i64, u64)>,
}

/// Checks the query's values together.
pub fn asked(query: &OutputQuery, headers: &HeaderMap) -> Result<Asked, ApiError> {
    let stream = match query.stream.as_deref().unwrap_or("stdout") {
        "stdout" => "stdout",
        "stderr" => "stderr",
        _ => {
            return Err(
                ApiError::bad_request("invalid_query", "stream is stdout or stderr")
                    .with_field("stream"),
            )
        }
    };
    let following = query.follow.unwrap_or(false);
    let tail = match query.tail_bytes {
        Some(n) if !(1..=MAX_TAIL_BYTES).contains(&n) => {
            return Err(
                ApiError::bad_request("invalid_query", "tail_bytes is from 1 to 1048576")
                    .with_field("tail_bytes"),
            )
        }
        // Each is valid alone, so the pair is a 422: a rule the document cannot state.
        Some(_) if following => {
            return Err(ApiError::unprocessable(
                "tail_bytes",
                "tail_bytes reads what was printed so far; it does not go with follow",
            ))
        }
        Some(n) => usize::try_from(n).ok(),
        None => None,
    };
    let after = last_event_id(headers)?
        .map(|id| {
            id.split_once(':')
                .and_then(|(epoch, seq)| Some((epoch.parse().ok()?, seq.parse().ok()?)))
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "invalid_query",
                        "Last-Event-ID is the id of an output event this API sent",
                    )
                    .with_field("last_event_id")
                })
        })
        .transpose()?;
    Ok(Asked {
        stream,
        following,
        tail,
        after,
    })
}

/// Opens the store a worker recorded (`url`, with its identity `store_id`) as this
/// scheduler reaches it; `what` names the output in the `409` when it does not.
pub async fn open(url: &str, store_id: Uuid, what: &str) -> Result<ArtifactStore, ApiError> {
    // The URL is the worker's: a local directory there may be another one here.
    let unreachable = |why: String| {
        ApiError::conflict(
            "output_unreachable",
            format!("{what} is in the artifact store {url}, which this scheduler does not reach ({why}); give workers a store every component reaches (CAIRN_SNAPSHOT_STORE_URL)"),
        )
    };
    let store = ArtifactStore::open_existing(url).map_err(|e| unreachable(e.to_string()))?;
    // Only read: a reader never names a store it merely looked at.
    match store.existing_identity().await {
        Ok(found) if found == store_id => Ok(store),
        Ok(_) => Err(unreachable("another store answers at that URL here".into())),
        Err(e) => Err(unreachable(e.to_string())),
    }
}

/// The answer to a read of `live`: its events while following, else its bytes (the
/// last `tail` only, read from the last chunks alone).
pub async fn respond(pool: &PgPool, live: LiveStream, asked: &Asked) -> Result<Response, ApiError> {
    if asked.following {
        return Ok(follow(pool.clone(), live, asked.after).into_response());
    }
    let keys = chunks(&live.store, &live.prefix).await?;
    let mut parts = Vec::new();
    let mut have = 0usize;
    for key in keys.iter().rev() {
        if asked.tail.is_some_and(|want| have >= want) {
            break;
        }
        let chunk = read(&live.store, key).await?;
        have += chunk.len();
        parts.push(chunk);
    }
    let mut bytes = Vec::with_capacity(have);
    for part in parts.iter().rev() {
        bytes.extend_from_slice(part);
    }
    if let Some(want) = asked.tail {
        bytes.drain(..bytes.len().saturating_sub(want));
    }
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        bytes,
    )
        .into_response())
}

/// The chunk keys under `prefix`, in order.
async fn chunks(store: &ArtifactStore, prefix: &str) -> Result<Vec<String>, ApiError> {
    let mut keys = store.list(prefix).await.map_err(store_error)?;
    keys.sort();
    Ok(keys)
}

async fn read(store: &ArtifactStore, key: &str) -> Result<bytes::Bytes, ApiError> {
    store.get(key).await.map_err(store_error)
}

fn store_error(e: cairn_snapshot::StoreError) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        format!("the artifact store did not answer: {e}"),
    )
}

/// Whether what writes the output has ended. A step's attempt at `epoch`: its receipt
/// or the end of its interval is recorded, another attempt took over, or the request
/// ended. A sandbox operation: it left `running`, or another owner took it.
async fn ended(pool: &PgPool, source: &Source) -> bool {
    let ended: Result<Option<bool>, _> = match source {
        Source::Step {
            request_id,
            step_key,
            epoch,
        } => {
            sqlx::query_scalar(
                "SELECT i.lease_epoch <> $2 OR i.ended_at IS NOT NULL OR e.lease_epoch <> $2
                        OR e.state <> 'executing'
                   FROM journal_intents i JOIN execution_requests e ON e.id = i.request_id
                  WHERE i.request_id = $1 AND i.step_key = $3",
            )
            .bind(request_id)
            .bind(epoch)
            .bind(step_key)
            .fetch_optional(pool)
            .await
        }
        Source::Operation { id, epoch } => {
            sqlx::query_scalar(
                "SELECT state <> 'running' OR lease_epoch IS DISTINCT FROM $2
                   FROM sandbox_operations WHERE id = $1",
            )
            .bind(id)
            .bind(epoch)
            .fetch_optional(pool)
            .await
        }
    };
    // A failed read is read again at the next poll.
    matches!(ended, Ok(Some(true)) | Ok(None))
}

/// Follows the output: every chunk once, in order, then `end`. Position is the last
/// key sent, so no chunk is sent twice or out of order (one that lands after a later
/// one was sent is not sent at all); one that
/// cannot be read for [`STUCK_POLLS`] polls is skipped, leaving a gap in `seq`.
fn follow(
    pool: PgPool,
    live: LiveStream,
    after: Option<(i64, u64)>,
) -> Sse<impl futures::Stream<Item = Result<Event, std::convert::Infallible>>> {
    // Another attempt's chunks are numbered anew: its position says nothing here.
    let after = after
        .filter(|(epoch, _)| *epoch == live.source.epoch())
        .map(|(_, seq)| seq);
    let state = Follower {
        pool,
        live,
        last: None,
        after,
        stuck: 0,
        done: false,
    };
    let events = futures::stream::unfold(state, |mut f| async move {
        if f.done {
            return None;
        }
        loop {
            // Read whether it ended before listing, so the last chunks are in the list.
            let ended = ended(&f.pool, &f.live.source).await;
            // A listing that failed says nothing: it is never taken for an empty one.
            if let Ok(keys) = chunks(&f.live.store, &f.live.prefix).await {
                let unsent: Vec<&String> = keys
                    .iter()
                    .filter(|k| f.last.as_ref().is_none_or(|last| *k > last))
                    .filter(|k| f.after.is_none_or(|after| sequence(k) > after))
                    .take(BATCH_CHUNKS)
                    .collect();
                let mut batch = Vec::new();
                let mut first = None;
                let mut through = 0;
                for key in &unsent {
                    match read(&f.live.store, key).await {
                        Ok(bytes) => {
                            batch.extend_from_slice(&bytes);
                            first.get_or_insert_with(|| sequence(key));
                            through = sequence(key);
                            f.last = Some((*key).clone());
                            f.stuck = 0;
                        }
                        Err(_) if f.stuck + 1 >= STUCK_POLLS => {
                            f.last = Some((*key).clone());
                            f.stuck = 0;
                        }
                        Err(_) => {
                            f.stuck += 1;
                            break;
                        }
                    }
                }
                if let Some(seq) = first {
                    let data = serde_json::json!({"seq": seq, "text": escape(&batch)});
                    // The id is the attempt and the batch's last chunk: a client that
                    // comes back with it as its Last-Event-ID gets what follows, nothing
                    // twice.
                    let event = Event::default()
                        .event("output")
                        .id(format!("{}:{through}", f.live.source.epoch()))
                        .data(data.to_string());
                    return Some((Ok(event), f));
                }
                if ended && unsent.is_empty() {
                    f.done = true;
                    let data = serde_json::json!({"epoch": f.live.source.epoch()});
                    return Some((Ok(Event::default().event("end").data(data.to_string())), f));
                }
            }
            tokio::time::sleep(POLL).await;
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

struct Follower {
    pool: PgPool,
    live: LiveStream,
    /// The key of the last chunk sent (or skipped).
    last: Option<String>,
    /// The client's Last-Event-ID: chunks up to it were sent on an earlier connection.
    after: Option<u64>,
    /// Polls the next chunk has failed to read.
    stuck: u32,
    done: bool,
}

/// A chunk's sequence number, from its key's last segment.
fn sequence(key: &str) -> u64 {
    key.rsplit('/')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_default()
}

/// The `Last-Event-ID` a reconnecting client sent, if any; one that is not text is a 400.
/// An empty one is none, as event streams treat it.
pub fn last_event_id(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    headers
        .get("last-event-id")
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.to_str().map_err(|_| {
                ApiError::bad_request("invalid_query", "Last-Event-ID is not text")
                    .with_field("last_event_id")
            })
        })
        .transpose()
}
