use super::*;

fn evidence() -> Evidence {
    let body = json!({"outcome": "complete"});
    Evidence {
        acceptance_receipt: Some(7),
        accepted_digest: Some(report::digest("complete", Some("verification"), &body)),
        consumed: true,
        outcome: Some("complete".into()),
        followup_kind: Some("verification".into()),
        body: Some(body),
        completion_receipt: Some(9),
        verified_tree: Some("t".repeat(64)),
        result_ids: vec![Uuid::new_v4(), Uuid::new_v4()],
        passed_results: 2,
        authority_current: true,
        operator: Some(Uuid::new_v4()),
        current_tree: Some("t".repeat(64)),
        runtime_qualified: true,
    }
}

fn reasons(e: &Evidence, verified: Option<&str>, measured: Option<&str>) -> Vec<HoldReason> {
    holds(e, 2, verified, measured)
        .into_iter()
        .map(|h| h.reason)
        .collect()
}

const SOURCE: Option<&str> = Some("s");

#[test]
fn complete_evidence_on_the_verified_source_holds_nothing() {
    assert_eq!(reasons(&evidence(), SOURCE, SOURCE), []);
}

#[test]
fn a_changed_source_or_a_moved_tree_holds_it() {
    let e = evidence();
    assert_eq!(
        reasons(&e, SOURCE, Some("edited")),
        [HoldReason::ChangedSource]
    );
    let moved = Evidence {
        current_tree: Some("u".repeat(64)),
        ..evidence()
    };
    assert_eq!(reasons(&moved, SOURCE, SOURCE), [HoldReason::ChangedSource]);
}

#[test]
fn missing_evidence_holds_and_never_passes_for_unchanged() {
    assert_eq!(
        reasons(&evidence(), SOURCE, None),
        [HoldReason::MissingCustody]
    );
    assert_eq!(
        reasons(&evidence(), None, SOURCE),
        [HoldReason::MissingCustody]
    );
    let no_tree = Evidence {
        current_tree: None,
        ..evidence()
    };
    assert_eq!(
        reasons(&no_tree, SOURCE, SOURCE),
        [HoldReason::MissingCustody]
    );
    let no_receipt = Evidence {
        acceptance_receipt: None,
        ..evidence()
    };
    assert_eq!(
        reasons(&no_receipt, SOURCE, SOURCE),
        [HoldReason::MissingCustody]
    );
    let no_completion = Evidence {
        completion_receipt: None,
        ..evidence()
    };
    assert_eq!(
        reasons(&no_completion, SOURCE, SOURCE),
        [HoldReason::MissingCustody]
    );
}

#[test]
fn an_altered_report_holds_it() {
    let altered = Evidence {
        body: Some(json!({"outcome": "complete", "extra": true})),
        ..evidence()
    };
    assert_eq!(
        reasons(&altered, SOURCE, SOURCE),
        [HoldReason::MissingCustody]
    );
}

#[test]
fn a_check_without_a_passed_result_holds_it() {
    let failed = Evidence {
        passed_results: 1,
        ..evidence()
    };
    assert_eq!(reasons(&failed, SOURCE, SOURCE), [HoldReason::FailedChecks]);
    let missing = Evidence {
        result_ids: vec![Uuid::new_v4()],
        passed_results: 1,
        ..evidence()
    };
    assert_eq!(
        reasons(&missing, SOURCE, SOURCE),
        [HoldReason::FailedChecks]
    );
}

#[test]
fn a_revoked_operator_holds_it() {
    let revoked = Evidence {
        authority_current: false,
        ..evidence()
    };
    assert_eq!(
        reasons(&revoked, SOURCE, SOURCE),
        [HoldReason::RevokedAccess]
    );
}

#[test]
fn an_unqualified_runtime_holds_it() {
    let unqualified = Evidence {
        runtime_qualified: false,
        ..evidence()
    };
    assert_eq!(
        reasons(&unqualified, SOURCE, SOURCE),
        [HoldReason::IncompatibleQualification]
    );
}
