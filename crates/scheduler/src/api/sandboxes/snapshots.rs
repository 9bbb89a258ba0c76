//! Snapshots as resources: create (optionally named) from a running sandbox, list,
//! inspect, delete and restore into a new sandbox. Statuses: `creating → uploading →
//! ready | failed | quarantined`, `restoring` (while a sandbox is being created from
//! it) and `deleted` (by request or by retention; its bytes go with the reaper).

use super::create::{admit, restorable};
use super::lifecycle::{optional_body, remember, seen};
use super::operations::{await_receipt, record, MARGIN};
use super::view::{durability, OperationView};
use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::path_id;
use crate::api::query::StrictQuery;
use crate::api::AppState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::digest;
use cairn_common::ids::Id;
use cairn_common::sandbox::service::ServiceSpec;
use cairn_common::sandbox::{CreateSpec, Operation, SandboxState, SnapshotSpec};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// A sandbox's snapshot.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SnapshotView {
    #[schema(value_type = String)]
    pub snapshot_id: Id,
    #[schema(value_type = String)]
    pub sandbox_id: Id,
    /// `stop` (taken at a stop), `named` (on request) or `fork` (the capture a fork's
    /// sandboxes start from).
    pub kind: String,
    pub name: Option<String>,
    /// `creating`, `uploading`, `ready`, `restoring`, `failed`, `quarantined` or
    /// `deleted`.
    pub status: String,
    pub size_bytes: i64,
    /// `replicated` once it was read back whole from its store by a process on another
    /// node than the one that wrote it; else `local_only`.
    pub durability: String,
    pub created_at: DateTime<Utc>,
    pub deleted_at: Option<DateTime<Utc>>,
}

type SnapshotRow = (
    Uuid,
    Uuid,
    String,
    Option<String>,
    String,
    String,
    i64,
    Option<bool>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    bool,
);

const SELECT: &str = "SELECT p.id, p.sandbox_id, p.kind, p.name, p.status, p.retention, p.size_bytes,
        p.verified_node <> p.writer_node,
        p.created_at, p.retired_at,
        EXISTS (SELECT 1 FROM sandboxes s WHERE s.source_snapshot_id = p.id AND s.state = 'creating') AS restoring
   FROM project_snapshots p";

/// The kinds shown as snapshots (a sandbox's checkpoints are its journal's, not these).
const KINDS: &str = "p.sandbox_id IS NOT NULL AND p.kind IN ('stop', 'named', 'fork')";

fn snapshot_view(r: SnapshotRow) -> SnapshotView {
    let (id, sandbox, kind, name, status, retention, size, replicated, created, retired, restoring) =
        r;
    let deleted = status == "deleted" || retention != "current";
    let status = match status.as_str() {
        _ if deleted => "deleted".to_string(),
        "ready" if restoring => "restoring".to_string(),
        other => other.to_string(),
    };
    SnapshotView {
        snapshot_id: id.into(),
        sandbox_id: sandbox.into(),
        kind,
        name,
        status,
        size_bytes: size,
        durability: durability(replicated).to_string(),
        created_at: created,
        deleted_at: if deleted { retired } else { None },
    }
}

async fn load(conn: &mut PgConnection, id: Uuid) -> Result<SnapshotView, ApiError> {
    let row: Option<SnapshotRow> = sqlx::query_as(&format!("{SELECT} WHERE p.id = $1 AND {KINDS}"))
        .bind(id)
        .fetch_optional(conn)
        .await?;
    row.map(snapshot_view)
        .ok_or_else(|| ApiError::not_found("snapshot"))
}

/// A running sandbox, locked, or the `409` naming its state.
pub async fn running(conn: &mut PgConnection, id: Uuid, what: &str) -> Result<(), ApiError> {
    let row = super::lifecycle::lock(conn, id).await?;
    if row.state != SandboxState::Running || row.desired != "running" {
        return Err(ApiError::conflict(
            "invalid_state",
            format!(
                "the sandbox is {}{}: {what} needs it running",
                row.state,
                if row.desired != row.state.as_str() {
                    format!(" (being {})", row.desired)
                } else {
                    String::new()
                }
            ),
        )
        .with_field("state"));
    }
    Ok(())
}

/// Records an operation that needs the sandbox running (a snapshot, a fork), honouring
/// `Idempotency-Key` (a replay answers the operation the key became); then waits for
/// its receipt.
pub async fn submit_once(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    id: Uuid,
    operation: Operation,
    wait: std::time::Duration,
) -> Result<(StatusCode, OperationView, bool), ApiError> {
    let route = operation.kind();
    let key = crate::api::idempotency::key(headers)?
        .map(|k| format!("{}:{route}:{k}", caller.token_id.simple()));
    let digest = digest::of(&serde_json::json!({"sandbox": id, "operation": &operation}));
    let mut tx = state.pool.begin().await?;
    if let Some(key) = &key {
        if let Some(Some(operation_id)) = seen(&mut tx, key, &digest, id).await? {
            drop(tx);
            let (status, view) = await_receipt(state, operation_id, wait).await?;
            return Ok((status, view, true));
        }
    }
    running(&mut tx, id, route).await?;
    let operation_id = record(&mut tx, id, &operation).await?;
    if let Some(key) = &key {
        remember(&mut tx, key, &digest, id, Some(operation_id)).await?;
    }
    tx.commit().await?;
    state.metrics.sandbox_operations.inc();
    let (status, view) = await_receipt(state, operation_id, wait).await?;
    Ok((status, view, false))
}

/// The receipt's answer, or the `409` of an interrupted operation.
pub fn receipt(view: &OperationView) -> Result<serde_json::Value, ApiError> {
    let result = view.result.clone().unwrap_or_default();
    if view.state == "interrupted" || result.get("error").is_some() {
        return Err(ApiError::conflict(
            "not_captured",
            result["error"]
                .as_str()
                .unwrap_or("the capture did not finish")
                .to_string(),
        ));
    }
    Ok(result)
}

fn replayed(mut response: Response, replay: bool) -> Response {
    if replay {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

/// Snapshot a running sandbox (its disk; Cairn has no memory checkpoints). The source
/// does not change. Honours `Idempotency-Key`.
#[utoipa::path(post, operation_id = "create_snapshot", tag = "snapshots", path = "/api/v1/sandboxes/{sandbox_id}/snapshots",
    request_body(content = Option<SnapshotSpec>, description = "Optional"),
    params(("sandbox_id" = String, Path, description = "32 hex characters"),
        ("Idempotency-Key" = Option<String>, Header, description = "Same key and body: one snapshot; same key, other body: 409")),
    responses((status = 201, description = "Ready", body = SnapshotView),
        (status = 202, description = "Still capturing: read the operation", body = OperationView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "Not running, the capture failed, or the key reused", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(sandbox_id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    let spec: SnapshotSpec = optional_body(&body)?;
    spec.validate()?;
    let (status, view, replay) = submit_once(
        &state,
        &caller,
        &headers,
        id,
        Operation::Snapshot(spec),
        MARGIN,
    )
    .await?;
    if status == StatusCode::ACCEPTED {
        return Ok(replayed((status, Json(view)).into_response(), replay));
    }
    let result = receipt(&view)?;
    let snapshot = result["snapshot_id"]
        .as_str()
        .and_then(|s| Uuid::parse_str(s).ok())
        .ok_or_else(|| ApiError::conflict("not_captured", "the capture left no snapshot"))?;
    let mut conn = state.pool.acquire().await?;
    let snapshot = load(&mut conn, snapshot).await?;
    Ok(replayed(
        (StatusCode::CREATED, Json(snapshot)).into_response(),
        replay,
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only this sandbox's snapshots.
    #[param(pattern = "^[0-9a-f]{32}$")]
    pub sandbox_id: Option<String>,
    /// At most this many, newest first (1 to 500, default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotView>,
}

/// List snapshots, newest first.
#[utoipa::path(get, operation_id = "list_snapshots", tag = "snapshots", path = "/api/v1/snapshots", params(ListQuery),
    responses((status = 200, body = SnapshotList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    StrictQuery(query): StrictQuery<ListQuery>,
) -> Result<Json<SnapshotList>, ApiError> {
    caller.require(Role::Viewer)?;
    let sandbox = query
        .sandbox_id
        .as_deref()
        .map(|s| path_id(s, "sandbox_id"))
        .transpose()?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::bad_request("invalid_limit", "limit is 1 to 500").with_field("limit"));
    }
    let rows: Vec<SnapshotRow> = sqlx::query_as(&format!(
        "{SELECT} WHERE {KINDS} AND ($1::uuid IS NULL OR p.sandbox_id = $1)
            AND ($3::text IS NULL
                 OR p.sandbox_id IN (SELECT id FROM sandboxes WHERE tenant_id = $3))
          ORDER BY p.created_at DESC, p.id LIMIT $2"
    ))
    .bind(sandbox)
    .bind(limit)
    .bind(caller.scope())
    .fetch_all(&state.pool)
    .await?;
    Ok(Json(SnapshotList {
        snapshots: rows.into_iter().map(snapshot_view).collect(),
    }))
}

/// Inspect a snapshot.
#[utoipa::path(get, operation_id = "get_snapshot", tag = "snapshots", path = "/api/v1/snapshots/{snapshot_id}",
    params(("snapshot_id" = String, Path, description = "32 hex characters")),
    responses((status = 200, body = SnapshotView), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(snapshot_id): Path<String>,
) -> Result<Json<SnapshotView>, ApiError> {
    caller.require(Role::Viewer)?;
    let id = path_id(&snapshot_id, "snapshot_id")?;
    let mut conn = state.pool.acquire().await?;
    Ok(Json(load(&mut conn, id).await?))
}

/// Delete a snapshot: it becomes `deleted` at once and its bytes go with the reaper's
/// next reclaim. Sandboxes restored from it are unaffected (each has its own tree).
#[utoipa::path(delete, operation_id = "delete_snapshot", tag = "snapshots", path = "/api/v1/snapshots/{snapshot_id}",
    params(("snapshot_id" = String, Path, description = "32 hex characters")),
    responses((status = 200, body = SnapshotView), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "Still being captured, deleted already, or named by a template", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(snapshot_id): Path<String>,
) -> Result<Json<SnapshotView>, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&snapshot_id, "snapshot_id")?;
    let mut tx = state.pool.begin().await?;
    // Exclusive of a template's publication (which takes it for share).
    sqlx::query("SELECT 1 FROM project_snapshots WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let current = load(&mut tx, id).await?;
    if matches!(
        current.status.as_str(),
        "creating" | "uploading" | "deleted"
    ) {
        return Err(ApiError::conflict(
            "invalid_status",
            format!(
                "the snapshot is {}: it cannot be deleted now",
                current.status
            ),
        )
        .with_field("status"));
    }
    if cairn_common::sandbox::template::names_snapshot(&mut tx, id).await? {
        return Err(ApiError::conflict(
            "snapshot_in_template",
            "a template version names this snapshot, and a version never changes: it is kept",
        ));
    }
    let now = chrono::Utc::now();
    cairn_common::lineage::retention::retire(&mut tx, &[id], ("retired", "deleted"), now).await?;
    let view = load(&mut tx, id).await?;
    tx.commit().await?;
    Ok(Json(view))
}

/// The optional body of a restore: the new sandbox's settings.
#[derive(Debug, Default, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreSpec {
    pub timeout_sec: Option<u32>,
    pub idle_timeout_sec: Option<u32>,
    pub always_on: Option<bool>,
    pub persistent: Option<bool>,
    pub disk_mb: Option<u32>,
}

/// Restore a ready snapshot into a new sandbox (the snapshot and its sandbox never
/// change). A quarantined snapshot is never restored. Honours `Idempotency-Key`.
#[utoipa::path(post, operation_id = "restore_snapshot", tag = "snapshots", path = "/api/v1/snapshots/{snapshot_id}/restore",
    request_body(content = Option<RestoreSpec>, description = "Optional"),
    params(("snapshot_id" = String, Path, description = "32 hex characters"),
        ("Idempotency-Key" = Option<String>, Header, description = "Same key and body: the same sandbox; same key, other body: 409")),
    responses((status = 201, description = "The new sandbox, queued for placement", body = super::view::SandboxView),
        (status = 200, description = "Replay", body = super::view::SandboxView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "Not ready (or quarantined), or the key reused", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn restore(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(snapshot_id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&snapshot_id, "snapshot_id")?;
    let spec: RestoreSpec = optional_body(&body)?;
    let mut conn = state.pool.acquire().await?;
    // The new sandbox is the snapshot's tenant's, whose caller the guard let through.
    type Found = (
        String,
        String,
        Option<sqlx::types::Json<cairn_common::egress::NetworkSpec>>,
        sqlx::types::Json<std::collections::BTreeMap<String, String>>,
        Vec<i32>,
        sqlx::types::Json<std::collections::BTreeMap<String, ServiceSpec>>,
    );
    let found: Option<Found> = sqlx::query_as(&format!(
        "SELECT p.agent, s.tenant_id, s.network, s.metadata, s.ports, s.services FROM project_snapshots p JOIN sandboxes s ON s.id = p.sandbox_id
          WHERE p.id = $1 AND {KINDS}"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    // The new sandbox keeps its source's network policy (a restore never widens it) and
    // its labels, exposed ports and services.
    let (agent, tenant, network, metadata, ports, services) =
        found.ok_or_else(|| ApiError::not_found("snapshot"))?;
    restorable(&mut conn, id, &tenant).await?;
    drop(conn);
    let key = crate::api::idempotency::key(&headers)?
        .map(|k| format!("{}:restore:{k}", caller.token_id.simple()));
    let create = CreateSpec {
        agent,
        repository: None,
        git_ref: None,
        source: Some(format!("snapshot:{}", id.simple())),
        timeout_sec: spec.timeout_sec,
        idle_timeout_sec: spec.idle_timeout_sec,
        always_on: spec.always_on,
        persistent: spec.persistent,
        disk_mb: spec.disk_mb,
        network: network.map(|n| n.0),
        metadata: Some(metadata.0),
        template_id: None,
        ports: Some(
            ports
                .iter()
                .filter_map(|p| u16::try_from(*p).ok())
                .collect(),
        ),
        services: Some(services.0),
        // Volumes stay with the sandbox that has them: a restore attaches none.
        volumes: None,
    };
    admit(&state, &tenant, key, create).await
}
