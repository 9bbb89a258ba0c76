//! Volumes: storage on one worker's disk that a sandbox attaches on create (`volumes`),
//! kept across its stops and its worker's restarts, never snapshotted.

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::json::StrictJson;
use crate::api::path_id;
use crate::api::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use cairn_common::ids::Id;
use cairn_common::sandbox::volume::{self, Deleted, Volume};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /api/v1/volumes`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"name": "pip-cache", "size_mb": 2048})))]
pub struct VolumeSpec {
    /// 1 to 63 of `a-z0-9._-`, starting with a letter or digit: the sandbox sees it at
    /// `/volumes/<name>`. Unique among the tenant's volumes not deleted.
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")]
    pub name: String,
    /// Its room in MiB, 1 to 1048576; default 1024. Writes past it fail with "Disk quota
    /// exceeded" where the worker's disk has quotas.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1048576)]
    pub size_mb: Option<u32>,
}

/// A volume. Where it lives is the worker's: no host is shown.
#[derive(Debug, Serialize, ToSchema)]
pub struct VolumeView {
    #[schema(value_type = String)]
    pub volume_id: Id,
    pub name: String,
    pub size_mb: i32,
    /// `available`, `deleting` (its worker removes its data) or `deleted`.
    pub state: String,
    /// The sandbox that has it attached, if any.
    #[schema(value_type = Option<String>)]
    pub attached_to: Option<Id>,
    pub created_at: DateTime<Utc>,
    pub deleted_at: Option<DateTime<Utc>>,
}

impl From<Volume> for VolumeView {
    fn from(v: Volume) -> Self {
        VolumeView {
            volume_id: v.id.into(),
            name: v.name,
            size_mb: v.size_mb,
            state: v.state,
            attached_to: v.attached_to.map(Id::from),
            created_at: v.created_at,
            deleted_at: v.deleted_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct VolumeList {
    pub volumes: Vec<VolumeView>,
}

/// Create a volume. It takes no room until a sandbox that attaches it first starts; the
/// worker that hosts that sandbox keeps it from then on.
#[utoipa::path(post, operation_id = "create_volume", tag = "sandboxes", path = "/api/v1/volumes",
    request_body = VolumeSpec,
    responses((status = 201, description = "Created", body = VolumeView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, description = "The tenant has a volume of that name", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    StrictJson(spec): StrictJson<VolumeSpec>,
) -> Result<(StatusCode, Json<VolumeView>), ApiError> {
    caller.require(Role::Operator)?;
    if !volume::valid_name(&spec.name) {
        let message =
            "a name is 1 to 63 of a-z, 0-9, '.', '_' or '-', starting with a letter or digit";
        return Err(ApiError::unprocessable("name", message));
    }
    let size = match spec.size_mb {
        None => volume::DEFAULT_SIZE_MB,
        Some(mb) => i32::try_from(mb)
            .ok()
            .filter(|mb| (volume::MIN_SIZE_MB..=volume::MAX_SIZE_MB).contains(mb))
            .ok_or_else(|| ApiError::unprocessable("size_mb", "from 1 to 1048576"))?,
    };
    let mut conn = state.pool.acquire().await?;
    match volume::create(&mut conn, caller.home(), &spec.name, size).await? {
        Some(made) => Ok((StatusCode::CREATED, Json(made.into()))),
        None => Err(ApiError::conflict(
            "volume_exists",
            format!("the tenant has a volume named {}", spec.name),
        )
        .with_field("name")),
    }
}

/// List volumes not deleted, by name; at most 500.
#[utoipa::path(get, operation_id = "list_volumes", tag = "sandboxes", path = "/api/v1/volumes",
    responses((status = 200, body = VolumeList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<VolumeList>, ApiError> {
    caller.require(Role::Viewer)?;
    let mut conn = state.pool.acquire().await?;
    let volumes = volume::list(&mut conn, caller.scope()).await?;
    Ok(Json(VolumeList {
        volumes: volumes.into_iter().map(VolumeView::from).collect(),
    }))
}

/// Show one volume.
#[utoipa::path(get, operation_id = "get_volume", tag = "sandboxes", path = "/api/v1/volumes/{volume_id}",
    params(("volume_id" = String, Path, description = "32 hex characters")),
    responses((status = 200, body = VolumeView), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(volume_id): Path<String>,
) -> Result<Json<VolumeView>, ApiError> {
    caller.require(Role::Viewer)?;
    let id = path_id(&volume_id, "volume_id")?;
    let mut conn = state.pool.acquire().await?;
    let found = volume::get(&mut conn, id).await?;
    found
        .map(|v| Json(v.into()))
        .ok_or_else(|| ApiError::not_found("volume"))
}

/// Delete a volume and its data. A volume attached to a sandbox is refused: destroy the
/// sandbox first. Its worker removes the data (`deleting`, then `deleted`).
#[utoipa::path(delete, operation_id = "delete_volume", tag = "sandboxes", path = "/api/v1/volumes/{volume_id}",
    params(("volume_id" = String, Path, description = "32 hex characters")),
    responses((status = 200, description = "Deleted, or being deleted by its worker", body = VolumeView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Attached to a sandbox", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(volume_id): Path<String>,
) -> Result<Json<VolumeView>, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(&volume_id, "volume_id")?;
    let mut tx = state.pool.begin().await?;
    match volume::delete(&mut tx, id).await? {
        Deleted::NotFound => return Err(ApiError::not_found("volume")),
        Deleted::Attached(sandbox) => {
            return Err(ApiError::conflict(
                "volume_attached",
                format!(
                    "the volume is attached to sandbox {}: destroy it first",
                    sandbox.simple()
                ),
            ))
        }
        Deleted::Gone | Deleted::Deleting => {}
    }
    let found = volume::get(&mut tx, id).await?;
    tx.commit().await?;
    found
        .map(|v| Json(v.into()))
        .ok_or_else(|| ApiError::not_found("volume"))
}
