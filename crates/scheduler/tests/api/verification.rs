//! Verification handoffs: candidates and adoptions.

use axum::http::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use super::harness::*;

/// Puts a submitted run where an accepted report asking for verification leaves it:
/// awaiting verification with a pending handoff of three frozen checks.
async fn awaiting_verification(api: &Api) -> (String, Uuid) {
    let (status, run) = api
        .call(
            "POST",
            "/api/v1/runs",
            Some(&api.operator),
            Some(run_spec("coder")),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let run_id = run["run_id"].as_str().expect("run id").to_string();
    let run_uuid = Uuid::parse_str(&run_id).expect("uuid");
    let request_id: Uuid =
        sqlx::query_scalar("SELECT id FROM execution_requests WHERE run_id = $1")
            .bind(run_uuid)
            .fetch_one(api.pool())
            .await
            .expect("request");
    // Two steps ran under epoch 1; the last one's report asks for verification of three
    // checks, and its acceptance opened the handoff.
    let lease = cairn_common::lease::Lease {
        request_id,
        owner: "w1".into(),
        epoch: 1,
        deadline: chrono::Utc::now(),
    };
    let outcome = cairn_common::journal::Outcome {
        exit_code: Some(0),
        signal: None,
        timed_out: false,
        wall_ms: 10,
        cpu_ms: 1,
        output_digest: "abc".into(),
        stdout_tail: String::new(),
        stderr_tail: String::new(),
        output_artifact: String::new(),
    };
    let mut conn = api.pool().acquire().await.expect("conn");
    for (index, key) in ["build", "report"].into_iter().enumerate() {
        cairn_common::journal::write_intent(&mut conn, &lease, 1, key, index, false)
            .await
            .expect("intent");
        let receipt = cairn_common::journal::Receipt {
            step_key: key,
            attempt: 1,
            outcome: &outcome,
            tier: None,
        };
        cairn_common::journal::record_receipt(&mut conn, &lease, &receipt, None)
            .await
            .expect("receipt");
    }
    let body = json!({
        "outcome": "complete",
        "followup_kind": "verification",
        "verification": {"commands": [
            {"argv": ["cargo", "build"], "purpose": "source_build"},
            {"argv": ["cargo", "test"], "purpose": "test", "env": {"RUST_LOG": "info"}},
            {"argv": ["./db-suite"], "purpose": "database_integration"}
        ]}
    });
    let source = "a".repeat(64);
    let retained = cairn_common::report::RetainedReport {
        outcome: "complete",
        followup_kind: Some("verification"),
        body: &body,
        source_digest: Some(&source),
    };
    cairn_common::report::retain(&mut conn, &lease, &retained)
        .await
        .expect("retain");
    let accepted = cairn_common::report::accept(&mut conn, &lease, None, "w1")
        .await
        .expect("accept");
    assert_eq!(
        accepted,
        cairn_common::report::Acceptance::Accepted { verification: true }
    );
    (run_id, request_id)
}

fn adoption_body(candidate: &Value, request_id: &str, reusable: &[usize]) -> Value {
    let checks: Vec<Value> = reusable
        .iter()
        .map(|i| {
            json!({
                "command_digest": candidate["commands"][i - 1]["command_digest"],
                "purpose": "source_build",
                "independent_of_time_and_external_state": true
            })
        })
        .collect();
    json!({
        "request_id": request_id,
        "agent": candidate["agent"],
        "pending_request_digest": candidate["pending_request_digest"],
        "source_digest": candidate["source_digest"],
        "commands_digest": candidate["commands_digest"],
        "policy_digest": candidate["policy_digest"],
        "provider_digest": candidate["provider_digest"],
        "reusable_build_checks": checks
    })
}

#[tokio::test]
async fn a_verification_handoff_is_adopted_once_and_every_bad_adoption_changes_nothing() {
    let api = Api::new().await;
    let (run_id, request_id) = awaiting_verification(&api).await;
    let base = format!("/api/v1/runs/{run_id}/verification-handoffs");

    let (status, error) = api
        .call(
            "GET",
            &format!("{base}/candidates"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::BAD_REQUEST, "agent")
    );
    let (status, error) = api
        .call(
            "GET",
            &format!("{base}/candidates?agent=other"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::UNPROCESSABLE_ENTITY, "agent")
    );
    let (status, candidate) = api
        .call(
            "GET",
            &format!("{base}/candidates?agent=coder"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{candidate}");
    assert_eq!(candidate["admission"], "READY");
    for field in [
        "pending_request_digest",
        "source_digest",
        "commands_digest",
        "policy_digest",
        "provider_digest",
    ] {
        assert!(
            candidate[field]
                .as_str()
                .is_some_and(cairn_common::digest::is_digest),
            "{field}: {candidate}"
        );
    }
    let reusable = candidate["reusable_build_candidates"]
        .as_array()
        .expect("candidates");
    assert_eq!(
        reusable.len(),
        2,
        "the database check is never offered: {candidate}"
    );
    assert_eq!(reusable[0]["index"], 1);
    assert_eq!(reusable[0]["arguments"], json!(["cargo", "build"]));
    assert_eq!(reusable[1]["index"], 2);
    assert_eq!(candidate["budget"]["remaining_commands"], 8);

    let id = "0123456789abcdef0123456789abcdef";
    let good = adoption_body(&candidate, id, &[1]);
    let before = api.footprint().await;
    let mut rejections: Vec<(Value, StatusCode, &str, &str)> = Vec::new();
    // Shape: ids, digests, the acknowledgement, duplicates, unknown fields, coercion.
    let mut bad_id = good.clone();
    bad_id["request_id"] = json!("0123456789ABCDEF0123456789ABCDEF");
    rejections.push((bad_id, StatusCode::BAD_REQUEST, "invalid_id", "request_id"));
    let mut bad_digest = good.clone();
    bad_digest["policy_digest"] = json!("abc");
    rejections.push((
        bad_digest,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "policy_digest",
    ));
    let mut unacknowledged = good.clone();
    unacknowledged["reusable_build_checks"][0]["independent_of_time_and_external_state"] =
        json!(false);
    rejections.push((
        unacknowledged,
        StatusCode::UNPROCESSABLE_ENTITY,
        "acknowledgement_required",
        "reusable_build_checks[0].independent_of_time_and_external_state",
    ));
    let mut coerced = good.clone();
    coerced["reusable_build_checks"][0]["independent_of_time_and_external_state"] = json!("true");
    rejections.push((
        coerced,
        StatusCode::BAD_REQUEST,
        "invalid_body",
        "reusable_build_checks[0].independent_of_time_and_external_state",
    ));
    let mut wrong_purpose = good.clone();
    wrong_purpose["reusable_build_checks"][0]["purpose"] = json!("test");
    rejections.push((
        wrong_purpose,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "reusable_build_checks[0].purpose",
    ));
    let mut duplicate = adoption_body(&candidate, id, &[1, 1]);
    duplicate["request_id"] = json!(id);
    rejections.push((
        duplicate,
        StatusCode::UNPROCESSABLE_ENTITY,
        "duplicate_selection",
        "reusable_build_checks[1].command_digest",
    ));
    let mut unknown_field = good.clone();
    unknown_field["reuse_everything"] = json!(true);
    rejections.push((
        unknown_field,
        StatusCode::BAD_REQUEST,
        "invalid_body",
        "reuse_everything",
    ));
    // Against the candidate: changed digests, unknown and never-reusable checks.
    for field in [
        "pending_request_digest",
        "source_digest",
        "commands_digest",
        "policy_digest",
        "provider_digest",
    ] {
        let mut changed = good.clone();
        changed[field] = json!("b".repeat(64));
        rejections.push((changed, StatusCode::CONFLICT, "stale_candidate", field));
    }
    let mut unknown_command = good.clone();
    unknown_command["reusable_build_checks"][0]["command_digest"] = json!("c".repeat(64));
    rejections.push((
        unknown_command,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_command_digest",
        "reusable_build_checks[0].command_digest",
    ));
    let database = adoption_body(&candidate, id, &[3]);
    rejections.push((
        database,
        StatusCode::UNPROCESSABLE_ENTITY,
        "not_reusable",
        "reusable_build_checks[0].command_digest",
    ));
    let mut other_agent = good.clone();
    other_agent["agent"] = json!("other");
    rejections.push((
        other_agent,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "agent",
    ));
    for (body, status, code, field) in rejections {
        let (got, error) = api
            .call(
                "POST",
                &format!("{base}/adoptions"),
                Some(&api.operator),
                Some(body.clone()),
            )
            .await;
        assert_eq!(
            (got, error_code(&error), error_field(&error)),
            (status, code, field),
            "{body} -> {error}"
        );
    }
    // A viewer cannot adopt.
    let (status, _) = api
        .call(
            "POST",
            &format!("{base}/adoptions"),
            Some(&api.viewer),
            Some(good.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        api.footprint().await,
        before,
        "no rejection changed anything"
    );

    // Admitted once: the ticket is queued again through the outbox, same attempt.
    let (status, receipt) = api
        .call(
            "POST",
            &format!("{base}/adoptions"),
            Some(&api.operator),
            Some(good.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{receipt}");
    assert_eq!(receipt["status"], "queued");
    assert_eq!(receipt["request_id"], id);
    assert_eq!(receipt["handoff_state"], "adopted");
    assert_eq!(
        receipt["reusable_build_checks"],
        json!([candidate["commands"][0]["command_digest"]])
    );
    let (state, attempt): (String, i32) =
        sqlx::query_as("SELECT state, attempt FROM execution_requests WHERE id = $1")
            .bind(request_id)
            .fetch_one(api.pool())
            .await
            .expect("request");
    assert_eq!((state.as_str(), attempt), ("queued", 1));
    let message: Value = sqlx::query_scalar(
        "SELECT payload FROM outbox WHERE routing_key = 'verifications' ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(api.pool())
    .await
    .expect("outbox");
    assert_eq!(message["kind"], "verification");
    assert_eq!(
        message["action_id"],
        json!(Uuid::parse_str(id).expect("id"))
    );

    // The same id and input: the same receipt, nothing more admitted.
    let after = api.footprint().await;
    let (status, again) = api
        .call(
            "POST",
            &format!("{base}/adoptions"),
            Some(&api.operator),
            Some(good.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(again, receipt);
    assert_eq!(api.footprint().await, after);
    // The same id with other input: 409, and nothing changes.
    let other = adoption_body(&candidate, id, &[]);
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/adoptions"),
            Some(&api.operator),
            Some(other),
        )
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "request_id_conflict")
    );
    assert_eq!(api.footprint().await, after);
    // A new id finds no pending handoff any more.
    let fresh = adoption_body(&candidate, "fedcba9876543210fedcba9876543210", &[]);
    let (status, error) = api
        .call(
            "POST",
            &format!("{base}/adoptions"),
            Some(&api.operator),
            Some(fresh),
        )
        .await;
    assert_eq!(
        (status, error_code(&error)),
        (StatusCode::CONFLICT, "no_pending_handoff")
    );
    assert_eq!(api.footprint().await, after);

    let (status, read) = api
        .call(
            "GET",
            &format!("{base}/adoptions/{id}"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!((status, read), (StatusCode::OK, receipt));
    let (status, _) = api
        .call(
            "GET",
            &format!("{base}/adoptions/fedcba9876543210fedcba9876543210"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, error) = api
        .call(
            "GET",
            &format!("{base}/adoptions/nope"),
            Some(&api.viewer),
            None,
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::BAD_REQUEST, "request_id")
    );
}
