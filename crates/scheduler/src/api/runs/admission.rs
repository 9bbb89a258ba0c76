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
use cairn_common::outbox;
use cairn_common::run::{JobKind, JobMessage, RunSpec, MAX_BATCH};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use utoipa::ToSchema;
use uuid::Uuid;

use super::view::{load_run, RunView};

/// Admits runs in the caller's transaction: each run, its execution request and its
/// outbox message, in bulk statements, all in the caller's tenant. Returns the new run
/// ids in order.
async fn admit(
    conn: &mut PgConnection,
    specs: &[RunSpec],
    caller: &Caller,
    idempotency_key: Option<&str>,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let operator = caller.token_id;
    let run_ids: Vec<Uuid> = specs.iter().map(|_| Uuid::new_v4()).collect();
    let request_ids: Vec<Uuid> = specs.iter().map(|_| Uuid::new_v4()).collect();
    let agents: Vec<&str> = specs.iter().map(|s| s.agent.as_str()).collect();
    let repositories: Vec<Option<&str>> = specs.iter().map(|s| s.repository.as_deref()).collect();
    let refs: Vec<Option<&str>> = specs.iter().map(|s| s.git_ref.as_deref()).collect();
    let steps: Vec<serde_json::Value> = specs
        .iter()
        .map(|s| serde_json::to_value(&s.steps).unwrap_or_default())
        .collect();
    let max_commands: Vec<i32> = specs
        .iter()
        .map(|s| clamp_i32(s.budgets.max_commands))
        .collect();
    let max_wall: Vec<i32> = specs
        .iter()
        .map(|s| clamp_i32(s.budgets.max_wall_seconds))
        .collect();
    let max_attempts: Vec<i32> = specs.iter().map(|s| clamp_i32(s.max_attempts())).collect();
    let deadlines: Vec<Option<DateTime<Utc>>> = specs.iter().map(|s| s.deadline).collect();
    let digests: Vec<String> = specs.iter().map(input_digest).collect();
    let keys: Vec<Option<String>> = specs
        .iter()
        .map(|_| idempotency_key.map(|k| format!("{}:{k}", operator.simple())))
        .collect();
    sqlx::query(
        "INSERT INTO runs (id, root_run_id, work_context_id, agent, operator_id, repository, git_ref, steps,
                           max_commands, max_wall_seconds, max_attempts, deadline, state,
                           idempotency_key, request_digest, tenant_id)
         SELECT id, id, id, agent, $12, repository, git_ref, steps, max_commands, max_wall_seconds,
                max_attempts, deadline, 'queued', idempotency_key, request_digest, $13
           FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::int[],
                       $7::int[], $8::int[], $9::timestamptz[], $10::text[], $11::text[])
             AS t(id, agent, repository, git_ref, steps, max_commands, max_wall_seconds,
                  max_attempts, deadline, idempotency_key, request_digest)",
    )
    .bind(&run_ids)
    .bind(&agents)
    .bind(&repositories)
    .bind(&refs)
    .bind(&steps)
    .bind(&max_commands)
    .bind(&max_wall)
    .bind(&max_attempts)
    .bind(&deadlines)
    .bind(&keys)
    .bind(&digests)
    .bind(operator)
    .bind(caller.home())
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO execution_requests (id, run_id, kind, state, max_attempts, max_commands, max_wall_seconds)
         SELECT id, run_id, 'run', 'queued', max_attempts, max_commands, max_wall_seconds
           FROM UNNEST($1::uuid[], $2::uuid[], $3::int[], $4::int[], $5::int[])
             AS t(id, run_id, max_attempts, max_commands, max_wall_seconds)",
    )
    .bind(&request_ids)
    .bind(&run_ids)
    .bind(&max_attempts)
    .bind(&max_commands)
    .bind(&max_wall)
    .execute(&mut *conn)
    .await?;
    let messages: Vec<JobMessage> = run_ids
        .iter()
        .zip(&request_ids)
        .map(|(run_id, request_id)| JobMessage {
            tenant: None,
            kind: JobKind::Run,
            run_id: *run_id,
            request_id: *request_id,
            action_id: None,
            attempt: Some(1),
        })
        .collect();
    outbox::announce_many(conn, JobKind::Run, &messages).await?;
    Ok(run_ids)
}

/// What an idempotency key binds: the input with its defaults filled in.
fn input_digest(spec: &RunSpec) -> String {
    digest::of(&spec.normalized())
}

/// Whether a stored digest is of this input: normalized, or (for runs admitted before
/// inputs were normalized) exactly as sent.
fn same_input(stored: &str, spec: &RunSpec) -> bool {
    stored == input_digest(spec) || stored == digest::of(spec)
}

fn clamp_i32(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// Submit one run.
#[utoipa::path(post, path = "/api/v1/runs", tag = "runs",
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
    let run_ids = match admit(
        &mut tx,
        std::slice::from_ref(&spec),
        &caller,
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
#[utoipa::path(post, path = "/api/v1/runs/batch", tag = "runs", request_body = BatchRequest,
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
    let ids = admit(&mut tx, &batch.runs, &caller, None).await?;
    if let Some(key) = &key {
        let saved = sqlx::query(
            "INSERT INTO batch_admissions (idempotency_key, request_digest, run_ids) VALUES ($1, $2, $3)",
        )
        .bind(key)
        .bind(&batch_digest)
        .bind(&ids)
        .execute(&mut *tx)
        .await;
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
