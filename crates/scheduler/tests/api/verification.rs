//! Verification handoffs: candidates and adoptions.

use axum::http::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use super::harness::*;

/// The digests a candidate names and an adoption must repeat.
const DIGESTS: [&str; 5] = [
    "pending_request_digest",
    "source_digest",
    "commands_digest",
    "policy_digest",
    "provider_digest",
];

/// An adoption's request id, and one no adoption uses.
const ID: &str = "0123456789abcdef0123456789abcdef";
const UNUSED_ID: &str = "fedcba9876543210fedcba9876543210";

/// The verification-handoff routes of one run.
struct Handoff {
    request_id: Uuid,
    base: String,
}

impl Handoff {
    async fn candidates(&self, api: &Api, query: &str) -> (StatusCode, Value) {
        api.get(&format!("{}/candidates{query}", self.base), &api.viewer)
            .await
    }

    async fn adopt(&self, api: &Api, token: &str, body: Value) -> (StatusCode, Value) {
        api.post(&format!("{}/adoptions", self.base), token, Some(body))
            .await
    }

    async fn adoption(&self, api: &Api, id: &str) -> (StatusCode, Value) {
        api.get(&format!("{}/adoptions/{id}", self.base), &api.viewer)
            .await
    }
}

/// Puts a submitted run where an accepted report asking for verification leaves it:
/// awaiting verification with a pending handoff of three frozen checks.
async fn awaiting_verification(api: &Api) -> Handoff {
    awaiting_verification_of(api, "coder").await
}

/// The same, for a run of `agent`.
async fn awaiting_verification_of(api: &Api, agent: &str) -> Handoff {
    let run_id = api.submit_for(&api.operator, agent).await;
    let (_, request_id) = api.request_of(&run_id).await;
    // Two steps ran under epoch 1; the last one's report asks for verification of three
    // checks, and its acceptance opened the handoff.
    let lease = first_lease(request_id);
    let mut conn = api.pool().acquire().await.expect("conn");
    journal_steps(&mut conn, &lease, &["build", "report"], &exited_zero(10, 1)).await;
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
    let base = format!("/api/v1/runs/{run_id}/verification-handoffs");
    Handoff { request_id, base }
}

/// A run awaiting verification and its handoff's candidate for the run's agent.
async fn offered() -> (Api, Handoff, Value) {
    let api = Api::new().await;
    let handoff = awaiting_verification(&api).await;
    let (status, candidate) = handoff.candidates(&api, "?agent=coder").await;
    assert_eq!(status, StatusCode::OK, "{candidate}");
    (api, handoff, candidate)
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
    let mut body = json!({
        "request_id": request_id,
        "agent": candidate["agent"],
        "reusable_build_checks": checks
    });
    for field in DIGESTS {
        body[field] = candidate[field].clone();
    }
    body
}

/// `body` with `change` made to a copy of it.
fn changed(body: &Value, change: impl FnOnce(&mut Value)) -> Value {
    let mut body = body.clone();
    change(&mut body);
    body
}

#[tokio::test]
async fn a_verification_candidate_is_offered_for_the_runs_agent_with_only_reusable_builds() {
    let api = Api::new().await;
    let handoff = awaiting_verification(&api).await;
    for (query, status) in [
        ("", StatusCode::BAD_REQUEST),
        ("?agent=other", StatusCode::UNPROCESSABLE_ENTITY),
    ] {
        let (got, error) = handoff.candidates(&api, query).await;
        assert_eq!((got, error_field(&error)), (status, "agent"), "{query}");
    }
    let (status, candidate) = handoff.candidates(&api, "?agent=coder").await;
    assert_eq!(status, StatusCode::OK, "{candidate}");
    assert_eq!(candidate["admission"], "READY");
    for field in DIGESTS {
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
}

#[tokio::test]
async fn every_bad_adoption_is_rejected_and_changes_nothing() {
    let (api, handoff, candidate) = offered().await;
    let good = adoption_body(&candidate, ID, &[1]);
    let before = api.footprint().await;
    let acknowledgement = "reusable_build_checks[0].independent_of_time_and_external_state";
    let first_digest = "reusable_build_checks[0].command_digest";
    let mut rejections = vec![
        // Shape: ids, digests, the acknowledgement, duplicates, unknown fields, coercion.
        (
            changed(&good, |b| b["request_id"] = json!(ID.to_uppercase())),
            StatusCode::BAD_REQUEST,
            "invalid_id",
            "request_id",
        ),
        (
            changed(&good, |b| b["policy_digest"] = json!("abc")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            "policy_digest",
        ),
        (
            changed(&good, |b| {
                b["reusable_build_checks"][0]["independent_of_time_and_external_state"] =
                    json!(false)
            }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "acknowledgement_required",
            acknowledgement,
        ),
        (
            changed(&good, |b| {
                b["reusable_build_checks"][0]["independent_of_time_and_external_state"] =
                    json!("true")
            }),
            StatusCode::BAD_REQUEST,
            "invalid_body",
            acknowledgement,
        ),
        (
            changed(&good, |b| {
                b["reusable_build_checks"][0]["purpose"] = json!("test")
            }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            "reusable_build_checks[0].purpose",
        ),
        (
            adoption_body(&candidate, ID, &[1, 1]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "duplicate_selection",
            "reusable_build_checks[1].command_digest",
        ),
        (
            changed(&good, |b| b["reuse_everything"] = json!(true)),
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "reuse_everything",
        ),
        // Against the candidate: unknown and never-reusable checks, another agent.
        (
            changed(&good, |b| {
                b["reusable_build_checks"][0]["command_digest"] = json!("c".repeat(64))
            }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_command_digest",
            first_digest,
        ),
        (
            adoption_body(&candidate, ID, &[3]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "not_reusable",
            first_digest,
        ),
        (
            changed(&good, |b| b["agent"] = json!("other")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            "agent",
        ),
    ];
    // Changed digests: the candidate is stale.
    for field in DIGESTS {
        rejections.push((
            changed(&good, |b| b[field] = json!("b".repeat(64))),
            StatusCode::CONFLICT,
            "stale_candidate",
            field,
        ));
    }
    for (body, status, code, field) in rejections {
        let (got, error) = handoff.adopt(&api, &api.operator, body.clone()).await;
        assert_eq!(
            (got, error_code(&error), error_field(&error)),
            (status, code, field),
            "{body} -> {error}"
        );
    }
    // A viewer cannot adopt.
    let (status, _) = handoff.adopt(&api, &api.viewer, good).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        api.footprint().await,
        before,
        "no rejection changed anything"
    );
}

#[tokio::test]
async fn a_verification_handoff_is_adopted_once_and_read_back() {
    let (api, handoff, candidate) = offered().await;
    let good = adoption_body(&candidate, ID, &[1]);

    // Admitted once: the ticket is queued again through the outbox, same attempt.
    let (status, receipt) = handoff.adopt(&api, &api.operator, good.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{receipt}");
    assert_eq!(receipt["status"], "queued");
    assert_eq!(receipt["request_id"], ID);
    assert_eq!(receipt["handoff_state"], "adopted");
    assert_eq!(
        receipt["reusable_build_checks"],
        json!([candidate["commands"][0]["command_digest"]])
    );
    let (state, attempt): (String, i32) =
        sqlx::query_as("SELECT state, attempt FROM execution_requests WHERE id = $1")
            .bind(handoff.request_id)
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
        json!(Uuid::parse_str(ID).expect("id"))
    );

    // The same id and input: the same receipt, nothing more admitted.
    let after = api.footprint().await;
    let (status, again) = handoff.adopt(&api, &api.operator, good).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(again, receipt);
    assert_eq!(api.footprint().await, after);
    // The same id with other input (409), or a new id, which finds no pending handoff
    // any more: nothing changes.
    for (id, code) in [
        (ID, "request_id_conflict"),
        (UNUSED_ID, "no_pending_handoff"),
    ] {
        let other = adoption_body(&candidate, id, &[]);
        let (status, error) = handoff.adopt(&api, &api.operator, other).await;
        assert_eq!(
            (status, error_code(&error)),
            (StatusCode::CONFLICT, code),
            "{id}"
        );
        assert_eq!(api.footprint().await, after);
    }

    let (status, read) = handoff.adoption(&api, ID).await;
    assert_eq!((status, read), (StatusCode::OK, receipt));
    let (status, _) = handoff.adoption(&api, UNUSED_ID).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, error) = handoff.adoption(&api, "nope").await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::BAD_REQUEST, "request_id")
    );
}

/// Approval needs execute access (operator); under the Codex CLI and Claude Code CLI
/// providers, administrator access. A refusal changes nothing.
#[tokio::test]
async fn approving_under_the_codex_or_claude_provider_needs_an_administrator() {
    let api = Api::new().await;
    for agent in ["codex", "claude"] {
        let handoff = awaiting_verification_of(&api, agent).await;
        let (status, candidate) = handoff.candidates(&api, &format!("?agent={agent}")).await;
        assert_eq!(status, StatusCode::OK, "{candidate}");
        let id = Uuid::new_v4().simple().to_string();
        let body = adoption_body(&candidate, &id, &[]);
        let (status, refused) = handoff.adopt(&api, &api.operator, body.clone()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{agent}: {refused}");
        assert!(
            error_message(&refused)
                .contains(&format!("under the {agent} provider needs the admin role")),
            "{refused}"
        );
        let (status, _) = handoff.adoption(&api, &id).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "nothing was saved");
        let (status, adopted) = handoff.adopt(&api, &api.admin, body).await;
        assert_eq!(status, StatusCode::CREATED, "{agent}: {adopted}");
    }
    // Other providers need execute access only.
    let handoff = awaiting_verification_of(&api, "bridge").await;
    let (_, candidate) = handoff.candidates(&api, "?agent=bridge").await;
    let body = adoption_body(&candidate, &Uuid::new_v4().simple().to_string(), &[]);
    let (status, adopted) = handoff.adopt(&api, &api.operator, body).await;
    assert_eq!(status, StatusCode::CREATED, "{adopted}");
}
