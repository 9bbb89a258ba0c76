//! Source profiles: which implementations a continuation may run on. Read by any
//! token; qualified or revoked by a platform admin.

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::json::StrictJson;
use super::AppState;
use axum::extract::{Path, State};
use axum::Json;
use cairn_common::digest;
use cairn_common::qualification::{self, Change, ProfileStatus, Registered};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The current implementation's profile and every registered one.
#[derive(Debug, Serialize, ToSchema)]
pub struct QualificationView {
    pub current: CurrentProfile,
    pub profiles: Vec<Registered>,
}

/// The profile of the implementation the scheduler runs.
#[derive(Debug, Serialize, ToSchema)]
pub struct CurrentProfile {
    pub profile_digest: String,
    /// What a continuation depends on: Cairn's version, the snapshot manifest format,
    /// the journal format and the continuation protocol.
    #[schema(value_type = Object)]
    pub profile: serde_json::Value,
    /// `qualified`, `revoked` or `unregistered`. Continuations are held
    /// (`incompatible_qualification`) unless it is `qualified`.
    pub status: String,
}

/// `PUT` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileUpdate {
    /// `true` qualifies the profile for continuations; `false` revokes it.
    pub qualified: bool,
    /// Why (at most 1,000 characters): what qualified it, or why it was revoked.
    #[serde(default)]
    #[schema(max_length = 1000)]
    pub note: String,
}

/// Read the current implementation's source profile and the registered ones.
#[utoipa::path(get, operation_id = "get_qualification", tag = "qualification", path = "/api/v1/qualification",
    responses((status = 200, body = QualificationView), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<QualificationView>, ApiError> {
    caller.require(Role::Viewer)?;
    let profiles = qualification::list(&state.pool).await?;
    let digest = qualification::current();
    let status = profiles
        .iter()
        .find(|p| p.profile_digest == digest)
        .map_or("unregistered".to_string(), |p| p.status.clone());
    Ok(Json(QualificationView {
        current: CurrentProfile {
            profile_digest: digest,
            profile: qualification::profile(),
            status,
        },
        profiles,
    }))
}

/// Qualify or revoke a source profile (platform admin): a registered one, or the
/// current implementation's. Continuations are admitted only while the current profile
/// is qualified, and only from checkpoints retained under a qualified profile.
#[utoipa::path(put, operation_id = "set_source_profile", tag = "qualification", path = "/api/v1/qualification/profiles/{profile_digest}",
    params(("profile_digest" = String, Path, description = "The profile's 64-hex digest")),
    request_body = ProfileUpdate,
    responses((status = 200, body = Registered), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "Neither registered nor the current implementation's", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn set(
    State(state): State<AppState>,
    caller: Caller,
    Path(profile_digest): Path<String>,
    StrictJson(update): StrictJson<ProfileUpdate>,
) -> Result<Json<Registered>, ApiError> {
    caller.require(Role::Admin)?;
    caller.require_platform()?;
    if !digest::is_digest(&profile_digest) {
        return Err(ApiError::bad_request(
            "invalid_profile_digest",
            "a profile digest is 64 lowercase hexadecimal characters",
        ));
    }
    if update.note.chars().count() > 1000 {
        return Err(ApiError::unprocessable("note", "at most 1,000 characters"));
    }
    let status = if update.qualified {
        ProfileStatus::Qualified
    } else {
        ProfileStatus::Revoked
    };
    let note = update.note.replace('\0', "");
    match qualification::set(&state.pool, &profile_digest, status, &note, caller.token_id).await? {
        Change::Saved(saved) => Ok(Json(saved)),
        Change::Unknown => Err(ApiError::not_found("source profile")),
    }
}
