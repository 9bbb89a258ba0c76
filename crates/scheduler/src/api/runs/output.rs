//! A step's output, read from the artifact store its worker streams it to: all of it at
//! once, or followed as server-sent events while the step runs.

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::path_id;
use crate::api::AppState;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cairn_common::output::escape;
use cairn_snapshot::store::ArtifactStore;
use chrono::{DateTime, Utc};
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
    /// Follow the output as server-sent events until the step ends.
    pub follow: Option<bool>,
    /// Only the last this many bytes (1 to 1,048,576), read from the last chunks alone;
    /// not with `follow`.
    #[param(minimum = 1, maximum = 1048576)]
    pub tail_bytes: Option<u64>,
}

/// The largest `tail_bytes`.
const MAX_TAIL_BYTES: u64 = 1024 * 1024;

/// One server-sent event of a followed output.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutputEvent {
    /// `output` or `end`.
    pub event: String,
    /// JSON: `{"seq": N, "text": …}` for `output` (the bytes in the escaped text form),
    /// `{"epoch": N}` for `end`.
    pub data: String,
}

/// Where one step's output is.
struct StepOutput {
    request_id: Uuid,
    step_key: String,
    epoch: i64,
    store: ArtifactStore,
    /// `outputs/<request>/<epoch>/<step index>/<stream>/`.
    prefix: String,
}

/// A step's output (its latest attempt): `stdout` or `stderr`, as bytes; with
/// `follow=true`, `text/event-stream` events while it runs: `output` events, each
/// `{"seq": N, "text": …}` (the bytes in Cairn's escaped text form, see
/// `cairn_common::output`), then one `end` event, `{"epoch": N}`, when the attempt at
/// that lease epoch has ended (its receipt, or another attempt took the request).
#[utoipa::path(get, operation_id = "get_step_output", tag = "runs", path = "/api/v1/runs/{run_id}/steps/{step_key}/output",
    params(("run_id" = String, Path), ("step_key" = String, Path), OutputQuery),
    responses(
        (status = 200, description = "The output's bytes, or its events when following", content(
            (Vec<u8> = "application/octet-stream"),
            (OutputEvent = "text/event-stream"))),
        (status = 400, body = ErrorBody),
        (status = 404, description = "No such run, or the step has not started, or it has no live output", body = ErrorBody),
        (status = 409, description = "The output is in an artifact store this scheduler does not reach", body = ErrorBody),
        (status = 410, description = "Retention deleted the output (7 days after its run finished)", body = ErrorBody),
        (status = 422, description = "tail_bytes with follow", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn output(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, step_key)): Path<(String, String)>,
    query: Result<Query<OutputQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    if !cairn_common::run::valid_name(&step_key, 64) {
        return Err(ApiError::bad_request(
            "invalid_step_key",
            "a step key is 1 to 64 letters, digits, '.', '_' or '-'",
        )
        .with_field("step_key"));
    }
    let stream = match query.stream.as_deref().unwrap_or("stdout") {
        s @ ("stdout" | "stderr") => s,
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
    let step = locate(&state.pool, run_id, &step_key, stream).await?;
    if following {
        return Ok(follow(state.pool.clone(), step).into_response());
    }
    let keys = chunks(&step.store, &step.prefix).await?;
    // A tail reads chunks from the last one back, only as many as it needs.
    let mut parts = Vec::new();
    let mut have = 0usize;
    for key in keys.iter().rev() {
        if tail.is_some_and(|want| have >= want) {
            break;
        }
        let chunk = read(&step.store, key).await?;
        have += chunk.len();
        parts.push(chunk);
    }
    let mut bytes = Vec::with_capacity(have);
    for part in parts.iter().rev() {
        bytes.extend_from_slice(part);
    }
    if let Some(want) = tail {
        bytes.drain(..bytes.len().saturating_sub(want));
    }
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        bytes,
    )
        .into_response())
}

/// The latest attempt of `step_key` in the run, and its output's store.
async fn locate(
    pool: &PgPool,
    run_id: Uuid,
    step_key: &str,
    stream: &str,
) -> Result<StepOutput, ApiError> {
    let run: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_optional(pool)
        .await?;
    if run.is_none() {
        return Err(ApiError::not_found("run"));
    }
    type Intent = (
        Uuid,
        i64,
        i32,
        Option<Uuid>,
        Option<String>,
        Option<DateTime<Utc>>,
    );
    let intent: Option<Intent> = sqlx::query_as(
        "SELECT i.request_id, i.lease_epoch, i.step_index, i.output_store, i.output_store_url,
                e.output_reclaimed_at
           FROM journal_intents i JOIN execution_requests e ON e.id = i.request_id
          WHERE e.run_id = $1 AND i.step_key = $2
          ORDER BY i.started_at DESC LIMIT 1",
    )
    .bind(run_id)
    .bind(step_key)
    .fetch_optional(pool)
    .await?;
    let Some((request_id, epoch, index, store_id, url, reclaimed_at)) = intent else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("step {step_key} of this run has not started"),
        ));
    };
    if let Some(at) = reclaimed_at {
        return Err(ApiError::new(
            StatusCode::GONE,
            "output_reclaimed",
            format!("step {step_key}'s output was deleted by retention at {at}, 7 days after its run finished"),
        ));
    }
    let (Some(store_id), Some(url)) = (store_id, url) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("step {step_key} has no live output (it ran before this version kept any)"),
        ));
    };
    // The URL is the worker's: a local directory there may be another one here.
    let unreachable = |why: String| {
        ApiError::conflict(
            "output_unreachable",
            format!("step {step_key}'s output is in the artifact store {url}, which this scheduler does not reach ({why}); give workers a store every component reaches (CAIRN_SNAPSHOT_STORE_URL)"),
        )
    };
    let store = ArtifactStore::open_existing(&url).map_err(|e| unreachable(e.to_string()))?;
    // Only read: a reader never names a store it merely looked at.
    match store.existing_identity().await {
        Ok(found) if found == store_id => {}
        Ok(_) => return Err(unreachable("another store answers at that URL here".into())),
        Err(e) => return Err(unreachable(e.to_string())),
    }
    Ok(StepOutput {
        request_id,
        step_key: step_key.to_string(),
        epoch,
        store,
        prefix: cairn_common::output::live_stream_prefix(request_id, epoch, index.into(), stream),
    })
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

/// Whether the step's attempt at `epoch` has ended: its receipt or the end of its
/// interval is recorded, another attempt took over, or the request ended.
async fn ended(pool: &PgPool, step: &StepOutput) -> bool {
    let ended: Result<Option<bool>, _> = sqlx::query_scalar(
        "SELECT i.lease_epoch <> $2 OR i.ended_at IS NOT NULL OR e.lease_epoch <> $2
                OR e.state <> 'executing'
           FROM journal_intents i JOIN execution_requests e ON e.id = i.request_id
          WHERE i.request_id = $1 AND i.step_key = $3",
    )
    .bind(step.request_id)
    .bind(step.epoch)
    .bind(&step.step_key)
    .fetch_optional(pool)
    .await;
    // A failed read is read again at the next poll.
    matches!(ended, Ok(Some(true)) | Ok(None))
}

/// Follows the output: every chunk once, in order, then `end`. Position is the last
/// key sent, so no chunk is sent twice or out of order (one that lands after a later
/// one was sent is not sent at all); one that
/// cannot be read for [`STUCK_POLLS`] polls is skipped, leaving a gap in `seq`.
fn follow(
    pool: PgPool,
    step: StepOutput,
) -> Sse<impl futures::Stream<Item = Result<Event, std::convert::Infallible>>> {
    let state = Follower {
        pool,
        step,
        last: None,
        stuck: 0,
        done: false,
    };
    let events = futures::stream::unfold(state, |mut f| async move {
        if f.done {
            return None;
        }
        loop {
            // Read whether it ended before listing, so the last chunks are in the list.
            let ended = ended(&f.pool, &f.step).await;
            // A listing that failed says nothing: it is never taken for an empty one.
            if let Ok(keys) = chunks(&f.step.store, &f.step.prefix).await {
                let unsent: Vec<&String> = keys
                    .iter()
                    .filter(|k| f.last.as_ref().is_none_or(|last| *k > last))
                    .take(BATCH_CHUNKS)
                    .collect();
                let mut batch = Vec::new();
                let mut first = None;
                for key in &unsent {
                    match read(&f.step.store, key).await {
                        Ok(bytes) => {
                            batch.extend_from_slice(&bytes);
                            first.get_or_insert_with(|| sequence(key));
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
                    return Some((
                        Ok(Event::default().event("output").data(data.to_string())),
                        f,
                    ));
                }
                if ended && unsent.is_empty() {
                    f.done = true;
                    let data = serde_json::json!({"epoch": f.step.epoch});
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
    step: StepOutput,
    /// The key of the last chunk sent (or skipped).
    last: Option<String>,
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
