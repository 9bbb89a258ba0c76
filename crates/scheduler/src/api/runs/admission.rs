//! Admission: one run, or a batch, in one transaction each (the runs, their execution
//! requests and their outbox messages); an idempotency key replays the same receipt.

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::json::StrictJson;
use crate::api::AppState;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::digest;
use cairn_common::ids::Id;
use cairn_common::request::admit;
use cairn_common::run::{RunSpec, MAX_BATCH};
use chrono::Utc;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::view::{load_run, RunView};

/// Whether a stored digest is of this input: normalized, or (for runs admitted before
/// inputs were normalized) exactly as sent.
fn same_input(stored: &str, spec: &RunSpec) -> bool {
    stored == admit::input_digest(spec) || stored == digest::of(spec)
}

/// Submit one run.
#[utoipa::path(post, operation_id = "submit_run", tag = "runs", path = "/api/v1/runs",
    request_body = RunSpec,
    params(("Idempotency-Key" = Option<String>, Header, description = "Same key and body: the same run; same key, other body: 409")),
    responses(
        (status = 201, description = "Admitted and queued", body = RunView),
        (status = 200, description = "Replay of an earlier submission with the same Idempotency-Key", body = RunView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, description = "Idempotency-Key reused with another body", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn submit(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    StrictJson(spec): StrictJson<RunSpec>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let key = crate::api::idempotency::key(&headers)?;
    // A replay answers with the original receipt before anything is validated again:
    // the same input may no longer pass (its deadline passed), and it admits nothing.
    if let Some(key) = &key {
        if let Some(replay) = replay(&state, &caller, key, &spec).await? {
            return Ok(replay);
        }
    }
    spec.validate("", Utc::now())?;
    let mut tx = state.pool.begin().await?;
    let run_ids = match admit::admit(
        &mut tx,
        std::slice::from_ref(&spec),
        caller.token_id,
        caller.home(),
        key.as_deref(),
    )
    .await
    {
        Ok(ids) => ids,
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() && key.is_some() => {
            // A concurrent submission with the same key won the race: answer as a replay.
            drop(tx);
            let key = key.as_deref().unwrap_or_default();
            return replay(&state, &caller, key, &spec).await?.ok_or_else(|| {
                ApiError::conflict("idempotency_key_conflict", "Idempotency-Key is in use")
            });
        }
        Err(e) => return Err(e.into()),
    };
    let view = load_run(&mut tx, run_ids[0])
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    tx.commit().await?;
    state.metrics.runs_admitted.inc();
    let mut response = (StatusCode::CREATED, Json(&view)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/api/v1/runs/{}", view.run_id)) {
        response.headers_mut().insert("location", location);
    }
    Ok(response)
}

async fn replay(
    state: &AppState,
    caller: &Caller,
    key: &str,
    spec: &RunSpec,
) -> Result<Option<Response>, ApiError> {
    let stored: Option<(Uuid, String)> =
        sqlx::query_as("SELECT id, request_digest FROM runs WHERE idempotency_key = $1")
            .bind(format!("{}:{key}", caller.token_id.simple()))
            .fetch_optional(&state.pool)
            .await?;
    let Some((run_id, stored_digest)) = stored else {
        return Ok(None);
    };
    if !same_input(&stored_digest, spec) {
        return Err(ApiError::conflict(
            "idempotency_key_conflict",
            "this Idempotency-Key was used with a different body; nothing was admitted",
        )
        .with_field("Idempotency-Key"));
    }
    let mut conn = state.pool.acquire().await?;
    let view = load_run(&mut conn, run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    let mut response = (StatusCode::OK, Json(view)).into_response();
    response
        .headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    Ok(Some(response))
}

/// A batch submission.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// 1 to 1,000 runs, admitted together or not at all.
    #[schema(min_items = 1, max_items = 1000)]
    pub runs: Vec<RunSpec>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResponse {
    /// The new run ids, in the order submitted.
    #[schema(value_type = Vec<String>)]
    pub run_ids: Vec<Id>,
}

/// Submit up to 1,000 runs in one transaction.
#[utoipa::path(post, operation_id = "submit_runs", tag = "runs", path = "/api/v1/runs/batch", request_body = BatchRequest,
    params(("Idempotency-Key" = Option<String>, Header, description = "Same key and batch: the same run ids; same key, other batch: 409")),
    responses((status = 201, description = "Admitted and queued", body = BatchResponse),
        (status = 200, description = "Replay of an earlier batch with the same Idempotency-Key", body = BatchResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, description = "Idempotency-Key reused with another batch", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn submit_batch(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    StrictJson(batch): StrictJson<BatchRequest>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let key = crate::api::idempotency::key(&headers)?
        .map(|k| format!("{}:{k}", caller.token_id.simple()));
    let batch_digest = digest::of(
        &batch
            .runs
            .iter()
            .map(RunSpec::normalized)
            .collect::<Vec<_>>(),
    );
    if let Some(key) = &key {
        if let Some(replay) = replay_batch(&state, key, &batch_digest).await? {
            return Ok(replay);
        }
    }
    if batch.runs.is_empty() || batch.runs.len() > MAX_BATCH {
        return Err(ApiError::unprocessable(
            "runs",
            format!("1 to {MAX_BATCH} runs"),
        ));
    }
    let now = Utc::now();
    for (i, spec) in batch.runs.iter().enumerate() {
        spec.validate(&format!("runs[{i}]."), now)?;
    }
    let mut tx = state.pool.begin().await?;
    let ids = admit::admit(&mut tx, &batch.runs, caller.token_id, caller.home(), None).await?;
    if let Some(key) = &key {
        let saved = admit::save_batch(&mut tx, key, &batch_digest, &ids).await;
        match saved {
            Ok(_) => {}
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                // A concurrent batch with the same key won: this one admits nothing.
                drop(tx);
                return replay_batch(&state, key, &batch_digest)
                    .await?
                    .ok_or_else(|| {
                        ApiError::conflict("idempotency_key_conflict", "Idempotency-Key is in use")
                    });
            }
            Err(e) => return Err(e.into()),
        }
    }
    tx.commit().await?;
    state.metrics.runs_admitted.inc_by(ids.len() as u64);
    let body = BatchResponse {
        run_ids: ids.into_iter().map(Id::from).collect(),
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// The receipt of an earlier batch with this key: its run ids, if the batch is the same.
async fn replay_batch(
    state: &AppState,
    key: &str,
    batch_digest: &str,
) -> Result<Option<Response>, ApiError> {
    let stored: Option<(String, Vec<Uuid>)> = sqlx::query_as(
        "SELECT request_digest, run_ids FROM batch_admissions WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_optional(&state.pool)
    .await?;
    let Some((stored_digest, run_ids)) = stored else {
        return Ok(None);
    };
    if stored_digest != batch_digest {
        return Err(ApiError::conflict(
            "idempotency_key_conflict",
            "this Idempotency-Key was used with a different batch; nothing was admitted",
        )
        .with_field("Idempotency-Key"));
    }
    let body = BatchResponse {
        run_ids: run_ids.into_iter().map(Id::from).collect(),
    };
    let mut response = (StatusCode::OK, Json(body)).into_response();
    response
        .headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    Ok(Some(response))
}
