//! Creating a sandbox: validated, recorded `creating` and announced for placement in one
//! transaction; an `Idempotency-Key` replays the same sandbox.

use super::view::{self, SandboxView};
use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::json::StrictJson;
use crate::api::AppState;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::digest;
use cairn_common::sandbox::record::{self, NewSandbox};
use cairn_common::sandbox::{volume, CreateSpec};
use sqlx::PgConnection;
use uuid::Uuid;

/// Create a sandbox. It is `creating` until a worker has prepared its tree, then
/// `running`.
#[utoipa::path(post, operation_id = "create_sandbox", tag = "sandboxes", path = "/api/v1/sandboxes",
    request_body = CreateSpec,
    params(("Idempotency-Key" = Option<String>, Header, description = "Same key and body: the same sandbox; same key, other body: 409")),
    responses(
        (status = 201, description = "Recorded and queued for placement", body = SandboxView),
        (status = 200, description = "Replay of an earlier create with the same Idempotency-Key", body = SandboxView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "The source snapshot, template or a volume does not exist", body = ErrorBody),
        (status = 409, description = "Idempotency-Key reused with another body, the source snapshot is not ready, or a volume is attached to another sandbox", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    StrictJson(spec): StrictJson<CreateSpec>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let key = crate::api::idempotency::key(&headers)?
        .map(|k| format!("{}:create:{k}", caller.token_id.simple()));
    admit(&state, caller.home(), key, spec).await
}

/// Records a sandbox of `tenant` (or replays the one `key` created), announced for
/// placement: `201` with it, `200` for a replay.
pub async fn admit(
    state: &AppState,
    tenant: &str,
    key: Option<String>,
    spec: CreateSpec,
) -> Result<Response, ApiError> {
    spec.validate()?;
    let spec = spec.normalized();
    let digest = digest::of(&spec);
    if let Some(key) = &key {
        if let Some(replay) = replay(state, key, &digest).await? {
            return Ok(replay);
        }
    }
    let mut tx = state.pool.begin().await?;
    if let Some(snapshot) = spec.source_snapshot()? {
        restorable(&mut tx, snapshot, tenant).await?;
    }
    let template = spec.template()?;
    let from_template = match template {
        Some(id) => Some(template_source(&mut tx, id, tenant).await?),
        None => None,
    };
    let created = record::create(
        &mut tx,
        &NewSandbox {
            tenant,
            agent: &spec.agent,
            persistent: spec.persistent.unwrap_or(true),
            always_on: spec.always_on.unwrap_or(false),
            timeout_sec: to_i32(spec.timeout_sec),
            idle_timeout_sec: to_i32(spec.idle_timeout_sec),
            disk_mb: to_i32(spec.disk_mb),
            repository: spec.repository.as_deref(),
            git_ref: spec.git_ref.as_deref(),
            source_snapshot_id: spec.source_snapshot()?.or(from_template),
            forked_from: None,
            idempotency_key: key.as_deref(),
            request_digest: &digest,
            network: spec
                .network
                .as_ref()
                .and_then(|n| serde_json::to_value(n).ok()),
            metadata: serde_json::json!(spec.metadata.clone().unwrap_or_default()),
            template_id: template,
            ports: spec.ports.iter().flatten().map(|p| i32::from(*p)).collect(),
            services: serde_json::json!(spec.services.clone().unwrap_or_default()),
            placement_directory: None,
        },
    )
    .await;
    let id = match created {
        Ok(id) => id,
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() && key.is_some() => {
            // A concurrent create with the same key won the race: answer as a replay.
            drop(tx);
            let key = key.as_deref().unwrap_or_default();
            return replay(state, key, &digest).await?.ok_or_else(|| {
                ApiError::conflict("idempotency_key_conflict", "Idempotency-Key is in use")
            });
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(names) = spec.volumes.as_deref().filter(|n| !n.is_empty()) {
        volume::attach(&mut tx, tenant, id, names)
            .await
            .map_err(refused_attach)?;
    }
    let view = view::require(&mut tx, id).await?;
    tx.commit().await?;
    state.metrics.sandboxes_created.inc();
    let mut response = (StatusCode::CREATED, Json(&view)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/api/v1/sandboxes/{}", view.sandbox_id)) {
        response.headers_mut().insert("location", location);
    }
    Ok(response)
}

/// The snapshot a template version of `tenant` names, restorable; another tenant's
/// template is as unknown as none.
async fn template_source(
    conn: &mut PgConnection,
    id: Uuid,
    tenant: &str,
) -> Result<Uuid, ApiError> {
    match cairn_common::sandbox::template::source(&mut *conn, id).await? {
        Some((snapshot, owner)) if owner == tenant => {
            // The caller named the template: a snapshot that starts nothing blames it.
            restorable(conn, snapshot, tenant)
                .await
                .map_err(|e| e.with_field("template_id"))?;
            Ok(snapshot)
        }
        _ => Err(ApiError::not_found("template").with_field("template_id")),
    }
}

/// Why the volumes named on create could not be attached, as the API answers it.
fn refused_attach(e: volume::AttachError) -> ApiError {
    use volume::AttachError;
    let message = e.to_string();
    let refused = match e {
        AttachError::Missing(_) => ApiError::new(StatusCode::NOT_FOUND, "not_found", message),
        AttachError::Attached(_) => ApiError::conflict("volume_attached", message),
        AttachError::Apart => ApiError::conflict("volumes_apart", message),
        AttachError::HostDown(_) => ApiError::conflict("volume_unavailable", message),
        AttachError::Db(e) => return e.into(),
    };
    refused.with_field("volumes")
}

fn to_i32(value: Option<u32>) -> i32 {
    i32::try_from(value.unwrap_or_default()).unwrap_or(i32::MAX)
}

/// A snapshot a new sandbox of `tenant` may start from: a sandbox's, or a failed step's
/// tree kept for inspection, of the same tenant (another tenant's is as unknown as no
/// snapshot: nothing scrubs a snapshot for sharing yet), and `ready` (an inspection
/// snapshot until its bytes are reclaimed). A quarantined one is never restored.
pub async fn restorable(
    conn: &mut PgConnection,
    snapshot: Uuid,
    tenant: &str,
) -> Result<(), ApiError> {
    let status: Option<String> = sqlx::query_scalar(&format!(
        "SELECT CASE WHEN {kept} THEN p.status ELSE 'deleted' END
           FROM project_snapshots p
           LEFT JOIN sandboxes s ON s.id = p.sandbox_id
           LEFT JOIN execution_requests e ON e.id = p.request_id AND p.kind = 'inspection'
           LEFT JOIN runs r ON r.id = e.run_id
          WHERE p.id = $1 AND COALESCE(s.tenant_id, r.tenant_id) = $2",
        kept = cairn_common::lineage::RESTORABLE_SOURCE,
    ))
    .bind(snapshot)
    .bind(tenant)
    .fetch_optional(conn)
    .await?;
    match status.as_deref() {
        None => Err(ApiError::not_found("snapshot").with_field("source")),
        Some("ready") => Ok(()),
        Some("quarantined") => Err(ApiError::conflict(
            "snapshot_quarantined",
            "the snapshot failed its integrity check and is never restored",
        )
        .with_field("source")),
        Some(other) => Err(ApiError::conflict(
            "snapshot_not_ready",
            format!("the snapshot is {other}; only a ready snapshot is restored"),
        )
        .with_field("source")),
    }
}

async fn replay(state: &AppState, key: &str, digest: &str) -> Result<Option<Response>, ApiError> {
    let stored: Option<(Uuid, String)> =
        sqlx::query_as("SELECT id, request_digest FROM sandboxes WHERE idempotency_key = $1")
            .bind(key)
            .fetch_optional(&state.pool)
            .await?;
    let Some((id, stored_digest)) = stored else {
        return Ok(None);
    };
    if stored_digest != digest {
        return Err(ApiError::conflict(
            "idempotency_key_conflict",
            "this Idempotency-Key was used with a different body; nothing was created",
        )
        .with_field("Idempotency-Key"));
    }
    let mut conn = state.pool.acquire().await?;
    let view = view::require(&mut conn, id).await?;
    let mut response = (StatusCode::OK, Json(view)).into_response();
    response
        .headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    Ok(Some(response))
}
