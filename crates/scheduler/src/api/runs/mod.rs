//! Runs: admission (single and batch), listing, reading, cancellation, the execution
//! requests of a run and its journal.
//!
//! - [`admission`]: submitting one run or a batch.
//! - [`view`]: reading runs and their execution requests.
//! - [`events`]: the runs that change, as server-sent events; [`position`]: where such a
//!   stream stands.
//! - [`journal`](mod@journal): a run's journal.
//! - [`output`](mod@output): a step's output, read or followed.
//! - [`reconciliation`]: a run that needs a person, and the decisions on its steps.
//! - [`rerun`]: a new run from an earlier run's spec; [`bulk`]: cancel or retry every
//!   run a filter matches.

pub mod admission;
pub mod bulk;
pub mod events;
pub mod journal;
pub mod output;
pub mod position;
pub mod reconciliation;
pub mod rerun;
pub mod view;

use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::path_id;
use crate::api::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_common::request::cancel::{cancel_run, Cancellation};

use view::{load_run, RunView};

/// Cancel a run: at once when no worker holds it, else within one lease renewal.
#[utoipa::path(post, operation_id = "cancel_run", tag = "runs", path = "/api/v1/runs/{run_id}/cancel",
    params(("run_id" = String, Path)),
    responses(
        (status = 200, description = "Cancelled", body = RunView),
        (status = 202, description = "A worker holds the run; it stops within one renewal interval", body = RunView),
        (status = 404, body = ErrorBody), (status = 409, description = "The run already finished", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let run_id = path_id(&run_id, "run_id")?;
    let mut tx = state.pool.begin().await?;
    let status = match cancel_run(&mut tx, run_id).await? {
        None => return Err(ApiError::not_found("run")),
        Some(Cancellation::Finished(s)) => {
            return Err(ApiError::conflict(
                "run_finished",
                format!("the run already ended ({})", s.as_str()),
            ))
        }
        Some(Cancellation::Requested) => StatusCode::ACCEPTED,
        Some(Cancellation::AlreadyCancelled | Cancellation::Cancelled) => StatusCode::OK,
    };
    let view = load_run(&mut tx, run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    tx.commit().await?;
    Ok((status, Json(view)).into_response())
}
