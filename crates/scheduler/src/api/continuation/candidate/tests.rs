//! The candidate's rules, one fact at a time.

use super::*;

fn policy(on: bool) -> Policy {
    Policy {
        enabled: on,
        allow_checkpoint_continuation: on,
        allow_final_outcome_continuation: on,
        maximum_window_seconds: 3600,
        revision: 7,
        updated_at: Utc::now(),
    }
}

const OPERATOR: Uuid = Uuid::from_u128(42);

/// A request stopped at its checkpoint, every rule satisfied.
fn stopped() -> Facts {
    Facts {
        run_id: Uuid::from_u128(1),
        request_id: Uuid::from_u128(2),
        state: "stopped_at_checkpoint".into(),
        attempt: 3,
        max_attempts: 3,
        lease_epoch: 9,
        live_owner: false,
        max_commands: 10,
        max_wall_seconds: 60,
        used_commands: 2,
        used_wall_ms: 1_000,
        used_cpu_ms: 10,
        checkpoint: Some(json!({"sequence": 1, "journal_digest": "j", "source_digest": "s"})),
        checkpoint_reclaimed: false,
        journal_source: Some("s".into()),
        source_digest: Some("s".into()),
        deadline: None,
        operator_id: Some(OPERATOR),
        operator_revoked: false,
        operator_role: Some("admin".into()),
        unknown_effects: vec![],
        journal_digest: "j".into(),
        report: None,
        qualification: Qualification {
            current: "p".repeat(64),
            current_qualified: true,
            retained: Some("p".repeat(64)),
            retained_qualified: true,
        },
    }
}

/// A request idle with a retained report awaiting acceptance.
fn awaiting_acceptance() -> Facts {
    Facts {
        state: "needs_reconciliation".into(),
        checkpoint: None,
        report: Some(Report {
            outcome: "complete".into(),
            followup_kind: None,
            body: json!({"outcome": "complete"}),
            consumed: false,
        }),
        ..stopped()
    }
}

fn reasons(candidate: &Candidate) -> Vec<HoldReason> {
    candidate.holds.iter().map(|h| h.reason).collect()
}

fn checkpoint(facts: Facts, on: bool) -> Candidate {
    evaluate(Kind::Checkpoint, facts, &policy(on), OPERATOR, Utc::now())
}

#[test]
fn a_stopped_request_with_everything_in_order_is_ready() {
    let candidate = checkpoint(stopped(), true);
    assert_eq!(candidate.admission, "READY", "{:?}", candidate.holds);
    assert_eq!(candidate.maximum_window_seconds, 3600);
    assert_eq!(candidate.kind, "checkpoint_continuation_candidate");
    assert_eq!(candidate.admission_window_purpose, None);
}

#[test]
fn each_general_rule_holds_a_checkpoint_candidate() {
    let now = Utc::now();
    let cases: Vec<(Facts, bool, HoldReason)> = vec![
        (stopped(), false, HoldReason::PolicyDisabled),
        (
            Facts {
                live_owner: true,
                ..stopped()
            },
            true,
            HoldReason::LiveOwner,
        ),
        (
            Facts {
                unknown_effects: vec!["build".into()],
                ..stopped()
            },
            true,
            HoldReason::UnknownEffect,
        ),
        (
            Facts {
                operator_revoked: true,
                ..stopped()
            },
            true,
            HoldReason::RevokedAccess,
        ),
        (
            Facts {
                used_commands: 10,
                ..stopped()
            },
            true,
            HoldReason::ExhaustedLimits,
        ),
        (
            Facts {
                used_wall_ms: 60_000,
                ..stopped()
            },
            true,
            HoldReason::ExhaustedLimits,
        ),
        (
            Facts {
                deadline: Some(now - chrono::Duration::seconds(1)),
                ..stopped()
            },
            true,
            HoldReason::ExhaustedLimits,
        ),
    ];
    assert_each_holds(cases);
}

#[test]
fn each_checkpoint_rule_holds_a_checkpoint_candidate() {
    let cases: Vec<(Facts, bool, HoldReason)> = vec![
        (
            Facts {
                state: "executing".into(),
                ..stopped()
            },
            true,
            HoldReason::NotRecoverable,
        ),
        (
            Facts {
                checkpoint: None,
                ..stopped()
            },
            true,
            HoldReason::MissingCustody,
        ),
        (
            Facts {
                journal_digest: "other".into(),
                ..stopped()
            },
            true,
            HoldReason::MissingCustody,
        ),
        (
            Facts {
                checkpoint_reclaimed: true,
                ..stopped()
            },
            true,
            HoldReason::CheckpointReclaimed,
        ),
        (
            Facts {
                source_digest: Some("changed".into()),
                ..stopped()
            },
            true,
            HoldReason::ChangedSource,
        ),
        // Missing evidence of the source holds: the checkpoint recorded no tree, or
        // the work context has none to continue from.
        (
            Facts {
                checkpoint: Some(
                    json!({"sequence": 1, "journal_digest": "j", "source_digest": null}),
                ),
                ..stopped()
            },
            true,
            HoldReason::MissingCustody,
        ),
        (
            Facts {
                source_digest: None,
                ..stopped()
            },
            true,
            HoldReason::MissingCustody,
        ),
    ];
    assert_each_holds(cases);
}

/// Each case's candidate is held, with its reason among the holds.
fn assert_each_holds(cases: Vec<(Facts, bool, HoldReason)>) {
    for (facts, on, reason) in cases {
        let candidate = checkpoint(facts, on);
        assert_eq!(candidate.admission, "HELD");
        assert!(
            reasons(&candidate).contains(&reason),
            "{reason:?}: {:?}",
            candidate.holds
        );
    }
}

#[test]
fn a_final_outcome_candidate_is_for_the_original_admin_and_an_unconsumed_report() {
    let final_outcome =
        |facts, caller| evaluate(Kind::FinalOutcome, facts, &policy(true), caller, Utc::now());
    let ready = final_outcome(awaiting_acceptance(), OPERATOR);
    assert_eq!(ready.admission, "READY", "{:?}", ready.holds);
    assert_eq!(
        ready.admission_window_purpose.as_deref(),
        Some("claim_only")
    );
    assert_eq!(
        ready.retained_outcome.as_ref().map(|r| r.outcome.as_str()),
        Some("complete")
    );
    for (facts, reason) in [
        (
            Facts {
                source_digest: Some("changed".into()),
                ..awaiting_acceptance()
            },
            HoldReason::ChangedSource,
        ),
        (
            Facts {
                journal_source: None,
                ..awaiting_acceptance()
            },
            HoldReason::MissingCustody,
        ),
        // Its tree's snapshot retired under a live head row: nothing else holds it.
        (
            Facts {
                source_digest: None,
                checkpoint_reclaimed: true,
                ..awaiting_acceptance()
            },
            HoldReason::MissingCustody,
        ),
    ] {
        assert_eq!(reasons(&final_outcome(facts, OPERATOR)), [reason]);
    }
    let someone_else = final_outcome(awaiting_acceptance(), Uuid::from_u128(7));
    assert_eq!(reasons(&someone_else), [HoldReason::RevokedAccess]);
    let viewer = final_outcome(
        Facts {
            operator_role: Some("viewer".into()),
            ..awaiting_acceptance()
        },
        OPERATOR,
    );
    assert_eq!(reasons(&viewer), [HoldReason::RevokedAccess]);
    let consumed = Facts {
        report: awaiting_acceptance().report.map(|r| Report {
            consumed: true,
            ..r
        }),
        ..awaiting_acceptance()
    };
    assert_eq!(
        reasons(&final_outcome(consumed, OPERATOR)),
        [HoldReason::AlreadyConsumed]
    );
    let missing = Facts {
        report: None,
        ..awaiting_acceptance()
    };
    assert_eq!(
        reasons(&final_outcome(missing, OPERATOR)),
        [HoldReason::MissingCustody]
    );
    let busy = Facts {
        state: "stopped_at_checkpoint".into(),
        ..awaiting_acceptance()
    };
    assert_eq!(
        reasons(&final_outcome(busy, OPERATOR)),
        [HoldReason::NotRecoverable]
    );
}

#[test]
fn the_digest_binds_every_fact_and_nothing_else() {
    let now = Utc::now();
    let digest = |facts: Facts, p: &Policy| {
        evaluate(Kind::Checkpoint, facts, p, OPERATOR, now).candidate_digest
    };
    let base = digest(stopped(), &policy(true));
    assert_eq!(
        base,
        digest(stopped(), &policy(true)),
        "the same facts, the same digest"
    );
    let changed = [
        Facts {
            attempt: 4,
            ..stopped()
        },
        Facts {
            lease_epoch: 10,
            ..stopped()
        },
        Facts {
            used_cpu_ms: 11,
            ..stopped()
        },
        Facts {
            journal_digest: "k".into(),
            ..stopped()
        },
        Facts {
            state: "failed".into(),
            ..stopped()
        },
        Facts {
            deadline: Some(now + chrono::Duration::hours(1)),
            ..stopped()
        },
    ];
    for facts in changed {
        assert_ne!(base, digest(facts, &policy(true)));
    }
    let revised = Policy {
        revision: 8,
        ..policy(true)
    };
    assert_ne!(
        base,
        digest(stopped(), &revised),
        "a policy change moves the digest"
    );
    let narrower = Policy {
        maximum_window_seconds: 60,
        ..policy(true)
    };
    assert_eq!(
        evaluate(Kind::Checkpoint, stopped(), &narrower, OPERATOR, now).maximum_window_seconds,
        60
    );
}

#[test]
fn an_unqualified_implementation_or_checkpoint_profile_holds_it() {
    let q = stopped().qualification;
    let unregistered = Facts {
        qualification: Qualification {
            current_qualified: false,
            ..q.clone()
        },
        ..stopped()
    };
    assert_eq!(
        reasons(&checkpoint(unregistered.clone(), true)),
        [HoldReason::IncompatibleQualification]
    );
    let report = evaluate(
        Kind::FinalOutcome,
        Facts {
            qualification: unregistered.qualification,
            ..awaiting_acceptance()
        },
        &policy(true),
        OPERATOR,
        Utc::now(),
    );
    assert_eq!(reasons(&report), [HoldReason::IncompatibleQualification]);

    // A checkpoint of another profile: held unless that one is qualified too.
    let older = Qualification {
        retained: Some("o".repeat(64)),
        retained_qualified: false,
        ..q.clone()
    };
    let held = Facts {
        qualification: older.clone(),
        ..stopped()
    };
    assert_eq!(
        reasons(&checkpoint(held, true)),
        [HoldReason::IncompatibleQualification]
    );
    let qualified = Facts {
        qualification: Qualification {
            retained_qualified: true,
            ..older
        },
        ..stopped()
    };
    assert_eq!(reasons(&checkpoint(qualified, true)), []);
    let unrecorded = Facts {
        qualification: Qualification {
            retained: None,
            ..q
        },
        ..stopped()
    };
    assert_eq!(
        reasons(&checkpoint(unrecorded, true)),
        [HoldReason::IncompatibleQualification]
    );
}
