//! Reviewed continuations: candidates, actions, holds, final-outcome acceptance.

use axum::http::StatusCode;
use cairn_common::testing;
use cairn_scheduler::api::{auth, auth::Role};
use serde_json::{json, Value};
use uuid::Uuid;

use super::harness::*;

/// The routes of one request's continuation (checkpoint or final outcome).
pub(super) struct Continuation {
    pub(super) run_id: Uuid,
    pub(super) request_id: Uuid,
    pub(super) base: String,
}

impl Continuation {
    fn of(kind: &str, run_id: Uuid, request_id: Uuid) -> Continuation {
        let base = format!(
            "/api/v1/runs/{}/{kind}/requests/{}",
            run_id.simple(),
            request_id.simple()
        );
        Continuation {
            run_id,
            request_id,
            base,
        }
    }

    pub(super) async fn candidate(&self, api: &Api, token: &str) -> (StatusCode, Value) {
        api.get(&format!("{}/candidate", self.base), token).await
    }

    pub(super) async fn act(
        &self,
        api: &Api,
        action: &str,
        token: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        api.post(
            &format!("{}/actions/{action}", self.base),
            token,
            Some(body),
        )
        .await
    }

    pub(super) async fn status(&self, api: &Api) -> Value {
        api.get(&format!("{}/status", self.base), &api.viewer)
            .await
            .1
    }
}

/// Submits a run as `submitter` and puts it where a lapsed lease with spent attempts
/// leaves it: stopped at its retained checkpoint, with one completed step.
pub(super) async fn stop_at_checkpoint(api: &Api, submitter: &str) -> Continuation {
    let (run_id, request_id) = api.request_of(&api.submit(submitter).await).await;
    // One step ran and has its receipt, under epoch 1; then the lease lapsed with the
    // attempts spent and the sweeper stopped the request at its checkpoint.
    let lease = first_lease(request_id);
    let mut conn = api.pool().acquire().await.expect("conn");
    journal_steps(&mut conn, &lease, &["build"], &exited_zero(1200, 800)).await;
    sqlx::query("UPDATE execution_requests SET lease_epoch = 1 WHERE id = $1")
        .bind(request_id)
        .execute(&mut *conn)
        .await
        .expect("the lease's epoch");
    cairn_common::request::stop_at_checkpoint(&mut conn, request_id, "attempts_exhausted")
        .await
        .expect("stop");
    Continuation::of("checkpoint-continuations", run_id, request_id)
}

/// A checkpoint whose candidate the policy lets through (in windows of up to 600
/// seconds), with its candidate digest.
pub(super) async fn ready_checkpoint() -> (Api, Continuation, String) {
    let api = Api::new().await;
    let stopped = stop_at_checkpoint(&api, &api.operator).await;
    allow_checkpoints_for_600_seconds(&api).await;
    let (_, ready) = stopped.candidate(&api, &api.viewer).await;
    assert_eq!(ready["admission"], "READY", "{ready}");
    let digest = ready["candidate_digest"].as_str().expect("digest").into();
    (api, stopped, digest)
}

async fn allow_checkpoints_for_600_seconds(api: &Api) {
    api.put_policy(
        &api.admin,
        json!({"enabled": true, "allow_checkpoint_continuation": true, "maximum_window_seconds": 600}),
    )
    .await;
}

pub(super) fn new_action() -> String {
    Uuid::new_v4().simple().to_string()
}

pub(super) fn action_body(digest: &str) -> Value {
    json!({
        "version": 1,
        "candidate_digest": digest,
        "valid_for_seconds": 60,
        "acknowledge_retained_response_consumed_once": true,
        "acknowledge_no_completed_effect_replay": true,
        "acknowledge_same_request_attempt_and_budgets": true,
        "acknowledge_finite_ownership_lease": true
    })
}

pub(super) fn hold_reasons(candidate: &Value) -> Vec<String> {
    candidate["holds"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter_map(|h| h["reason"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// (continuation actions, outbox messages): what an admission writes.
async fn actions_and_messages(api: &Api) -> (i64, i64) {
    (
        api.count("continuation_actions").await,
        api.count("outbox").await,
    )
}

#[tokio::test]
async fn the_policy_holds_a_checkpoint_candidate_and_is_bound_into_its_digest() {
    let api = Api::new().await;
    let stopped = stop_at_checkpoint(&api, &api.operator).await;

    // Policy off: held, and nothing can be admitted.
    let (status, held) = stopped.candidate(&api, &api.viewer).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(held["kind"], "checkpoint_continuation_candidate");
    assert_eq!(held["admission"], "HELD");
    assert_eq!(hold_reasons(&held), ["policy_disabled"]);
    let before = api.footprint().await;
    let held_digest = held["candidate_digest"].as_str().expect("d");
    let (status, error) = stopped
        .act(&api, &new_action(), &api.admin, action_body(held_digest))
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "candidate_held")
    );
    assert_eq!(
        api.footprint().await,
        before,
        "a held candidate admits nothing"
    );

    allow_checkpoints_for_600_seconds(&api).await;
    let (_, ready) = stopped.candidate(&api, &api.viewer).await;
    assert_eq!(ready["admission"], "READY", "{ready}");
    assert_eq!(ready["attempt"], 1);
    assert_eq!(ready["charged_usage"]["commands"], 1);
    assert_eq!(ready["limits"]["max_commands"], 10);
    assert_eq!(ready["maximum_window_seconds"], 600);
    let digest = ready["candidate_digest"].as_str().expect("digest");
    assert_eq!(digest.len(), 64);
    assert_ne!(digest, held_digest, "the digest binds the policy");
}

#[tokio::test]
async fn every_bad_checkpoint_action_is_rejected_and_changes_nothing() {
    let (api, stopped, digest) = ready_checkpoint().await;
    let action = new_action();
    let before = api.footprint().await;
    let mut cases: Vec<(Value, StatusCode, &str)> = Vec::new();
    let mut extra = action_body(&digest);
    extra["note"] = json!("hi");
    cases.push((extra, StatusCode::BAD_REQUEST, "note"));
    let mut missing = action_body(&digest);
    missing
        .as_object_mut()
        .expect("object")
        .remove("acknowledge_same_request_attempt_and_budgets");
    cases.push((missing, StatusCode::BAD_REQUEST, ""));
    // A field of the wrong type is a bad request; a well-typed bad value, unprocessable.
    for (status, changes) in [
        (
            StatusCode::BAD_REQUEST,
            vec![
                ("acknowledge_finite_ownership_lease", json!(1)),
                ("acknowledge_no_completed_effect_replay", json!("true")),
                ("valid_for_seconds", json!("60")),
                ("version", json!("1")),
            ],
        ),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            vec![
                ("acknowledge_retained_response_consumed_once", json!(false)),
                ("version", json!(2)),
                ("valid_for_seconds", json!(0)),
                ("valid_for_seconds", json!(601)),
                ("valid_for_seconds", json!(7201)),
                ("candidate_digest", json!("abc")),
            ],
        ),
    ] {
        for (field, bad) in changes {
            let mut body = action_body(&digest);
            body[field] = bad;
            cases.push((body, status, field));
        }
    }
    let stale = "0".repeat(64);
    cases.push((
        action_body(&stale),
        StatusCode::CONFLICT,
        "candidate_digest",
    ));
    for (body, status, field) in cases {
        let (got, error) = stopped.act(&api, &action, &api.admin, body.clone()).await;
        assert_eq!(got, status, "{body}: {error}");
        if !field.is_empty() {
            assert_eq!(error_field(&error), field, "{body}: {error}");
        }
    }
    let (status, error) = stopped
        .act(&api, "NOT-AN-ID", &api.admin, action_body(&digest))
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::BAD_REQUEST, "action_id")
    );
    let (status, _) = stopped
        .act(&api, &action, &api.operator, action_body(&digest))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "admission is for admins");
    assert_eq!(api.footprint().await, before);
}

#[tokio::test]
async fn a_checkpoint_continuation_is_admitted_once_on_the_same_ticket() {
    let (api, stopped, digest) = ready_checkpoint().await;
    let action = new_action();
    assert_eq!(stopped.status(&api).await["status"], "not_recovered");

    let (status, receipt) = stopped
        .act(&api, &action, &api.admin, action_body(&digest))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{receipt}");
    assert_eq!(receipt["action_id"], action);
    assert_eq!(receipt["status"], "queued");
    assert_eq!(receipt["lease"]["valid_for_seconds"], 60);
    let outbox: Vec<(String, Value)> = sqlx::query_as(
        "SELECT routing_key, payload FROM outbox WHERE routing_key = 'continuations'",
    )
    .fetch_all(api.pool())
    .await
    .expect("outbox");
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].1["kind"], "checkpoint_continuation");
    let (state, attempt, used, epoch): (String, i32, i32, i64) = sqlx::query_as(
        "SELECT state, attempt, used_commands, lease_epoch FROM execution_requests WHERE id = $1",
    )
    .bind(stopped.request_id)
    .fetch_one(api.pool())
    .await
    .expect("request");
    assert_eq!(
        (state.as_str(), attempt, used, epoch),
        ("queued", 1, 1, 2),
        "same ticket, same attempt, usage kept"
    );

    // The same id and input: the same receipt, nothing more admitted.
    let (status, again) = stopped
        .act(&api, &action, &api.admin, action_body(&digest))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(again, receipt);
    assert_eq!(actions_and_messages(&api).await, (1, 2));
    // The same id with changed input: 409.
    let mut changed = action_body(&digest);
    changed["valid_for_seconds"] = json!(61);
    let (status, error) = stopped.act(&api, &action, &api.admin, changed).await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "action_id_conflict")
    );
    // Another action for the same checkpoint: 409.
    let (status, error) = stopped
        .act(&api, &new_action(), &api.admin, action_body(&digest))
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "checkpoint_already_admitted")
    );
    assert_eq!(actions_and_messages(&api).await, (1, 2));

    let read = stopped.status(&api).await;
    assert_eq!(read["kind"], "checkpoint_continuation_status");
    assert_eq!(read["status"], "queued");
    assert_eq!(read["action_id"], action);
    assert_eq!(read["witness_digest"], receipt["witness_digest"]);
    assert_eq!(read["admission_seal"], receipt["admission_seal"]);
    assert!(read["lease"]["window_ends_at"].is_string());
}

#[tokio::test]
async fn each_hold_reason_keeps_a_checkpoint_candidate_held() {
    let api = Api::new().await;
    api.put_policy(
        &api.admin,
        json!({"enabled": true, "allow_checkpoint_continuation": true}),
    )
    .await;
    let cases: [(&str, &str); 6] = [
        ("live_owner", "UPDATE execution_requests SET lease_owner = 'w', lease_deadline = now() + interval '1 minute' WHERE id = $1"),
        // Another run of the same work context moves its tree on (below).
        ("changed_source", ""),
        ("missing_custody", "UPDATE execution_requests SET checkpoint = NULL WHERE id = $1"),
        ("unknown_effect", "INSERT INTO journal_intents (request_id, step_key, step_index, idempotent, lease_epoch, attempt) VALUES ($1, 'test', 1, false, 2, 1)"),
        ("exhausted_limits", "UPDATE execution_requests SET used_commands = max_commands WHERE id = $1"),
        ("revoked_access", "UPDATE api_tokens SET revoked_at = now() WHERE id = (SELECT operator_id FROM runs r JOIN execution_requests e ON e.run_id = r.id WHERE e.id = $1)"),
    ];
    for (reason, change) in cases {
        // Each run has a submitter of its own, so revoking one token holds only its run.
        let submitter = auth::generate();
        auth::insert(
            api.pool(),
            reason,
            Role::Operator,
            Some("default"),
            &submitter,
        )
        .await
        .expect("token");
        let stopped = stop_at_checkpoint(&api, &submitter).await;
        let (_, ready) = stopped.candidate(&api, &api.viewer).await;
        assert_eq!(ready["admission"], "READY", "{reason}: {ready}");
        if change.is_empty() {
            let mut conn = api.pool().acquire().await.expect("conn");
            testing::commit_tree(&mut conn, stopped.request_id, "a later tree").await;
        } else {
            sqlx::query(change)
                .bind(stopped.request_id)
                .execute(api.pool())
                .await
                .expect("change");
        }
        let (_, held) = stopped.candidate(&api, &api.viewer).await;
        assert_eq!(held["admission"], "HELD", "{reason}");
        assert!(
            hold_reasons(&held).contains(&reason.to_string()),
            "{reason}: {held}"
        );
        let ready_digest = ready["candidate_digest"].as_str().expect("d");
        let (status, error) = stopped
            .act(&api, &new_action(), &api.admin, action_body(ready_digest))
            .await;
        assert_eq!(
            (status, error_code(&error)),
            (StatusCode::CONFLICT, "candidate_held"),
            "{reason}"
        );
    }
    assert_eq!(api.count("continuation_actions").await, 0);
}

pub(super) fn final_body(digest: &str) -> Value {
    json!({
        "version": 1,
        "candidate_digest": digest,
        "valid_for_seconds": 60,
        "acknowledge_already_consumed_final_output": true,
        "acknowledge_no_completed_effect_replay": true,
        "acknowledge_same_request_attempt_and_budgets": true,
        "acknowledge_finite_ownership_lease": true
    })
}

/// A run the admin submitted whose final report was retained and never accepted (its
/// request needs reconciliation), with final-outcome continuations allowed.
pub(super) async fn retained_report(api: &Api) -> Continuation {
    api.put_policy(
        &api.admin,
        json!({"enabled": true, "allow_final_outcome_continuation": true}),
    )
    .await;
    let (run_id, request_id) = api.request_of(&api.submit(&api.admin).await).await;
    cairn_common::testing::retain_unaccepted_report(api.pool(), request_id).await;
    Continuation::of("final-outcome-continuations", run_id, request_id)
}

/// A report is accepted only on the tree it was made on: once another run moved the
/// work context's tree on, the candidate holds with `changed_source` and nothing is
/// admitted.
#[tokio::test]
async fn a_retained_report_on_a_changed_source_is_held() {
    let api = Api::new().await;
    let reported = retained_report(&api).await;
    let (_, ready) = reported.candidate(&api, &api.admin).await;
    assert_eq!(ready["admission"], "READY", "{ready}");
    let mut conn = api.pool().acquire().await.expect("conn");
    testing::commit_tree(&mut conn, reported.request_id, "a later tree").await;
    let (_, held) = reported.candidate(&api, &api.admin).await;
    assert_eq!(hold_reasons(&held), ["changed_source"], "{held}");
    let digest = ready["candidate_digest"].as_str().expect("digest");
    let (status, error) = reported
        .act(&api, &new_action(), &api.admin, final_body(digest))
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "candidate_held")
    );
    assert_eq!(api.count("continuation_actions").await, 0);
}

#[tokio::test]
async fn only_the_original_operator_as_admin_accepts_a_retained_report() {
    let api = Api::new().await;
    let reported = retained_report(&api).await;

    let (_, candidate) = reported.candidate(&api, &api.admin).await;
    assert_eq!(candidate["kind"], "final_outcome_continuation_candidate");
    assert_eq!(candidate["admission"], "READY", "{candidate}");
    assert_eq!(candidate["admission_window_purpose"], "claim_only");
    assert_eq!(candidate["retained_outcome"]["outcome"], "blocked");
    assert_eq!(
        candidate["retained_outcome"]["followup_kind"],
        "verification"
    );
    let digest = candidate["candidate_digest"].as_str().expect("digest");

    // Another admin: held for access, and a POST is refused.
    let other_admin = auth::generate();
    auth::insert(
        api.pool(),
        "other-admin",
        Role::Admin,
        Some("default"),
        &other_admin,
    )
    .await
    .expect("token");
    let (_, theirs) = reported.candidate(&api, &other_admin).await;
    assert!(
        hold_reasons(&theirs).contains(&"revoked_access".to_string()),
        "{theirs}"
    );
    let action = new_action();
    let (status, _) = reported
        .act(&api, &action, &other_admin, final_body(digest))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The checkpoint body is not this route's body.
    let (status, error) = reported
        .act(&api, &action, &api.admin, action_body(digest))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(reported.status(&api).await["status"], "not_recovered");
    assert_eq!(api.count("continuation_actions").await, 0);

    let (status, receipt) = reported
        .act(&api, &action, &api.admin, final_body(digest))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{receipt}");
    assert_eq!(receipt["kind"], "final_outcome_continuation_status");
    assert_eq!(receipt["lease"]["admission_window_purpose"], "claim_only");
    let read = reported.status(&api).await;
    assert_eq!(
        (read["status"].as_str(), read["action_id"].as_str()),
        (Some("queued"), Some(action.as_str()))
    );
    let consumed = api.count("report_consumptions").await;
    assert_eq!(
        consumed, 0,
        "admission does not accept the report; a worker does, once"
    );
}

/// A continuation needs a qualified, registered source profile: the install's first
/// start registers its release's; revoking it holds every candidate until a platform
/// admin qualifies it again, and only a platform admin may change it.
#[tokio::test]
async fn a_candidate_is_held_while_the_implementations_source_profile_is_not_qualified() {
    let api = Api::new().await;
    api.put_policy(
        &api.admin,
        json!({"enabled": true, "allow_checkpoint_continuation": true}),
    )
    .await;
    let stopped = stop_at_checkpoint(&api, &api.operator).await;
    let (_, ready) = stopped.candidate(&api, &api.viewer).await;
    assert_eq!(ready["admission"], "READY", "{ready}");
    let current = cairn_common::qualification::current();
    assert_eq!(ready["source_profile"], current.as_str());
    assert_eq!(
        ready["checkpoint"]["implementation_profile"],
        current.as_str()
    );
    let (status, view) = api.get("/api/v1/qualification", &api.viewer).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["current"]["profile_digest"], current.as_str());
    assert_eq!(view["current"]["status"], "qualified");
    assert_eq!(view["current"]["profile"]["journal"], 3);
    assert_eq!(view["profiles"].as_array().map(Vec::len), Some(1));

    // Only a platform admin changes it; bad input changes nothing.
    let path = format!("/api/v1/qualification/profiles/{current}");
    let revoke = json!({"qualified": false, "note": "a regression in restores"});
    let (status, _) = api
        .call("PUT", &path, Some(&api.operator), Some(revoke.clone()))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let bad = [
        (
            "/api/v1/qualification/profiles/abc",
            revoke.clone(),
            StatusCode::BAD_REQUEST,
        ),
        (
            path.as_str(),
            json!({"qualified": "false"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            path.as_str(),
            json!({"qualified": false, "extra": 1}),
            StatusCode::BAD_REQUEST,
        ),
        (
            path.as_str(),
            json!({"qualified": false, "note": "x".repeat(1001)}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (at, body, expected) in bad {
        let (status, error) = api.call("PUT", at, Some(&api.admin), Some(body)).await;
        assert_eq!(status, expected, "{at}: {error}");
    }
    let unknown = format!("/api/v1/qualification/profiles/{}", "0".repeat(64));
    let (status, _) = api
        .call("PUT", &unknown, Some(&api.admin), Some(revoke.clone()))
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "an unknown profile is not registered"
    );
    let (_, unchanged) = stopped.candidate(&api, &api.viewer).await;
    assert_eq!(unchanged["candidate_digest"], ready["candidate_digest"]);

    // Revoked: held, and an action quoting the ready digest is refused.
    let (status, saved) = api.call("PUT", &path, Some(&api.admin), Some(revoke)).await;
    assert_eq!(status, StatusCode::OK, "{saved}");
    assert_eq!(
        (saved["status"].as_str(), saved["revision"].as_i64()),
        (Some("revoked"), Some(2))
    );
    let (_, held) = stopped.candidate(&api, &api.viewer).await;
    assert_eq!(held["admission"], "HELD", "{held}");
    assert_eq!(hold_reasons(&held), ["incompatible_qualification"]);
    let ready_digest = ready["candidate_digest"].as_str().expect("digest");
    let (status, error) = stopped
        .act(&api, &new_action(), &api.admin, action_body(ready_digest))
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "candidate_held")
    );
    assert_eq!(api.count("continuation_actions").await, 0);

    // Qualified again: ready, with the same digest as before.
    let qualify = json!({"qualified": true, "note": "restores fixed and re-run"});
    let (status, saved) = api
        .call("PUT", &path, Some(&api.admin), Some(qualify))
        .await;
    assert_eq!(
        (status, saved["status"].as_str()),
        (StatusCode::OK, Some("qualified"))
    );
    let (_, again) = stopped.candidate(&api, &api.viewer).await;
    assert_eq!(again["admission"], "READY", "{again}");
    assert_eq!(again["candidate_digest"], ready["candidate_digest"]);
}

/// A request that is not where a kind continues from holds with `not_recoverable`: a
/// queued run has no checkpoint to continue and no report awaiting acceptance.
#[tokio::test]
async fn a_request_that_has_not_stopped_is_not_recoverable() {
    let api = Api::new().await;
    api.put_policy(
        &api.admin,
        json!({"enabled": true, "allow_checkpoint_continuation": true, "allow_final_outcome_continuation": true}),
    )
    .await;
    let run_id = api.submit(&api.operator).await;
    let (run_id, request_id) = api.request_of(&run_id).await;
    let (run, request) = (run_id.simple(), request_id.simple());
    for kind in ["checkpoint-continuations", "final-outcome-continuations"] {
        let path = format!("/api/v1/runs/{run}/{kind}/requests/{request}/candidate");
        let (status, held) = api.get(&path, &api.admin).await;
        assert_eq!(status, StatusCode::OK, "{held}");
        assert_eq!(held["admission"], "HELD", "{kind}: {held}");
        assert!(
            hold_reasons(&held).contains(&"not_recoverable".to_string()),
            "{kind}: {held}"
        );
    }
}
