//! A step's output, read from the artifact store its worker streams it to
//! ([`crate::api::live_output`]): all of it at once, or followed as server-sent events
//! while the step runs.

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::live_output::{self, LiveStream, OutputEvent, OutputQuery, Source};
use crate::api::path_id;
use crate::api::AppState;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// A step's output (its latest attempt): `stdout` or `stderr`, as bytes; with
/// `follow=true`, `text/event-stream` events while it runs: `output` events, each
/// `{"seq": N, "text": …}` (the bytes in Cairn's escaped text form, see
/// `cairn_common::output`), then one `end` event, `{"epoch": N}`, when the attempt at
/// that lease epoch has ended (its receipt, or another attempt took the request). Each
/// `output` event's `id` is `EPOCH:SEQ`, the attempt and its last chunk: sent back as
/// `Last-Event-ID`, the stream goes on after it (from the start of another attempt), so a
/// reconnect shows nothing twice.
#[utoipa::path(get, operation_id = "get_step_output", tag = "runs", path = "/api/v1/runs/{run_id}/steps/{step_key}/output",
    params(("run_id" = String, Path), ("step_key" = String, Path), OutputQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "With follow: the id of the last output event had; the stream goes on after it")),
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
    headers: axum::http::HeaderMap,
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
    let asked = live_output::asked(&query, &headers)?;
    let live = locate(&state.pool, run_id, &step_key, asked.stream).await?;
    live_output::respond(&state.pool, live, &asked).await
}

/// The latest attempt of `step_key` in the run, and its output's store.
async fn locate(
    pool: &PgPool,
    run_id: Uuid,
    step_key: &str,
    stream: &str,
) -> Result<LiveStream, ApiError> {
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
    let what = format!("step {step_key}'s output");
    let store = live_output::open(&url, store_id, &what).await?;
    Ok(LiveStream {
        source: Source::Step {
            request_id,
            step_key: step_key.to_string(),
            epoch,
        },
        store,
        prefix: cairn_common::output::live_stream_prefix(request_id, epoch, index.into(), stream),
    })
}
