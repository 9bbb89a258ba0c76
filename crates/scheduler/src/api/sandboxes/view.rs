//! Reading sandboxes: one sandbox, a page of them, and its operations.

use crate::api::auth::{Caller, Role};
use crate::api::cursor;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::path_id;
use crate::api::AppState;
use axum::extract::{Path, Query, RawQuery, State};
use axum::Json;
use cairn_common::ids::Id;
use cairn_common::sandbox::service::ServiceSpec;
use cairn_common::sandbox::SandboxState;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// A sandbox.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxView {
    #[schema(value_type = String)]
    pub sandbox_id: Id,
    /// The tenant it belongs to.
    pub tenant: String,
    pub agent: String,
    pub state: SandboxState,
    /// What was asked of it and is not done yet (`stopped` while a stop captures), or
    /// absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<String>,
    pub persistent: bool,
    pub always_on: bool,
    pub timeout_sec: i32,
    pub idle_timeout_sec: i32,
    pub disk_mb: i32,
    /// Its commands' network as created: `true`, `false` or `{"allow": [...]}` (narrowing
    /// the worker's egress policy); absent: the worker's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<cairn_common::egress::NetworkSpec>,
    /// The tenant's layer of the egress policy as it stands (absent: it narrows
    /// nothing). The sandbox's network is the operator's policy narrowed by this, then
    /// by `network`, fixed when it starts or resumes; each exec receipt's
    /// `sandbox.egress` says what the exec had.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_network: Option<cairn_common::egress::NetworkSpec>,
    pub repository: Option<String>,
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    /// `snapshot:<id>` when it started from a snapshot.
    pub source: Option<String>,
    /// Why it stopped: `requested`, `timeout`, `pause_expired`, `worker_lost`,
    /// `worker_drained`.
    pub stop_reason: Option<String>,
    /// Why it is in `error`.
    pub error_reason: Option<String>,
    /// `replicated` once its latest snapshot was read back whole from its store by a
    /// process on another node than the one that wrote it (the reaper); else
    /// `local_only`: its bytes may be on one host only.
    pub durability: String,
    /// The latest stop snapshot, kept for the sandbox's life.
    #[schema(value_type = Option<String>)]
    pub stop_snapshot_id: Option<Id>,
    pub last_activity_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub stopped_at: Option<DateTime<Utc>>,
    pub destroyed_at: Option<DateTime<Utc>>,
    /// Its labels, as created (a fork: its source's).
    pub metadata: BTreeMap<String, String>,
    /// The template version it started from, if any.
    #[schema(value_type = Option<String>)]
    pub template_id: Option<Id>,
    /// The ports a preview reaches.
    pub ports: Vec<u16>,
    /// Its services by name, started on every start and resume.
    pub services: BTreeMap<String, ServiceSpec>,
    /// The names of the volumes it has attached, each at `/volumes/<name>`.
    pub volumes: Vec<String>,
}

#[derive(sqlx::FromRow)]
struct Row {
    id: Uuid,
    tenant_id: String,
    agent: String,
    state: SandboxState,
    desired: String,
    persistent: bool,
    always_on: bool,
    timeout_sec: i32,
    idle_timeout_sec: i32,
    disk_mb: i32,
    network: Option<sqlx::types::Json<cairn_common::egress::NetworkSpec>>,
    tenant_network: Option<sqlx::types::Json<cairn_common::egress::NetworkSpec>>,
    repository: Option<String>,
    git_ref: Option<String>,
    source_snapshot_id: Option<Uuid>,
    stop_reason: Option<String>,
    error_reason: Option<String>,
    replicated: Option<bool>,
    stop_snapshot_id: Option<Uuid>,
    last_activity_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    stopped_at: Option<DateTime<Utc>>,
    destroyed_at: Option<DateTime<Utc>>,
    metadata: sqlx::types::Json<BTreeMap<String, String>>,
    template_id: Option<Uuid>,
    ports: Vec<i32>,
    services: sqlx::types::Json<BTreeMap<String, ServiceSpec>>,
    volumes: Vec<String>,
}

const SELECT: &str = "SELECT s.id, s.tenant_id, s.agent, s.state, s.desired, s.persistent, s.always_on, s.timeout_sec,
        s.idle_timeout_sec, s.disk_mb, s.network, s.repository, s.git_ref, s.source_snapshot_id, s.stop_reason,
        s.error_reason, s.stop_snapshot_id, s.last_activity_at, s.created_at, s.updated_at, s.stopped_at,
        s.destroyed_at, s.metadata, s.template_id, s.ports, s.services,
        (SELECT p.verified_node <> p.writer_node FROM project_snapshots p
          WHERE p.sandbox_id = s.id AND p.status = 'ready' AND p.retention = 'current'
          ORDER BY p.created_at DESC LIMIT 1) AS replicated,
        np.network AS tenant_network,
        ARRAY(SELECT v.name FROM volumes v WHERE v.attached_to = s.id ORDER BY v.name) AS volumes
   FROM sandboxes s LEFT JOIN network_policy np ON np.tenant_id = s.tenant_id";

/// `replicated` for a snapshot read back by another node than its writer's (the
/// query's `verified_node <> writer_node`, NULL while either is unknown).
pub fn durability(replicated: Option<bool>) -> &'static str {
    if replicated == Some(true) {
        "replicated"
    } else {
        "local_only"
    }
}

impl From<Row> for SandboxView {
    fn from(r: Row) -> Self {
        let pending = (r.desired != r.state.as_str()
            && !matches!(r.state, SandboxState::Error | SandboxState::Destroyed)
            && !(r.state == SandboxState::Creating && r.desired == "running"))
            .then_some(r.desired);
        SandboxView {
            sandbox_id: r.id.into(),
            tenant: r.tenant_id,
            agent: r.agent,
            state: r.state,
            pending,
            persistent: r.persistent,
            always_on: r.always_on,
            timeout_sec: r.timeout_sec,
            idle_timeout_sec: r.idle_timeout_sec,
            disk_mb: r.disk_mb,
            network: r.network.map(|n| n.0),
            tenant_network: r.tenant_network.map(|n| n.0),
            repository: r.repository,
            git_ref: r.git_ref,
            source: r
                .source_snapshot_id
                .map(|id| format!("snapshot:{}", id.simple())),
            stop_reason: r.stop_reason,
            error_reason: r.error_reason,
            durability: durability(r.replicated).to_string(),
            stop_snapshot_id: r.stop_snapshot_id.map(Id::from),
            last_activity_at: r.last_activity_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
            stopped_at: r.stopped_at,
            destroyed_at: r.destroyed_at,
            metadata: r.metadata.0,
            template_id: r.template_id.map(Id::from),
            ports: r
                .ports
                .iter()
                .filter_map(|p| u16::try_from(*p).ok())
                .collect(),
            services: r.services.0,
            volumes: r.volumes,
        }
    }
}

/// The sandbox, or `None`.
pub async fn load(conn: &mut PgConnection, id: Uuid) -> Result<Option<SandboxView>, sqlx::Error> {
    let row: Option<Row> = sqlx::query_as(&format!("{SELECT} WHERE s.id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(SandboxView::from))
}

/// The sandbox, or a 404.
pub async fn require(conn: &mut PgConnection, id: Uuid) -> Result<SandboxView, ApiError> {
    load(conn, id)
        .await?
        .ok_or_else(|| ApiError::not_found("sandbox"))
}

/// Show one sandbox.
#[utoipa::path(get, operation_id = "get_sandbox", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}",
    params(("sandbox_id" = String, Path, description = "32 hex characters")),
    responses((status = 200, body = SandboxView), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(sandbox_id): Path<String>,
) -> Result<Json<SandboxView>, ApiError> {
    caller.require(Role::Viewer)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    let mut conn = state.pool.acquire().await?;
    Ok(Json(require(&mut conn, id).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only sandboxes in this state.
    #[param(pattern = "^(creating|running|stopped|paused|error|destroyed)$")]
    pub state: Option<String>,
    /// Only this agent's sandboxes.
    #[param(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    pub agent: Option<String>,
    /// At most this many, newest first (1 to 500, default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(
        pattern = "^(-?[0-9]{1,16}|1[0-9]{17}|2[0-4][0-9]{16}|25[0-2][0-9]{15}|253[0-3][0-9]{14})_[0-9a-f]{32}$"
    )]
    pub cursor: Option<String>,
}

/// A page of sandboxes.
#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The query's `metadata.KEY=VALUE` filters, apart from its other parameters (read by
/// [`ListQuery`]); a key named twice, or not a label's key, is refused.
fn split_metadata(raw: Option<&str>) -> Result<(BTreeMap<String, String>, String), ApiError> {
    let mut wanted = BTreeMap::new();
    let mut rest = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        let Some(key) = name.strip_prefix("metadata.") else {
            rest.append_pair(&name, &value);
            continue;
        };
        let field = format!("metadata.{key}");
        if !cairn_common::sandbox::valid_metadata_key(key) || value.contains('\0') {
            let message = "metadata.KEY: a key of 1 to 63 letters, digits, '.', '_' or '-'";
            return Err(ApiError::bad_request("invalid_query", message).with_field(field));
        }
        if wanted.insert(key.to_string(), value.into_owned()).is_some() {
            let message = "each metadata key is filtered on once";
            return Err(ApiError::bad_request("invalid_query", message).with_field(field));
        }
    }
    Ok((wanted, rest.finish()))
}

/// The list's parameters, checked: its filters, labels, page size and cursor.
struct Listing {
    query: ListQuery,
    metadata: BTreeMap<String, String>,
    limit: i64,
    after: Option<(DateTime<Utc>, Uuid)>,
}

fn listing(raw: Option<&str>) -> Result<Listing, ApiError> {
    let (metadata, rest) = split_metadata(raw)?;
    let uri: axum::http::Uri = format!("/?{rest}")
        .parse()
        .map_err(|_| ApiError::bad_request("invalid_query", "the query is not readable"))?;
    let Query(query) = Query::<ListQuery>::try_from_uri(&uri)
        .map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    if let Some(wanted) = &query.state {
        if SandboxState::parse(wanted).is_none() {
            return Err(ApiError::bad_request(
                "invalid_state",
                "state is one of creating, running, stopped, paused, error, destroyed",
            )
            .with_field("state"));
        }
    }
    if let Some(agent) = &query.agent {
        if !cairn_common::run::valid_name(agent, 128) {
            return Err(ApiError::bad_request(
                "invalid_agent",
                "agent is 1 to 128 characters of letters, digits, '.', '_' or '-'",
            )
            .with_field("agent"));
        }
    }
    let limit = query.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::bad_request("invalid_limit", "limit is 1 to 500").with_field("limit"));
    }
    let after = cursor::from_query(query.cursor.as_deref())?;
    Ok(Listing {
        query,
        metadata,
        limit,
        after,
    })
}

/// List sandboxes, newest first, a page at a time. `metadata.KEY=VALUE` (repeatable)
/// keeps the sandboxes whose labels hold every pair given.
#[utoipa::path(get, operation_id = "list_sandboxes", tag = "sandboxes", path = "/api/v1/sandboxes", params(ListQuery),
    responses((status = 200, body = SandboxList), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> Result<Json<SandboxList>, ApiError> {
    caller.require(Role::Viewer)?;
    let Listing {
        query,
        metadata,
        limit,
        after,
    } = listing(raw.as_deref())?;
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "{SELECT} WHERE ($1::text IS NULL OR s.state = $1) AND ($2::text IS NULL OR s.agent = $2)
            AND ($4::text IS NULL OR s.tenant_id = $4) AND s.metadata @> $5
            AND ($6::timestamptz IS NULL OR (s.created_at, s.id) < ($6, $7))
          ORDER BY s.created_at DESC, s.id DESC LIMIT $3"
    ))
    .bind(&query.state)
    .bind(&query.agent)
    .bind(limit + 1)
    .bind(caller.scope())
    .bind(sqlx::types::Json(&metadata))
    .bind(after.map(|a| a.0))
    .bind(after.map(|a| a.1).unwrap_or_default())
    .fetch_all(&state.pool)
    .await?;
    let mut sandboxes: Vec<SandboxView> = rows.into_iter().map(SandboxView::from).collect();
    let next_cursor = if sandboxes.len() as i64 > limit {
        sandboxes.truncate(usize::try_from(limit).unwrap_or(100));
        sandboxes
            .last()
            .map(|s| cursor::of(s.created_at, s.sandbox_id))
    } else {
        None
    };
    Ok(Json(SandboxList {
        sandboxes,
        next_cursor,
    }))
}

/// One exec or file operation, journaled like a step: its intent (`started_at`, with
/// the owner's epoch) and its receipt (`result`, on `snapshot_id`, the durable tree
/// holding its effects).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OperationView {
    #[schema(value_type = String)]
    pub operation_id: Id,
    pub seq: i64,
    /// `exec`, `read`, `write`, `list`, `snapshot`, `fork` or `service`.
    pub kind: String,
    /// `pending`, `running`, `done` or `interrupted` (no receipt: its worker was lost,
    /// or the sandbox stopped first).
    pub state: String,
    pub lease_epoch: Option<i64>,
    #[schema(value_type = Object)]
    pub request: serde_json::Value,
    #[schema(value_type = Option<Object>)]
    pub result: Option<serde_json::Value>,
    #[schema(value_type = Option<String>)]
    pub snapshot_id: Option<Id>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

type OperationRow = (
    Uuid,
    i64,
    String,
    String,
    Option<i64>,
    serde_json::Value,
    Option<serde_json::Value>,
    Option<Uuid>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

fn operation_view(r: OperationRow) -> OperationView {
    let mut request = r.5;
    // A write's content is not echoed back.
    if let Some(content) = request.get_mut("content") {
        *content = serde_json::Value::String("(base64, not shown)".into());
    }
    OperationView {
        operation_id: r.0.into(),
        seq: r.1,
        kind: r.2,
        state: r.3,
        lease_epoch: r.4,
        request,
        result: r.6,
        snapshot_id: r.7.map(Id::from),
        created_at: r.8,
        started_at: r.9,
        finished_at: r.10,
    }
}

const OPERATION: &str =
    "SELECT id, seq, kind, state, lease_epoch, body, result, snapshot_id, created_at,
        started_at, finished_at FROM sandbox_operations";

/// One operation.
pub async fn operation(
    conn: &mut PgConnection,
    id: Uuid,
) -> Result<Option<OperationView>, sqlx::Error> {
    let row: Option<OperationRow> = sqlx::query_as(&format!("{OPERATION} WHERE id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(operation_view))
}

/// One operation of a sandbox: its intent and, once it ended, its receipt.
#[utoipa::path(get, operation_id = "get_sandbox_operation", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}/operations/{operation_id}",
    params(("sandbox_id" = String, Path, description = "32 hex characters"),
        ("operation_id" = String, Path, description = "32 hex characters")),
    responses((status = 200, body = OperationView), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show_operation(
    State(state): State<AppState>,
    caller: Caller,
    Path((sandbox_id, operation_id)): Path<(String, String)>,
) -> Result<Json<OperationView>, ApiError> {
    caller.require(Role::Viewer)?;
    let sandbox = path_id(&sandbox_id, "sandbox_id")?;
    let id = path_id(&operation_id, "operation_id")?;
    let row: Option<OperationRow> =
        sqlx::query_as(&format!("{OPERATION} WHERE id = $1 AND sandbox_id = $2"))
            .bind(id)
            .bind(sandbox)
            .fetch_optional(&state.pool)
            .await?;
    row.map(|r| Json(operation_view(r)))
        .ok_or_else(|| ApiError::not_found("operation"))
}

/// The journal of a sandbox.
#[derive(Debug, Serialize, ToSchema)]
pub struct OperationList {
    pub operations: Vec<OperationView>,
}

/// A sandbox's operations, oldest first: its journal.
#[utoipa::path(get, operation_id = "list_sandbox_operations", tag = "sandboxes", path = "/api/v1/sandboxes/{sandbox_id}/operations",
    params(("sandbox_id" = String, Path, description = "32 hex characters")),
    responses((status = 200, body = OperationList), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn operations(
    State(state): State<AppState>,
    caller: Caller,
    Path(sandbox_id): Path<String>,
) -> Result<Json<OperationList>, ApiError> {
    caller.require(Role::Viewer)?;
    let id = path_id(&sandbox_id, "sandbox_id")?;
    let mut conn = state.pool.acquire().await?;
    require(&mut conn, id).await?;
    let rows: Vec<OperationRow> =
        sqlx::query_as(&format!("{OPERATION} WHERE sandbox_id = $1 ORDER BY seq"))
            .bind(id)
            .fetch_all(&mut *conn)
            .await?;
    Ok(Json(OperationList {
        operations: rows.into_iter().map(operation_view).collect(),
    }))
}
