//! Every error code the API answers, with what it means: the document lists them
//! (`x-error-codes`), so a client can name one class per code. A test reads the
//! handlers' sources and fails on a code not listed here, or listed and never used.

/// `(code, the usual status, what it means)`, in alphabetical order.
pub const ERROR_CODES: &[(&str, u16, &str)] = &[
    (
        "acknowledgement_required",
        422,
        "An acknowledgement the route requires was not `true`.",
    ),
    (
        "action_id_conflict",
        409,
        "The action id was used earlier with another body: keep that action and read its status.",
    ),
    (
        "bad_answer",
        502,
        "The worker holding the sandbox answered with something unreadable.",
    ),
    (
        "body_unreadable",
        413,
        "The body could not be read, or is larger than the route allows.",
    ),
    (
        "budget_exhausted",
        409,
        "The request's attempts or budgets are spent; nothing is charged again.",
    ),
    (
        "candidate_digest_mismatch",
        409,
        "The body names a candidate other than the current one: read the candidate again.",
    ),
    (
        "candidate_held",
        409,
        "The candidate is held; its holds say why (`holds[].reason`).",
    ),
    (
        "checkpoint_already_admitted",
        409,
        "Another action was already saved for this checkpoint, or for this request's retained final result: read the status.",
    ),
    (
        "decision_id_conflict",
        409,
        "The decision id was used earlier for another decision: read that decision back, or use a new id.",
    ),
    (
        "delivery_held",
        409,
        "A delivery hold stands on the run: publication waits for its release.",
    ),
    (
        "disk_shrink",
        409,
        "A sandbox's disk can grow on resume, never shrink.",
    ),
    (
        "duplicate_selection",
        422,
        "The same check is selected twice.",
    ),
    (
        "file_error",
        404,
        "The sandbox file could not be read or written (missing, a directory, outside the root).",
    ),
    (
        "file_too_large",
        413,
        "The sandbox file is larger than the route moves in one body.",
    ),
    (
        "forbidden",
        403,
        "The token's role or tenant does not allow this.",
    ),
    (
        "idempotency_key_conflict",
        409,
        "The Idempotency-Key was used earlier with another body.",
    ),
    (
        "internal",
        500,
        "A fault inside the scheduler; nothing is known to have changed.",
    ),
    (
        "interrupted",
        409,
        "The sandbox operation was interrupted (its sandbox stopped or its worker was lost).",
    ),
    (
        "invalid_agent",
        400,
        "The agent name is not 1 to 128 of `A-Za-z0-9._-`.",
    ),
    (
        "invalid_body",
        400,
        "The body does not match the route's schema; `field` names the offending part.",
    ),
    (
        "invalid_id",
        400,
        "An id is not 32 lowercase hexadecimal characters.",
    ),
    (
        "invalid_idempotency_key",
        400,
        "The Idempotency-Key header is empty, too long or not printable ASCII.",
    ),
    ("invalid_limit", 400, "`limit` is out of its range."),
    ("invalid_port", 400, "A preview's port is not a number from 1 to 65535."),
    (
        "invalid_profile_digest",
        400,
        "A source profile digest is not 64 lowercase hexadecimal characters.",
    ),
    (
        "invalid_query",
        400,
        "A query parameter is unknown or malformed.",
    ),
    (
        "invalid_state",
        409,
        "The resource is not in a state that allows this (400 when a filter names no state).",
    ),
    (
        "invalid_status",
        409,
        "The adoption is not in a status that allows this.",
    ),
    (
        "invalid_step_key",
        400,
        "The step key is not 1 to 64 of `A-Za-z0-9._-`.",
    ),
    ("invalid_wait", 400, "`wait` is out of its range."),
    (
        "malformed_json",
        400,
        "The body is not exactly one JSON value.",
    ),
    (
        "method_not_allowed",
        405,
        "The route exists, not with this method.",
    ),
    (
        "no_input",
        409,
        "The exec was started without `stdin` or `pty`, or its input was closed: it takes no input.",
    ),
    (
        "no_pending_handoff",
        409,
        "The run has no verification handoff waiting for an adoption.",
    ),
    ("no_such_route", 404, "No route has this path."),
    (
        "not_a_named_snapshot",
        409,
        "A template publishes a named snapshot only.",
    ),
    (
        "not_a_terminal",
        409,
        "The exec was started without `pty`: it has no terminal to resize.",
    ),
    (
        "not_awaiting_reconciliation",
        409,
        "The run does not need a person now: nothing was decided.",
    ),
    (
        "not_captured",
        409,
        "The run's workspace was not captured, so there is nothing to publish or restore.",
    ),
    (
        "not_found",
        404,
        "No such resource, or one in another tenant.",
    ),
    ("not_paused", 409, "The run is not paused."),
    ("not_persistent", 409, "The sandbox is not persistent."),
    (
        "not_reusable",
        422,
        "A check declared reusable is of a purpose that cannot be reused.",
    ),
    (
        "not_running",
        409,
        "The run is not running, so it cannot be paused; or the operation is not a running exec.",
    ),
    (
        "operation_unreachable",
        502,
        "The worker running the operation could not be reached.",
    ),
    ("output_reclaimed", 410, "Retention deleted the output."),
    (
        "output_unreachable",
        409,
        "The output's store is not reachable from the scheduler.",
    ),
    ("port_not_exposed", 404, "The port is not one of the sandbox's `ports` (set on create; a preview reaches no other)."),
    ("preview_unreachable", 502, "The sandbox is running and nothing answers on the port (or its worker takes no previews)."),
    (
        "request_id_conflict",
        409,
        "The request id was used earlier for another request.",
    ),
    ("run_finished", 409, "The run has finished."),
    ("sandbox_waking", 503, "The sandbox is still waking, or its port not yet answering, after the 10 s hold: retry after `Retry-After`."),
    (
        "snapshot_in_template",
        409,
        "A template version names the snapshot, so it is kept.",
    ),
    ("snapshot_not_ready", 409, "The snapshot is not ready yet."),
    (
        "snapshot_quarantined",
        409,
        "The snapshot is quarantined: it failed its check and cannot be restored.",
    ),
    (
        "stale_candidate",
        409,
        "The candidate changed, or its window passed, since it was read.",
    ),
    (
        "state_changed",
        409,
        "The resource changed state meanwhile; nothing was changed.",
    ),
    (
        "step_not_undecided",
        409,
        "The step has no outcome left to decide (decided already, or never uncertain); the message lists the undecided steps.",
    ),
    (
        "store_unavailable",
        503,
        "The artifact store did not answer; nothing was changed, try again.",
    ),
    ("tenant_exists", 409, "The tenant exists already."),
    (
        "too_many_matches",
        409,
        "More runs match a bulk action's filter than one action takes (1000): narrow the filter.",
    ),
    ("unauthorized", 401, "A valid bearer token is required."),
    (
        "unavailable",
        503,
        "The database did not answer; nothing was changed, try again.",
    ),
    (
        "under_continuation",
        409,
        "The run's uncertain step ran under a reviewed continuation: a decision would not keep its window.",
    ),
    (
        "unknown_command_digest",
        422,
        "A check's digest is not one of the candidate's.",
    ),
    (
        "unsupported_media_type",
        415,
        "The body is not `application/json`.",
    ),
    (
        "validation_failed",
        422,
        "The body is well formed but a value breaks a rule; `field` names it.",
    ),
    (
        "volume_attached",
        409,
        "The volume is attached to another sandbox: it is attached to one at a time; destroy that sandbox first.",
    ),
    (
        "volume_exists",
        409,
        "The tenant has a volume of that name already.",
    ),
    (
        "volume_unavailable",
        409,
        "The volume is on the disk of a worker that is not running: its sandbox could not start until that worker is back.",
    ),
    (
        "volumes_apart",
        409,
        "The volumes named are on different workers' disks: a sandbox attaches volumes of one worker.",
    ),
];

#[cfg(test)]
mod tests {
    use super::ERROR_CODES;
    use std::collections::BTreeSet;
    use std::path::Path;

    /// The code literals passed to `ApiError`'s constructors in `dir`'s sources.
    fn codes_in(dir: &Path, found: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                codes_in(&path, found);
                continue;
            }
            // This file names the constructors itself, in its test.
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("error_codes.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for call in [
                "ApiError::new(",
                "ApiError::conflict(",
                "ApiError::bad_request(",
                "Self::new(",
                "Self::bad_request(",
            ] {
                for (at, _) in text.match_indices(call) {
                    let rest = &text[at + call.len()..];
                    // The code is the first literal, after an optional status argument.
                    let rest = rest.trim_start();
                    let rest = match rest.find(',') {
                        Some(comma) if rest[..comma].contains("StatusCode::") => {
                            rest[comma + 1..].trim_start()
                        }
                        _ => rest,
                    };
                    if let Some(literal) = rest.strip_prefix('"') {
                        let code = literal.split('"').next().unwrap_or_default();
                        if !code.is_empty()
                            && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                        {
                            found.insert(code.to_string());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_code_the_handlers_answer_is_listed_and_every_listed_code_is_answered() {
        let mut used = BTreeSet::new();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        codes_in(&root.join("src"), &mut used);
        codes_in(&root.join("../common/src"), &mut used);
        let listed: BTreeSet<String> = ERROR_CODES.iter().map(|(c, _, _)| c.to_string()).collect();
        let unlisted: Vec<_> = used.difference(&listed).collect();
        let unused: Vec<_> = listed.difference(&used).collect();
        assert!(
            unlisted.is_empty(),
            "answered, not listed in ERROR_CODES: {unlisted:?}"
        );
        assert!(
            unused.is_empty(),
            "listed in ERROR_CODES, never answered: {unused:?}"
        );
        let mut sorted: Vec<_> = ERROR_CODES.iter().map(|(c, _, _)| *c).collect();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            ERROR_CODES.iter().map(|(c, _, _)| *c).collect::<Vec<_>>(),
            "alphabetical"
        );
    }
}
