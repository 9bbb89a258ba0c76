//! An exec's output, streamed by the sandbox's worker to its artifact store as the
//! command prints it: all of it, its last bytes, or followed as server-sent events until
//! the command ends ([`crate::api::live_output`]).

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::live_output::{self, LiveStream, OutputEvent, OutputQuery, Source};
use crate::api::path_id;
use crate::api::AppState;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use std::time::Duration;
use uuid::Uuid;

/// An exec's output: `stdout` or `stderr`, as bytes; with `follow=true`,
/// `text/event-stream` events while the command runs: `output` events, each `{"seq": N,
/// "text": …}` (the bytes in Cairn's escaped text form), then one `end` event, `{"epoch":
/// N}`, when the command has ended (its receipt is then in the operation). Each `output`
/// event's `id`, sent back as `Last-Event-ID`, resumes the stream after it.
#[utoipa::path(get, operation_id = "get_operation_output", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}/operations/{operation_id}/output",
    params(("sandbox_id" = String, Path), ("operation_id" = String, Path), OutputQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "With follow: the id of the last output event had; the stream goes on after it")),
    responses(
        (status = 200, description = "The output's bytes, or its events when following", content(
            (Vec<u8> = "application/octet-stream"),
            (OutputEvent = "text/event-stream"))),
        (status = 400, body = ErrorBody),
        (status = 404, description = "No such sandbox or exec, or it has not started", body = ErrorBody),
        (status = 409, description = "The output is in an artifact store this scheduler does not reach", body = ErrorBody),
        (status = 410, description = "Retention deleted the output (7 days after the exec ended)", body = ErrorBody),
        (status = 422, description = "tail_bytes with follow", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn output(
    State(state): State<AppState>,
    caller: Caller,
    Path((sandbox_id, operation_id)): Path<(String, String)>,
    query: Result<Query<OutputQuery>, axum::extract::rejection::QueryRejection>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    caller.require(Role::Viewer)?;
    let sandbox = path_id(&sandbox_id, "sandbox_id")?;
    let operation = path_id(&operation_id, "operation_id")?;
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let asked = live_output::asked(&query, &headers)?;
    let started = if asked.following {
        START_WITHIN
    } else {
        Duration::ZERO
    };
    let live = locate(&state, sandbox, operation, asked.stream, started).await?;
    live_output::respond(&state.pool, live, &asked).await
}

/// How long a follower of an exec still pending waits for its worker to start it.
const START_WITHIN: Duration = Duration::from_secs(60);

/// The exec `operation` of `sandbox`, and its output's store; one still pending is
/// waited for up to `started` (a follower's) for its worker to start it.
async fn locate(
    state: &AppState,
    sandbox: Uuid,
    operation: Uuid,
    stream: &str,
    started: Duration,
) -> Result<LiveStream, ApiError> {
    type Row = (
        String,
        String,
        Option<i64>,
        Option<Uuid>,
        Option<String>,
        Option<DateTime<Utc>>,
    );
    let read = || async {
        let row: Option<Row> = sqlx::query_as(
            "SELECT kind, state, lease_epoch, output_store, output_store_url, output_reclaimed_at
               FROM sandbox_operations WHERE id = $1 AND sandbox_id = $2",
        )
        .bind(operation)
        .bind(sandbox)
        .fetch_optional(&state.pool)
        .await?;
        row.ok_or_else(|| ApiError::not_found("operation"))
    };
    // Only an exec still pending is waited for: another kind has no output to follow.
    let pending = |row: &Row| row.0 == "exec" && row.1 == "pending";
    let every = Duration::from_millis(50);
    let ((kind, _, epoch, store_id, url, reclaimed_at), _) =
        crate::api::poll::until(started, every, read, |row| !pending(row)).await?;
    if kind != "exec" {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "operation {} is a {kind}: only an exec has output",
                operation.simple()
            ),
        ));
    }
    if let Some(at) = reclaimed_at {
        return Err(ApiError::new(
            StatusCode::GONE,
            "output_reclaimed",
            format!("the exec's output was deleted by retention at {at}, 7 days after it ended"),
        ));
    }
    let (Some(epoch), Some(store_id), Some(url)) = (epoch, store_id, url) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "the exec has not started, or it ran before this version kept its output live",
        ));
    };
    let store = live_output::open(&url, store_id, "the exec's output").await?;
    Ok(LiveStream {
        source: Source::Operation {
            id: operation,
            epoch,
        },
        store,
        prefix: cairn_common::output::live_stream_prefix(operation, epoch, 0, stream),
    })
}
