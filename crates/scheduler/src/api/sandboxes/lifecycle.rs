//! Stop, resume, destroy and extend. Each decides on the locked row through the
//! transition table: a move the seed's diagram does not have is a `409` naming the
//! current state. What needs the sandbox's worker (a stop's capture, a destroy of a
//! running tree) is asked of it through `desired`; the reply waits for it up to
//! `wait_seconds`, then answers `202` with the sandbox as it is.

use super::view::{self, SandboxView};
use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::json;
use crate::api::path_id;
use crate::api::query::StrictQuery;
use crate::api::AppState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::digest;
use cairn_common::request::table::Machine;
use cairn_common::sandbox::spec::check_timeout;
use cairn_common::sandbox::{record, SandboxEvent, SandboxState};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    /// Seconds to wait for the worker before answering 202 (0 to 60, default 30).
    #[param(minimum = 0, maximum = 60)]
    pub wait_seconds: Option<u64>,
}

impl WaitQuery {
    pub fn wait(&self) -> Result<Duration, ApiError> {
        match self.wait_seconds.unwrap_or(30) {
            seconds @ 0..=60 => Ok(Duration::from_secs(seconds)),
            _ => Err(
                ApiError::bad_request("invalid_wait", "wait_seconds is 0 to 60")
                    .with_field("wait_seconds"),
            ),
        }
    }
}

/// The row a lifecycle call decides on, locked.
pub struct Locked {
    pub state: SandboxState,
    pub desired: String,
    pub persistent: bool,
    /// A worker holds a live lease on it.
    pub owned: bool,
}

pub async fn lock(conn: &mut PgConnection, id: Uuid) -> Result<Locked, ApiError> {
    let row: Option<(SandboxState, String, bool, bool)> = sqlx::query_as(
        "SELECT state, desired, persistent,
                COALESCE(lease_owner IS NOT NULL AND lease_deadline > clock_timestamp(), FALSE)
           FROM sandboxes WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?;
    let (state, desired, persistent, owned) = row.ok_or_else(|| ApiError::not_found("sandbox"))?;
    Ok(Locked {
        state,
        desired,
        persistent,
        owned,
    })
}

/// A `409` for a move the diagram does not have from `state`.
pub fn invalid_state(state: SandboxState, event: SandboxEvent) -> ApiError {
    let (sources, _) = SandboxState::rule(event);
    let allowed: Vec<&str> = sources.iter().map(|s| s.as_str()).collect();
    ApiError::conflict(
        "invalid_state",
        format!(
            "the sandbox is {state}: {event} needs it {}",
            allowed.join(" or ")
        ),
    )
    .with_field("state")
}

/// Fails with the `409` unless `event` may leave `state`.
pub fn allowed(state: SandboxState, event: SandboxEvent) -> Result<(), ApiError> {
    match state.next(event) {
        Some(_) => Ok(()),
        None => Err(invalid_state(state, event)),
    }
}

/// Waits until `done` holds of the sandbox or `wait` passes; `200` with it then, or
/// `202` with the sandbox as it is.
pub async fn reply_when(
    pool: &PgPool,
    id: Uuid,
    wait: Duration,
    done: impl Fn(&SandboxView) -> bool,
) -> Result<Response, ApiError> {
    let read = || async {
        let mut conn = pool.acquire().await?;
        view::require(&mut conn, id).await
    };
    let every = Duration::from_millis(50);
    let (view, done) = crate::api::poll::until(wait, every, read, done).await?;
    let status = if done {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(view)).into_response())
}

/// Asks the owner for `desired`, or (`stopped` with nobody to ask) leaves it to the
/// sweeper, which stops it at its last durable tree.
async fn ask(conn: &mut PgConnection, id: Uuid, desired: &str) -> Result<(), sqlx::Error> {
    cairn_common::sandbox::ask::desire(conn, id, desired).await
}

/// Stop a running (or paused) sandbox: its processes end, its tree is captured as the
/// stop snapshot, and its worker slot is released. Files survive; processes do not.
#[utoipa::path(post, operation_id = "stop_sandbox", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}/stop",
    params(("sandbox_id" = String, Path, description = "32 hex characters"), WaitQuery),
    responses((status = 200, description = "Stopped", body = SandboxView),
        (status = 202, description = "Stopping: the worker has not finished the capture yet", body = SandboxView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "Not running or paused", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn stop(
    State(state): State<AppState>,
    caller: Caller,
    Path(sandbox_id): Path<String>,
    StrictQuery(query): StrictQuery<WaitQuery>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    let wait = query.wait()?;
    let mut tx = state.pool.begin().await?;
    let row = lock(&mut tx, id).await?;
    allowed(row.state, SandboxEvent::Stop)?;
    if row.desired != "destroyed" {
        cairn_common::sandbox::ask::stop(&mut tx, id, "requested").await?;
    }
    tx.commit().await?;
    reply_when(&state.pool, id, wait, |v| {
        v.state != SandboxState::Running && v.state != SandboxState::Paused
    })
    .await
}

/// Pause a running sandbox: its processes are frozen in place (an exec in progress
/// finishes first), for at most the worker's pause limit (30 minutes by default), after
/// which it behaves like a stop. Cairn keeps no memory checkpoint: a pause that outlives
/// its worker resumes from the disk.
#[utoipa::path(post, operation_id = "pause_sandbox", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}/pause",
    params(("sandbox_id" = String, Path, description = "32 hex characters"), WaitQuery),
    responses((status = 200, description = "Paused", body = SandboxView),
        (status = 202, description = "Pausing: its worker has not frozen it yet", body = SandboxView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "Not running", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn pause(
    State(state): State<AppState>,
    caller: Caller,
    Path(sandbox_id): Path<String>,
    StrictQuery(query): StrictQuery<WaitQuery>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    let wait = query.wait()?;
    let mut tx = state.pool.begin().await?;
    let row = lock(&mut tx, id).await?;
    allowed(row.state, SandboxEvent::Pause)?;
    if row.desired != "running" {
        return Err(ApiError::conflict(
            "invalid_state",
            format!(
                "the sandbox is {} and being {}: pause needs it running",
                row.state, row.desired
            ),
        )
        .with_field("state"));
    }
    ask(&mut tx, id, "paused").await?;
    tx.commit().await?;
    reply_when(&state.pool, id, wait, |v| v.state != SandboxState::Running).await
}

/// The optional body of resume: the disk may grow here, never shrink.
#[derive(Debug, Default, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeSpec {
    /// A larger disk, in MiB; a smaller one is a 409.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u32>,
}

/// An optional JSON body: empty (or `null`) is the default.
pub fn optional_body<T: serde::de::DeserializeOwned + Default>(
    body: &Bytes,
) -> Result<T, ApiError> {
    let text = body.trim_ascii();
    if text.is_empty() || text == b"null" {
        Ok(T::default())
    } else {
        json::decode(body)
    }
}

/// Grows the disk; a shrink is a 409.
pub async fn grow_disk(
    conn: &mut PgConnection,
    id: Uuid,
    disk_mb: Option<u32>,
) -> Result<(), ApiError> {
    let Some(disk_mb) = disk_mb else {
        return Ok(());
    };
    cairn_common::sandbox::spec::check_disk(disk_mb)?;
    let wanted = i32::try_from(disk_mb).unwrap_or(i32::MAX);
    let current: i32 = sqlx::query_scalar("SELECT disk_mb FROM sandboxes WHERE id = $1")
        .bind(id)
        .fetch_one(&mut *conn)
        .await?;
    if wanted < current {
        return Err(ApiError::conflict(
            "disk_shrink",
            format!("the disk is {current} MiB and never shrinks"),
        )
        .with_field("disk_mb"));
    }
    cairn_common::sandbox::ask::grow_disk(conn, id, wanted).await?;
    Ok(())
}

/// Resumes a stopped or paused sandbox inside the caller's transaction: a paused one
/// thaws in place; a stopped one is placed again and restores its last durable tree on
/// any worker. `false` when it was already being resumed.
pub async fn resume_in(conn: &mut PgConnection, id: Uuid, row: &Locked) -> Result<bool, ApiError> {
    allowed(row.state, SandboxEvent::Resume)?;
    if row.desired == "running" {
        return Ok(false);
    }
    ask(conn, id, "running").await?;
    if row.state == SandboxState::Stopped || !row.owned {
        cairn_common::sandbox::ask::place_again(conn, id, true).await?;
    }
    Ok(true)
}

/// Resume a stopped or paused sandbox. Honours `Idempotency-Key`: the same key and body
/// answer the sandbox without resuming it again.
#[utoipa::path(post, operation_id = "resume_sandbox", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}/resume",
    request_body(content = Option<ResumeSpec>, description = "Optional"),
    params(("sandbox_id" = String, Path, description = "32 hex characters"), WaitQuery,
        ("Idempotency-Key" = Option<String>, Header, description = "Same key and body: one resume; same key, other body: 409")),
    responses((status = 200, description = "Running", body = SandboxView),
        (status = 202, description = "Resuming: no worker has restored it yet", body = SandboxView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Not stopped or paused, a disk shrink, or the key reused", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(sandbox_id): Path<String>,
    StrictQuery(query): StrictQuery<WaitQuery>,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    let wait = query.wait()?;
    let spec: ResumeSpec = optional_body(&body)?;
    let key = crate::api::idempotency::key(&headers)?
        .map(|k| format!("{}:resume:{k}", caller.token_id.simple()));
    let digest = digest::of(&serde_json::json!({"sandbox": id, "body": spec}));
    let mut tx = state.pool.begin().await?;
    if let Some(key) = &key {
        if seen(&mut tx, key, &digest, id).await?.is_some() {
            drop(tx);
            let mut response = reply_when(&state.pool, id, Duration::ZERO, |_| true).await?;
            response
                .headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            return Ok(response);
        }
    }
    let row = lock(&mut tx, id).await?;
    allowed(row.state, SandboxEvent::Resume)?;
    grow_disk(&mut tx, id, spec.disk_mb).await?;
    resume_in(&mut tx, id, &row).await?;
    if let Some(key) = &key {
        remember(&mut tx, key, &digest, id, None).await?;
    }
    tx.commit().await?;
    reply_when(&state.pool, id, wait, |v| v.state == SandboxState::Running).await
}

/// Whether this key was used: `Some` with the same input (a replay: the operation it
/// became, if any), a `409` with other input.
pub async fn seen(
    conn: &mut PgConnection,
    key: &str,
    digest: &str,
    id: Uuid,
) -> Result<Option<Option<Uuid>>, ApiError> {
    let stored: Option<(String, Uuid, Option<Uuid>)> = sqlx::query_as(
        "SELECT request_digest, sandbox_id, operation_id FROM sandbox_idempotency WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_optional(conn)
    .await?;
    match stored {
        None => Ok(None),
        Some((stored, sandbox, operation)) if stored == digest && sandbox == id => {
            Ok(Some(operation))
        }
        Some(_) => Err(ApiError::conflict(
            "idempotency_key_conflict",
            "this Idempotency-Key was used with a different request; nothing was changed",
        )
        .with_field("Idempotency-Key")),
    }
}

/// Records a key's first use (and the operation it became), in the transaction that
/// carries it out.
pub async fn remember(
    conn: &mut PgConnection,
    key: &str,
    digest: &str,
    id: Uuid,
    operation: Option<Uuid>,
) -> Result<(), ApiError> {
    cairn_common::sandbox::operations::remember_key(conn, key, digest, id, operation).await?;
    Ok(())
}

/// Destroy a sandbox (or delete an `error` record): everything is released; its
/// snapshots are deleted after the reaper's grace.
#[utoipa::path(delete, operation_id = "destroy_sandbox", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}",
    params(("sandbox_id" = String, Path, description = "32 hex characters"), WaitQuery),
    responses((status = 200, description = "Destroyed", body = SandboxView),
        (status = 202, description = "Destroying: its worker has not released it yet", body = SandboxView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "Creating, or destroyed already", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn destroy(
    State(state): State<AppState>,
    caller: Caller,
    Path(sandbox_id): Path<String>,
    StrictQuery(query): StrictQuery<WaitQuery>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    let wait = query.wait()?;
    let mut tx = state.pool.begin().await?;
    let row = lock(&mut tx, id).await?;
    let event = match row.state {
        SandboxState::Error => SandboxEvent::Delete,
        _ => SandboxEvent::Destroy,
    };
    allowed(row.state, event)?;
    if row.owned {
        // Its worker ends its processes and removes its tree.
        ask(&mut tx, id, "destroyed").await?;
    } else {
        record::destroy_unowned(&mut tx, id, event).await?;
    }
    tx.commit().await?;
    reply_when(&state.pool, id, wait, |v| {
        v.state == SandboxState::Destroyed
    })
    .await
}

/// The body of extend: the new timeout, which replaces the current one; an empty body
/// keeps it.
#[derive(Debug, Default, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendSpec {
    #[schema(minimum = 1, maximum = 86400)]
    pub timeout_sec: Option<u32>,
}

/// Replace a sandbox's timeout (not added to it); an empty body keeps it. It counts
/// from the last activity, and a call counts as activity.
#[utoipa::path(post, operation_id = "extend_sandbox", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}/extend",
    request_body(content = Option<ExtendSpec>, description = "Optional"),
    params(("sandbox_id" = String, Path, description = "32 hex characters")),
    responses((status = 200, body = SandboxView), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "In error, or destroyed", body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn extend(
    State(state): State<AppState>,
    caller: Caller,
    Path(sandbox_id): Path<String>,
    body: Bytes,
) -> Result<Json<SandboxView>, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    let spec: ExtendSpec = optional_body(&body)?;
    if let Some(timeout) = spec.timeout_sec {
        check_timeout(timeout, "timeout_sec")?;
    }
    let mut tx = state.pool.begin().await?;
    let row = lock(&mut tx, id).await?;
    if matches!(row.state, SandboxState::Error | SandboxState::Destroyed) {
        return Err(ApiError::conflict(
            "invalid_state",
            format!("the sandbox is {}: it has no timeout to extend", row.state),
        )
        .with_field("state"));
    }
    let timeout = spec
        .timeout_sec
        .map(|t| i32::try_from(t).unwrap_or(i32::MAX));
    cairn_common::sandbox::ask::extend(&mut tx, id, timeout).await?;
    let view = view::require(&mut tx, id).await?;
    tx.commit().await?;
    Ok(Json(view))
}
