//! The request state machine at its edges, through the API and the real sweeper: a
//! cancelled run stays cancelled, an unclaimed window frees its checkpoint, an admission
//! decides on the policy saved before it, and idempotency keys replay what they admitted.

use axum::http::StatusCode;
use cairn_common::request::{self, action, RequestEvent};
use cairn_scheduler::sweeper::{sweep_once, SweeperMetrics};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

use super::continuation::{
    action_body, final_body, hold_reasons, new_action, ready_checkpoint, retained_report,
    Continuation,
};
use super::harness::*;

/// Admits a reviewed action on `continuation`; returns its id.
async fn admit(api: &Api, continuation: &Continuation, body: Value) -> String {
    let action = new_action();
    let (status, receipt) = continuation.act(api, &action, &api.admin, body).await;
    assert_eq!(status, StatusCode::CREATED, "{receipt}");
    action
}

/// Ends an action's window now, as time would.
async fn end_window(api: &Api, action: &str) {
    sqlx::query(
        "UPDATE continuation_actions SET window_ends_at = now() - interval '1 second' WHERE id = $1::uuid",
    )
    .bind(action)
    .execute(api.pool())
    .await
    .expect("end the window");
}

async fn sweep(api: &Api) {
    sweep_once(api.pool(), 100, &SweeperMetrics::default())
        .await
        .expect("sweep");
}

async fn run_of(api: &Api, continuation: &Continuation) -> Value {
    let path = format!("/api/v1/runs/{}", continuation.run_id.simple());
    api.get(&path, &api.viewer).await.1
}

async fn action_status(api: &Api, action: &str) -> String {
    sqlx::query_scalar("SELECT status FROM continuation_actions WHERE id = $1::uuid")
        .bind(action)
        .fetch_one(api.pool())
        .await
        .expect("action")
}

async fn cancel(api: &Api, continuation: &Continuation) -> (StatusCode, Value) {
    let path = format!("/api/v1/runs/{}/cancel", continuation.run_id.simple());
    api.post(&path, &api.operator, None).await
}

#[tokio::test]
async fn a_cancelled_run_with_a_queued_continuation_never_comes_back() {
    let (api, stopped, digest) = ready_checkpoint().await;
    let action = admit(&api, &stopped, action_body(&digest)).await;
    // Nobody holds it: the cancel ends it now.
    let (status, run) = cancel(&api, &stopped).await;
    assert_eq!(
        (status, run["state"].as_str()),
        (StatusCode::OK, Some("cancelled")),
        "{run}"
    );
    assert_eq!(action_status(&api, &action).await, "failed");

    // The action's window ends and the sweeper runs: the run stays cancelled.
    end_window(&api, &action).await;
    sweep(&api).await;
    assert_eq!(run_of(&api, &stopped).await["state"], "cancelled");
    let (_, candidate) = stopped.candidate(&api, &api.viewer).await;
    assert_eq!(candidate["admission"], "HELD", "{candidate}");
    let again = candidate["candidate_digest"].as_str().unwrap_or_default();
    let (status, error) = stopped
        .act(&api, &new_action(), &api.admin, action_body(again))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert_eq!(run_of(&api, &stopped).await["state"], "cancelled");
}

#[tokio::test]
async fn cancelling_a_lapsed_continuation_ends_its_action_too() {
    let (api, stopped, digest) = ready_checkpoint().await;
    let action = admit(&api, &stopped, action_body(&digest)).await;
    // A worker claimed it and vanished; its lease lapsed and no sweep ran yet.
    let mut conn = api.pool().acquire().await.expect("conn");
    let request_id = stopped.request_id;
    request::transition(&mut conn, request_id, RequestEvent::Claim, None, None)
        .await
        .expect("claimed");
    let action_id = Uuid::parse_str(&action).expect("id");
    action::claim(&mut conn, action_id, 2)
        .await
        .expect("action claimed");
    sqlx::query(
        "UPDATE execution_requests SET lease_epoch = 2, lease_owner = 'gone',
                lease_deadline = now() - interval '1 second' WHERE id = $1",
    )
    .bind(request_id)
    .execute(&mut *conn)
    .await
    .expect("lapsed lease");

    let (status, run) = cancel(&api, &stopped).await;
    assert_eq!(
        (status, run["state"].as_str()),
        (StatusCode::OK, Some("cancelled")),
        "{run}"
    );
    assert_eq!(
        action_status(&api, &action).await,
        "failed",
        "no action stays executing on a cancelled request"
    );
    sweep(&api).await;
    assert_eq!(run_of(&api, &stopped).await["state"], "cancelled");
}

#[tokio::test]
async fn a_final_outcome_window_that_ends_unclaimed_frees_the_report_for_another_review() {
    let api = Api::new().await;
    let reported = retained_report(&api).await;
    let (_, candidate) = reported.candidate(&api, &api.admin).await;
    let digest = candidate["candidate_digest"].as_str().expect("digest");
    let first = admit(&api, &reported, final_body(digest)).await;

    end_window(&api, &first).await;
    sweep(&api).await;
    assert_eq!(action_status(&api, &first).await, "expired");
    let run = run_of(&api, &reported).await;
    assert_eq!(run["state"], "needs_reconciliation", "{run}");

    // The report is free again: READY, and a new review admits it.
    let (_, candidate) = reported.candidate(&api, &api.admin).await;
    assert_eq!(candidate["admission"], "READY", "{candidate}");
    assert!(hold_reasons(&candidate).is_empty(), "{candidate}");
    let digest = candidate["candidate_digest"].as_str().expect("digest");
    let second = admit(&api, &reported, final_body(digest)).await;
    assert_eq!(reported.status(&api).await["action_id"], second.as_str());
}

#[tokio::test]
async fn a_checkpoint_window_that_ends_unclaimed_expires_and_stops_at_a_new_checkpoint() {
    let (api, stopped, digest) = ready_checkpoint().await;
    let first = admit(&api, &stopped, action_body(&digest)).await;
    end_window(&api, &first).await;
    sweep(&api).await;
    assert_eq!(action_status(&api, &first).await, "expired");
    let run = run_of(&api, &stopped).await;
    assert_eq!(
        (run["state"].as_str(), run["stop_reason"].as_str()),
        (
            Some("stopped_at_checkpoint"),
            Some("continuation_window_ended")
        ),
        "{run}"
    );
    let (_, candidate) = stopped.candidate(&api, &api.viewer).await;
    assert_eq!(candidate["admission"], "READY", "{candidate}");
    let digest = candidate["candidate_digest"].as_str().expect("digest");
    admit(&api, &stopped, action_body(digest)).await;
}

#[tokio::test]
async fn once_a_policy_change_returns_no_admission_decides_on_the_old_policy() {
    let (api, stopped, digest) = ready_checkpoint().await;
    let api = Arc::new(api);
    let stopped = Arc::new(stopped);
    let action = new_action();
    // Hold the request's row, so the admission waits after reading what it reads
    // before that lock.
    let mut holder = api.pool().begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM execution_requests WHERE id = $1 FOR UPDATE")
        .bind(stopped.request_id)
        .execute(&mut *holder)
        .await
        .expect("lock");
    let admission = tokio::spawn({
        let (api, stopped, action) = (api.clone(), stopped.clone(), action.clone());
        async move {
            let body = action_body(&digest);
            stopped.act(&api, &action, &api.admin, body).await.0
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // What matters is the order of commits, not of responses: an admission may answer
    // after the change it preceded. So the change looks, the moment it returns, for the
    // admission's saved action.
    let change = tokio::spawn({
        let (api, action) = (api.clone(), action.clone());
        async move {
            let (status, _) = api.put_policy(&api.admin, json!({"enabled": false})).await;
            let admitted: i64 =
                sqlx::query_scalar("SELECT count(*) FROM continuation_actions WHERE id = $1::uuid")
                    .bind(&action)
                    .fetch_one(api.pool())
                    .await
                    .expect("count");
            (status, admitted == 1)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.rollback().await.expect("release");
    let admission = admission.await.expect("admission");
    let (change, admitted_before) = change.await.expect("change");
    assert_eq!(change, StatusCode::OK);
    if admission == StatusCode::CREATED {
        assert!(
            admitted_before,
            "the policy change returned before an admission that then decided on the old policy"
        );
    } else {
        assert_eq!(admission, StatusCode::CONFLICT);
    }
}

fn spec_with(extra: Value) -> Value {
    let mut spec = run_spec("coder");
    for (key, value) in extra.as_object().expect("object") {
        spec[key] = value.clone();
    }
    spec
}

async fn submit_keyed(api: &Api, path: &str, key: &str, body: &Value) -> (StatusCode, Value) {
    api.call_with(
        "POST",
        path,
        Some(&api.operator),
        Some(body.to_string()),
        &[("idempotency-key", key)],
    )
    .await
}

#[tokio::test]
async fn a_replay_after_the_deadline_answers_the_original_receipt() {
    let api = Api::new().await;
    let deadline = (chrono::Utc::now() + chrono::Duration::milliseconds(800)).to_rfc3339();
    let spec = spec_with(json!({"deadline": deadline}));
    let (status, first) = submit_keyed(&api, "/api/v1/runs", "late-key", &spec).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (status, replay) = submit_keyed(&api, "/api/v1/runs", "late-key", &spec).await;
    assert_eq!(status, StatusCode::OK, "{replay}");
    assert_eq!(replay["run_id"], first["run_id"]);
    assert_eq!(api.count("runs").await, 1);
}

#[tokio::test]
async fn an_omitted_default_and_the_default_sent_are_the_same_input() {
    let api = Api::new().await;
    let omitted = run_spec("coder");
    let (status, first) = submit_keyed(&api, "/api/v1/runs", "k", &omitted).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let explicit = spec_with(json!({"max_attempts": 3}));
    let (status, replay) = submit_keyed(&api, "/api/v1/runs", "k", &explicit).await;
    assert_eq!(
        (status, &replay["run_id"]),
        (StatusCode::OK, &first["run_id"])
    );
    let other = spec_with(json!({"max_attempts": 4}));
    let (status, error) = submit_keyed(&api, "/api/v1/runs", "k", &other).await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "idempotency_key_conflict")
    );
    assert_eq!(api.count("runs").await, 1);
}

#[tokio::test]
async fn a_batch_idempotency_key_admits_the_batch_once() {
    let api = Api::new().await;
    let batch = json!({"runs": [run_spec("a"), run_spec("b"), run_spec("c")]});
    let (status, first) = submit_keyed(&api, "/api/v1/runs/batch", "batch-key", &batch).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, again) = submit_keyed(&api, "/api/v1/runs/batch", "batch-key", &batch).await;
    assert_eq!(
        (status, &again["run_ids"]),
        (StatusCode::OK, &first["run_ids"])
    );
    assert_eq!(
        api.count("runs").await,
        3,
        "the same key admitted the batch once"
    );
    let other = json!({"runs": [run_spec("a")]});
    let (status, error) = submit_keyed(&api, "/api/v1/runs/batch", "batch-key", &other).await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "idempotency_key_conflict")
    );
    assert_eq!(api.count("runs").await, 3);
    assert_eq!(api.count("outbox").await, 3);
}

/// A checkpoint whose snapshot a policy retired (here a credential rotation's rule) is
/// never READY: a continuation would start without the work its receipts describe.
#[tokio::test]
async fn a_candidate_whose_checkpoint_was_reclaimed_is_held() {
    let (api, stopped, _) = ready_checkpoint().await;
    let mut conn = api.pool().acquire().await.expect("conn");
    // The receipts stand on the lineage's head (`ready_checkpoint` commits it).
    let context: Uuid = sqlx::query_scalar("SELECT work_context_id FROM runs WHERE id = $1")
        .bind(stopped.run_id)
        .fetch_one(&mut *conn)
        .await
        .expect("run");
    let (head, _) = cairn_common::lineage::head(&mut conn, context)
        .await
        .expect("head")
        .expect("a head");
    let (_, candidate) = stopped.candidate(&api, &api.viewer).await;
    assert_eq!(candidate["admission"], "READY", "{candidate}");

    sqlx::query(
        "UPDATE project_snapshots SET retention = 'retired', retired_at = now(),
                retire_reason = 'credentials_rotated' WHERE id = $1",
    )
    .bind(head)
    .execute(&mut *conn)
    .await
    .expect("retired");
    let (_, candidate) = stopped.candidate(&api, &api.viewer).await;
    assert_eq!(candidate["admission"], "HELD", "{candidate}");
    assert!(
        hold_reasons(&candidate).contains(&"checkpoint_reclaimed".to_string()),
        "{candidate}"
    );
}
