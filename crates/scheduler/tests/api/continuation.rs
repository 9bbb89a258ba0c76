//! Reviewed continuations: candidates, actions, holds, final-outcome acceptance.

use axum::http::StatusCode;
use cairn_common::journal;
use cairn_scheduler::api::{auth, auth::Role};
use serde_json::{json, Value};
use uuid::Uuid;

use super::harness::*;

/// Puts a submitted run where a lapsed lease with spent attempts leaves it: stopped at
/// its retained checkpoint, with one completed step.
async fn stop_at_checkpoint(api: &Api, run_id: &str) -> (Uuid, Uuid) {
    let run_id = Uuid::parse_str(run_id).expect("uuid");
    let request_id: Uuid =
        sqlx::query_scalar("SELECT id FROM execution_requests WHERE run_id = $1")
            .bind(run_id)
            .fetch_one(api.pool())
            .await
            .expect("request");
    // One step ran and has its receipt, under epoch 1; then the lease lapsed with the
    // attempts spent and the sweeper stopped the request at its checkpoint.
    let lease = cairn_common::lease::Lease {
        request_id,
        owner: "w1".into(),
        epoch: 1,
        deadline: chrono::Utc::now(),
    };
    let mut conn = api.pool().acquire().await.expect("conn");
    journal::write_intent(&mut conn, &lease, 1, "build", 0, false)
        .await
        .expect("intent");
    let outcome = journal::Outcome {
        exit_code: Some(0),
        signal: None,
        timed_out: false,
        wall_ms: 1200,
        cpu_ms: 800,
        output_digest: "abc".into(),
        stdout_tail: String::new(),
        stderr_tail: String::new(),
        output_artifact: String::new(),
    };
    let receipt = journal::Receipt {
        step_key: "build",
        attempt: 1,
        outcome: &outcome,
        tier: None,
    };
    journal::record_receipt(&mut conn, &lease, &receipt, None)
        .await
        .expect("receipt");
    // The source a worker observed (what a changed source is compared with).
    sqlx::query(
        "UPDATE execution_requests SET lease_epoch = 1, source_digest = 'src-1' WHERE id = $1",
    )
    .bind(request_id)
    .execute(&mut *conn)
    .await
    .expect("observed source");
    cairn_common::request::stop_at_checkpoint(&mut conn, request_id, "attempts_exhausted")
        .await
        .expect("stop");
    (run_id, request_id)
}

fn action_body(digest: &str) -> Value {
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

fn hold_reasons(candidate: &Value) -> Vec<String> {
    candidate["holds"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter_map(|h| h["reason"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_checkpoint_continuation_is_admitted_once_on_the_same_ticket() {
    let api = Api::new().await;
    let (_, run) = api
        .call(
            "POST",
            "/api/v1/runs",
            Some(&api.operator),
            Some(run_spec("coder")),
        )
        .await;
    let (run_id, request_id) = stop_at_checkpoint(&api, run["run_id"].as_str().expect("id")).await;
    let base = format!(
        "/api/v1/runs/{}/checkpoint-continuations/requests/{}",
        run_id.simple(),
        request_id.simple()
    );

    // Policy off: held, and nothing can be admitted.
    let (status, held) = api
        .call("GET", &format!("{base}/candidate"), Some(&api.viewer), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(held["kind"], "checkpoint_continuation_candidate");
    assert_eq!(held["admission"], "HELD");
    assert_eq!(hold_reasons(&held), ["policy_disabled"]);
    let action = Uuid::new_v4().simple().to_string();
    let before = api.footprint().await;
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.admin),
            Some(action_body(held["candidate_digest"].as_str().expect("d"))),
        )
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

    api.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&api.admin),
        Some(json!({"enabled": true, "allow_checkpoint_continuation": true, "maximum_window_seconds": 600})),
    )
    .await;
    let (_, ready) = api
        .call("GET", &format!("{base}/candidate"), Some(&api.viewer), None)
        .await;
    assert_eq!(ready["admission"], "READY", "{ready}");
    assert_eq!(ready["attempt"], 1);
    assert_eq!(ready["charged_usage"]["commands"], 1);
    assert_eq!(ready["limits"]["max_commands"], 10);
    assert_eq!(ready["maximum_window_seconds"], 600);
    let digest = ready["candidate_digest"]
        .as_str()
        .expect("digest")
        .to_string();
    assert_eq!(digest.len(), 64);
    assert_ne!(
        digest,
        held["candidate_digest"].as_str().unwrap_or_default(),
        "the digest binds the policy"
    );

    // Every rejection rule of the body, none of which writes anything.
    let before = api.footprint().await;
    let mut cases: Vec<(Value, StatusCode, &str)> = Vec::new();
    let mut extra = action_body(&digest);
    extra["note"] = json!("hi");
    cases.push((extra, StatusCode::BAD_REQUEST, "note"));
    for (field, bad) in [
        ("acknowledge_finite_ownership_lease", json!(1)),
        ("acknowledge_no_completed_effect_replay", json!("true")),
        ("valid_for_seconds", json!("60")),
        ("version", json!("1")),
    ] {
        let mut body = action_body(&digest);
        body[field] = bad;
        cases.push((body, StatusCode::BAD_REQUEST, field));
    }
    let mut missing = action_body(&digest);
    missing
        .as_object_mut()
        .expect("object")
        .remove("acknowledge_same_request_attempt_and_budgets");
    cases.push((missing, StatusCode::BAD_REQUEST, ""));
    for (field, bad) in [
        ("acknowledge_retained_response_consumed_once", json!(false)),
        ("version", json!(2)),
        ("valid_for_seconds", json!(0)),
        ("valid_for_seconds", json!(601)),
        ("valid_for_seconds", json!(7201)),
        ("candidate_digest", json!("abc")),
    ] {
        let mut body = action_body(&digest);
        body[field] = bad;
        cases.push((body, StatusCode::UNPROCESSABLE_ENTITY, field));
    }
    let stale = "0".repeat(64);
    cases.push((
        action_body(&stale),
        StatusCode::CONFLICT,
        "candidate_digest",
    ));
    for (body, status, field) in cases {
        let (got, error) = api
            .call(
                "POST",
                &format!("{base}/actions/{action}"),
                Some(&api.admin),
                Some(body.clone()),
            )
            .await;
        assert_eq!(got, status, "{body}: {error}");
        if !field.is_empty() {
            assert_eq!(error_field(&error), field, "{body}: {error}");
        }
    }
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/actions/NOT-AN-ID"),
            Some(&api.admin),
            Some(action_body(&digest)),
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::BAD_REQUEST, "action_id")
    );
    let (status, _) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.operator),
            Some(action_body(&digest)),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "admission is for admins");
    assert_eq!(api.footprint().await, before);

    let (_, status_before) = api
        .call("GET", &format!("{base}/status"), Some(&api.viewer), None)
        .await;
    assert_eq!(status_before["status"], "not_recovered");

    // Admit it.
    let (status, receipt) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.admin),
            Some(action_body(&digest)),
        )
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
    .bind(request_id)
    .fetch_one(api.pool())
    .await
    .expect("request");
    assert_eq!(
        (state.as_str(), attempt, used, epoch),
        ("queued", 1, 1, 2),
        "same ticket, same attempt, usage kept"
    );

    // The same id and input: the same receipt, nothing more admitted.
    let (status, again) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.admin),
            Some(action_body(&digest)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(again, receipt);
    assert_eq!(
        (
            api.count("continuation_actions").await,
            api.count("outbox").await
        ),
        (1, 2)
    );
    // The same id with changed input: 409.
    let mut changed = action_body(&digest);
    changed["valid_for_seconds"] = json!(61);
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.admin),
            Some(changed),
        )
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "action_id_conflict")
    );
    // Another action for the same checkpoint: 409.
    let other = Uuid::new_v4().simple().to_string();
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/actions/{other}"),
            Some(&api.admin),
            Some(action_body(&digest)),
        )
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "checkpoint_already_admitted")
    );
    assert_eq!(
        (
            api.count("continuation_actions").await,
            api.count("outbox").await
        ),
        (1, 2)
    );

    let (_, read) = api
        .call("GET", &format!("{base}/status"), Some(&api.viewer), None)
        .await;
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
    api.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&api.admin),
        Some(json!({"enabled": true, "allow_checkpoint_continuation": true})),
    )
    .await;
    let cases: [(&str, &str); 6] = [
        ("live_owner", "UPDATE execution_requests SET lease_owner = 'w', lease_deadline = now() + interval '1 minute' WHERE id = $1"),
        ("changed_source", "UPDATE execution_requests SET source_digest = 'src-2' WHERE id = $1"),
        ("missing_custody", "UPDATE execution_requests SET checkpoint = NULL WHERE id = $1"),
        ("unknown_effect", "INSERT INTO journal_intents (request_id, step_key, step_index, idempotent, lease_epoch, attempt) VALUES ($1, 'test', 1, false, 2, 1)"),
        ("exhausted_limits", "UPDATE execution_requests SET used_commands = max_commands WHERE id = $1"),
        ("revoked_access", "UPDATE api_tokens SET revoked_at = now() WHERE id = (SELECT operator_id FROM runs r JOIN execution_requests e ON e.run_id = r.id WHERE e.id = $1)"),
    ];
    for (reason, change) in cases {
        let submitter = auth::generate();
        auth::insert(api.pool(), reason, Role::Operator, &submitter)
            .await
            .expect("token");
        let (_, run) = api
            .call(
                "POST",
                "/api/v1/runs",
                Some(&submitter),
                Some(run_spec("coder")),
            )
            .await;
        let (run_id, request_id) =
            stop_at_checkpoint(&api, run["run_id"].as_str().expect("id")).await;
        let base = format!(
            "/api/v1/runs/{}/checkpoint-continuations/requests/{}",
            run_id.simple(),
            request_id.simple()
        );
        let (_, ready) = api
            .call("GET", &format!("{base}/candidate"), Some(&api.viewer), None)
            .await;
        assert_eq!(ready["admission"], "READY", "{reason}: {ready}");
        sqlx::query(change)
            .bind(request_id)
            .execute(api.pool())
            .await
            .expect("change");
        let (_, held) = api
            .call("GET", &format!("{base}/candidate"), Some(&api.viewer), None)
            .await;
        assert_eq!(held["admission"], "HELD", "{reason}");
        assert!(
            hold_reasons(&held).contains(&reason.to_string()),
            "{reason}: {held}"
        );
        let action = Uuid::new_v4().simple().to_string();
        let (status, error) = api
            .call(
                "POST",
                &format!("{base}/actions/{action}"),
                Some(&api.admin),
                Some(action_body(ready["candidate_digest"].as_str().expect("d"))),
            )
            .await;
        assert_eq!(
            (status, error_code(&error)),
            (StatusCode::CONFLICT, "candidate_held"),
            "{reason}"
        );
    }
    assert_eq!(api.count("continuation_actions").await, 0);
}

fn final_body(digest: &str) -> Value {
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

#[tokio::test]
async fn only_the_original_operator_as_admin_accepts_a_retained_report() {
    let api = Api::new().await;
    api.call(
        "PUT",
        "/api/v1/invalid-read-continuity/policy",
        Some(&api.admin),
        Some(json!({"enabled": true, "allow_final_outcome_continuation": true})),
    )
    .await;
    // The admin submitted the run; its report was saved but never accepted.
    let (_, run) = api
        .call(
            "POST",
            "/api/v1/runs",
            Some(&api.admin),
            Some(run_spec("coder")),
        )
        .await;
    let run_id = Uuid::parse_str(run["run_id"].as_str().expect("id")).expect("uuid");
    let request_id: Uuid =
        sqlx::query_scalar("SELECT id FROM execution_requests WHERE run_id = $1")
            .bind(run_id)
            .fetch_one(api.pool())
            .await
            .expect("request");
    sqlx::query("UPDATE execution_requests SET state = 'needs_reconciliation', lease_epoch = 1 WHERE id = $1")
        .bind(request_id)
        .execute(api.pool())
        .await
        .expect("state");
    sqlx::query("INSERT INTO final_reports (request_id, outcome, followup_kind, body, lease_epoch) VALUES ($1, 'blocked', 'verification', '{\"question\": \"run the tests?\"}', 1)")
        .bind(request_id)
        .execute(api.pool())
        .await
        .expect("report");
    let base = format!(
        "/api/v1/runs/{}/final-outcome-continuations/requests/{}",
        run_id.simple(),
        request_id.simple()
    );

    let (_, candidate) = api
        .call("GET", &format!("{base}/candidate"), Some(&api.admin), None)
        .await;
    assert_eq!(candidate["kind"], "final_outcome_continuation_candidate");
    assert_eq!(candidate["admission"], "READY", "{candidate}");
    assert_eq!(candidate["admission_window_purpose"], "claim_only");
    assert_eq!(candidate["retained_outcome"]["outcome"], "blocked");
    assert_eq!(
        candidate["retained_outcome"]["followup_kind"],
        "verification"
    );
    let digest = candidate["candidate_digest"]
        .as_str()
        .expect("digest")
        .to_string();

    // Another admin: held for access, and a POST is refused.
    let other_admin = auth::generate();
    auth::insert(api.pool(), "other-admin", Role::Admin, &other_admin)
        .await
        .expect("token");
    let (_, theirs) = api
        .call(
            "GET",
            &format!("{base}/candidate"),
            Some(&other_admin),
            None,
        )
        .await;
    assert!(
        hold_reasons(&theirs).contains(&"revoked_access".to_string()),
        "{theirs}"
    );
    let action = Uuid::new_v4().simple().to_string();
    let (status, _) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&other_admin),
            Some(final_body(&digest)),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The checkpoint body is not this route's body.
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.admin),
            Some(action_body(&digest)),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    let (_, read) = api
        .call("GET", &format!("{base}/status"), Some(&api.viewer), None)
        .await;
    assert_eq!(read["status"], "not_recovered");
    assert_eq!(api.count("continuation_actions").await, 0);

    let (status, receipt) = api
        .call(
            "POST",
            &format!("{base}/actions/{action}"),
            Some(&api.admin),
            Some(final_body(&digest)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{receipt}");
    assert_eq!(receipt["kind"], "final_outcome_continuation_status");
    assert_eq!(receipt["lease"]["admission_window_purpose"], "claim_only");
    let (_, read) = api
        .call("GET", &format!("{base}/status"), Some(&api.viewer), None)
        .await;
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
