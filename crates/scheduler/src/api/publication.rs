//! Publication of a completed run's result, and delivery holds. Requesting publication
//! needs release access (admin); it is saved once per caller-owned id, admits a
//! publication request of its own on the run, and is refused while anything holds it.

use super::auth::{Caller, Role};
use super::error::{ApiError, ErrorBody};
use super::json::StrictJson;
use super::path_id;
use super::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::digest;
use cairn_common::ids::Id;
use cairn_common::publication::{self, DeliveryHold, NewPublication, PublicationView};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// The strict version-1 body of a publication request.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"version": 1, "request_id": "0f1e2d3c4b5a69788796a5b4c3d2e1f0", "acknowledge_command_receipts_read": true})))]
pub struct PublicationInputV1 {
    /// Integer 1.
    #[schema(minimum = 1, maximum = 1)]
    pub version: u32,
    /// A new caller-owned id (32 lowercase hex), saved before the one POST.
    #[schema(value_type = String, pattern = "^[0-9a-f]{32}$")]
    pub request_id: Id,
    /// `true`: the run's command receipts were read before publication was requested.
    pub acknowledge_command_receipts_read: bool,
}

/// `PUT` body of a delivery hold.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveryHoldInput {
    /// Why nothing of the run may be delivered (1 to 500 characters).
    #[schema(min_length = 1, max_length = 500)]
    pub reason: String,
}

/// Request publication of a completed run: its final tree as a patch in the artifact
/// store, with a delivery receipt. Refused (`409 delivery_held`) while the run is not
/// completed, a delivery hold stands or its final tree is gone.
#[utoipa::path(post, operation_id = "request_publication", tag = "publication", path = "/api/v1/runs/{run_id}/publications",
    params(("run_id" = String, Path)), request_body = PublicationInputV1,
    responses((status = 201, body = PublicationView), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn request(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    StrictJson(input): StrictJson<PublicationInputV1>,
) -> Result<Response, ApiError> {
    caller.require(Role::Admin)?;
    let run_id = path_id(&run_id, "run_id")?;
    if input.version != 1 {
        return Err(ApiError::unprocessable("version", "must be 1"));
    }
    if !input.acknowledge_command_receipts_read {
        return Err(ApiError::unprocessable(
            "acknowledge_command_receipts_read",
            "read the run's command receipts first, then acknowledge with true",
        ));
    }
    let request_id = input.request_id.uuid();
    let input_digest = digest::of(&input);
    let mut tx = state.pool.begin().await?;
    // Publications of one run serialize on the run's row.
    let locked: Option<Uuid> = sqlx::query_scalar("SELECT id FROM runs WHERE id = $1 FOR UPDATE")
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await?;
    if locked.is_none() {
        return Err(ApiError::not_found("run"));
    }
    if let Some((saved_run, saved_digest)) = publication::saved(&mut tx, request_id).await? {
        if saved_run == run_id && saved_digest == input_digest {
            let view = publication::view(&mut tx, run_id, request_id).await?;
            let view = view.ok_or_else(|| ApiError::not_found("publication of this run"))?;
            return Ok((StatusCode::CREATED, Json(view)).into_response());
        }
        return Err(ApiError::conflict(
            "request_id_conflict",
            "this request_id was saved with different input; read its status instead of submitting again",
        )
        .with_field("request_id"));
    }
    if id_taken(&mut tx, request_id).await? {
        return Err(
            ApiError::conflict("request_id_conflict", "this request_id is taken")
                .with_field("request_id"),
        );
    }
    let standing = publication::standing(&mut tx, run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    let holds = publication::holds(&standing);
    if !holds.is_empty() {
        let reasons: Vec<String> = holds.iter().map(|h| h.message.clone()).collect();
        return Err(ApiError::conflict("delivery_held", reasons.join("; ")));
    }
    let new = NewPublication {
        request_id,
        run_id,
        operator_id: caller.token_id,
        input_digest: &input_digest,
    };
    if let Err(e) = publication::admit(&mut tx, &new).await {
        // Another request saved the same new id first, concurrently.
        return Err(match &e {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("23505") => {
                ApiError::conflict("request_id_conflict", "this request_id is taken")
                    .with_field("request_id")
            }
            _ => e.into(),
        });
    }
    let view = publication::view(&mut tx, run_id, request_id)
        .await?
        .ok_or_else(|| ApiError::not_found("publication of this run"))?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// Whether an execution request already has this id (another kind's).
async fn id_taken(conn: &mut sqlx::PgConnection, id: Uuid) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM execution_requests WHERE id = $1)")
        .bind(id)
        .fetch_one(conn)
        .await
}

/// Read a publication and, once delivered, its delivery receipt.
#[utoipa::path(get, operation_id = "get_publication", tag = "publication", path = "/api/v1/runs/{run_id}/publications/{request_id}",
    params(("run_id" = String, Path), ("request_id" = String, Path)),
    responses((status = 200, body = PublicationView), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path((run_id, request_id)): Path<(String, String)>,
) -> Result<Json<PublicationView>, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    let request_id = path_id(&request_id, "request_id")?;
    let mut conn = state.pool.acquire().await?;
    publication::view(&mut conn, run_id, request_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("publication of this run"))
}

/// Read a run's delivery hold.
#[utoipa::path(get, operation_id = "get_delivery_hold", tag = "publication", path = "/api/v1/runs/{run_id}/delivery-hold", params(("run_id" = String, Path)),
    responses((status = 200, body = DeliveryHold), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn hold(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<DeliveryHold>, ApiError> {
    caller.require(Role::Viewer)?;
    let run_id = path_id(&run_id, "run_id")?;
    let mut conn = state.pool.acquire().await?;
    read_hold(&mut conn, run_id).await
}

async fn read_hold(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
) -> Result<Json<DeliveryHold>, ApiError> {
    publication::hold_of(conn, run_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("run"))
}

/// Set a delivery hold on a run (admin): nothing of it is published while it stands, and
/// accepting a report does not clear it.
#[utoipa::path(put, operation_id = "set_delivery_hold", tag = "publication", path = "/api/v1/runs/{run_id}/delivery-hold", params(("run_id" = String, Path)),
    request_body = DeliveryHoldInput,
    responses((status = 200, body = DeliveryHold), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn set_hold(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    StrictJson(input): StrictJson<DeliveryHoldInput>,
) -> Result<Json<DeliveryHold>, ApiError> {
    caller.require(Role::Admin)?;
    let run_id = path_id(&run_id, "run_id")?;
    let reason = input.reason.trim();
    if reason.is_empty() || reason.chars().count() > 500 || reason.contains('\0') {
        return Err(ApiError::unprocessable(
            "reason",
            "1 to 500 characters, no NUL",
        ));
    }
    let mut tx = state.pool.begin().await?;
    if publication::hold_of(&mut tx, run_id).await?.is_none() {
        return Err(ApiError::not_found("run"));
    }
    publication::set_hold(&mut tx, run_id, reason, caller.token_id).await?;
    let held = read_hold(&mut tx, run_id).await?;
    tx.commit().await?;
    Ok(held)
}

/// Clear a run's delivery hold (admin).
#[utoipa::path(delete, operation_id = "clear_delivery_hold", tag = "publication", path = "/api/v1/runs/{run_id}/delivery-hold", params(("run_id" = String, Path)),
    responses((status = 200, body = DeliveryHold), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn clear_hold(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Json<DeliveryHold>, ApiError> {
    caller.require(Role::Admin)?;
    let run_id = path_id(&run_id, "run_id")?;
    let mut tx = state.pool.begin().await?;
    if publication::hold_of(&mut tx, run_id).await?.is_none() {
        return Err(ApiError::not_found("run"));
    }
    publication::clear_hold(&mut tx, run_id).await?;
    let cleared = read_hold(&mut tx, run_id).await?;
    tx.commit().await?;
    Ok(cleared)
}
