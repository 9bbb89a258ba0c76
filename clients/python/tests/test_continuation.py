"""Seed 003 through the client, against a live scheduler and real workers: a worker
answers and dies before it accepts its own final report; the operator reviews the saved
result and accepts it once, under an action id of their own; the report asks for
verification; an adoption approves the check; the run completes. And a request whose
answer is lost on the way back: `OutcomeUnknown`, then the status shows the one saved
action."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from harness import DroppingProxy, Stack, verified_run

import cairn
from cairn import errors, models

AGENT = "py-journey"
LONG = 90.0


@dataclass
class Reconciled:
    """A run whose worker died after writing its final report: the run waits in
    `needs_reconciliation` with a READY final-outcome candidate."""

    run_id: str
    request_id: str


def acceptance(candidate: models.Candidate, valid_for_seconds: int = 60) -> dict[str, Any]:
    """The strict body that accepts `candidate` (the seed's FinalOutcomeContinuationInputV1)."""
    return {
        "version": 1,
        "candidate_digest": candidate.candidate_digest,
        "valid_for_seconds": valid_for_seconds,
        "acknowledge_already_consumed_final_output": True,
        "acknowledge_no_completed_effect_replay": True,
        "acknowledge_same_request_attempt_and_budgets": True,
        "acknowledge_finite_ownership_lease": True,
    }


def reconcile(stack: Stack, client: cairn.Client, worker: str) -> Reconciled:
    """Submits a verified run with only a worker armed to die before completion."""
    run = client.submit_run(verified_run(AGENT))
    faulty = stack.start_worker(worker, faults="before_completion")
    waited = client.wait(run.run_id, timeout=LONG)
    assert waited.state == "needs_reconciliation", stack.logs()
    assert waited.stop_reason == "final_report_unaccepted", waited
    assert faulty.wait_exit(LONG) is not None, "the faulty worker killed itself"
    return Reconciled(run.run_id, run.request_id)


@pytest.fixture(scope="module")
def runs(journey_stack: Stack) -> Iterator[tuple[Reconciled, Reconciled]]:
    """Two reconciled runs, one after the other (each faulty worker dies on the first
    run it finishes), with final-outcome continuations allowed."""
    with cairn.Client(journey_stack.url, journey_stack.admin) as client:
        policy = client.set_continuation_policy({"enabled": True, "allow_final_outcome_continuation": True})
        assert policy.enabled and policy.allow_final_outcome_continuation
        yield reconcile(journey_stack, client, "faulty-1"), reconcile(journey_stack, client, "faulty-2")


def test_a_lost_answer_is_an_unknown_outcome_and_the_status_shows_the_one_saved_action(
    journey_stack: Stack, runs: tuple[Reconciled, Reconciled]
) -> None:
    run = runs[1]
    with cairn.Client(journey_stack.url, journey_stack.admin) as direct:
        candidate = direct.final_outcome_continuation_candidate(run.run_id, run.request_id)
        assert candidate.admission == "READY", candidate
        before = direct.final_outcome_continuation_status(run.run_id, run.request_id)
        assert (before.status, before.action_id) == ("not_recovered", None)

        # The caller saves its action id and exact body, then sends once, through a
        # proxy that lets the scheduler answer and drops the answer.
        action_id = secrets.token_hex(16)
        body = acceptance(candidate)
        proxy = DroppingProxy(journey_stack.port)
        try:
            with cairn.Client(proxy.url, journey_stack.admin) as lossy:
                with pytest.raises(cairn.OutcomeUnknown) as lost:
                    lossy.request_final_outcome_continuation(run.run_id, run.request_id, action_id, body)
        finally:
            proxy.close()
        error = lost.value
        assert (error.action_id, error.body, error.method) == (action_id, body, "POST")
        assert error.path.endswith(f"/actions/{action_id}")
        assert "final_outcome_continuation_status" in str(error)
        assert len(proxy.answers) == 1 and proxy.answers[0].startswith(b"HTTP/1.1 201"), proxy.answers

        # The status, read directly, shows exactly the one saved action.
        status = direct.final_outcome_continuation_status(run.run_id, run.request_id)
        assert status.action_id == action_id
        assert status.kind == "final_outcome_continuation_status"
        assert status.status in ("queued", "executing", "completed"), status
        requests = direct.execution_requests(run.run_id)
        assert [r.request_id for r in requests.execution_requests] == [run.request_id]
        # Sending the same action again, with the same id and body, reads that receipt.
        repeat = direct.request_final_outcome_continuation(run.run_id, run.request_id, action_id, body)
        assert (repeat.action_id, repeat.input_digest) == (action_id, status.input_digest)


def test_the_journey_from_a_lost_lease_to_a_completed_run(
    journey_stack: Stack, runs: tuple[Reconciled, Reconciled]
) -> None:
    run = runs[0]
    with cairn.Client(journey_stack.url, journey_stack.admin) as client:
        # 1. Review the saved result.
        candidate = client.final_outcome_continuation_candidate(run.run_id, run.request_id)
        assert candidate.kind == "final_outcome_continuation_candidate"
        assert candidate.admission == "READY", candidate
        assert candidate.retained_outcome is not None
        assert candidate.retained_outcome.outcome == "complete"
        assert candidate.retained_outcome.followup_kind == "verification"
        assert candidate.admission_window_purpose == "claim_only"

        # 2. Accept it once, under the caller's own action id, with the typed model.
        action_id = secrets.token_hex(16)
        body = models.FinalOutcomeContinuationInputV1(**acceptance(candidate))
        receipt = client.request_final_outcome_continuation(run.run_id, run.request_id, action_id, body)
        assert (receipt.action_id, receipt.run_id, receipt.request_id) == (action_id, run.run_id, run.request_id)
        assert receipt.candidate_digest == candidate.candidate_digest

        # The same id and body read the same receipt; the same id with another body is
        # refused, as is another id for the same request.
        repeat = client.request_final_outcome_continuation(run.run_id, run.request_id, action_id, acceptance(candidate))
        assert (repeat.action_id, repeat.input_digest, repeat.created_at) == (
            action_id,
            receipt.input_digest,
            receipt.created_at,
        )
        with pytest.raises(errors.ActionIdConflict) as conflict:
            client.request_final_outcome_continuation(
                run.run_id, run.request_id, action_id, acceptance(candidate, valid_for_seconds=61)
            )
        assert conflict.value.status == 409 and conflict.value.message
        with pytest.raises(errors.CheckpointAlreadyAdmitted):
            client.request_final_outcome_continuation(
                run.run_id, run.request_id, secrets.token_hex(16), acceptance(candidate)
            )
        assert client.final_outcome_continuation_status(run.run_id, run.request_id).action_id == action_id

        # 3. A normal worker takes the saved decision: the report asks for verification.
        journey_stack.start_worker("w1")
        waited = client.wait(run.run_id, timeout=LONG)
        assert waited.state == "awaiting_verification", journey_stack.logs()
        status = client.final_outcome_continuation_status(run.run_id, run.request_id)
        assert (status.status, status.action_id) == ("completed", action_id)
        held = client.final_outcome_continuation_candidate(run.run_id, run.request_id)
        assert held.admission == "HELD"
        assert "already_consumed" in [h.reason for h in held.holds]

        # 4. Approve the frozen check, under the caller's own adoption id.
        handoff = client.verification_candidates(run.run_id, agent=AGENT)
        assert handoff.admission == "READY", handoff
        assert [c.arguments for c in handoff.commands] == [["sh", "-c", "test -f src.txt && echo ok"]]
        adoption_id = secrets.token_hex(16)
        adoption = {
            "request_id": adoption_id,
            "agent": AGENT,
            "pending_request_digest": handoff.pending_request_digest,
            "source_digest": handoff.source_digest,
            "commands_digest": handoff.commands_digest,
            "policy_digest": handoff.policy_digest,
            "provider_digest": handoff.provider_digest,
        }
        adopted = client.adopt_verification_handoff(run.run_id, adoption)
        assert (adopted.request_id, adopted.kind) == (adoption_id, "verification_adoption")

        # 5. The check passes and a fresh round finishes the run.
        done = client.wait(run.run_id, timeout=LONG)
        assert done.state == "completed", journey_stack.logs()
        assert done.attempt == 1
        verified = client.verification_adoption_status(run.run_id, adoption_id)
        assert (verified.status, verified.handoff_state) == ("completed", "passed"), verified
        assert [a.request_id for a in client.verification_adoptions(run.run_id).adoptions] == [adoption_id]
        journal = client.get_run_journal(run.run_id)
        kinds = [e.entry_kind for e in journal.entries]
        assert kinds.count("final_report_accepted") == 1, kinds
        assert "terminal_acceptance" in kinds, kinds


def test_the_async_client_reads_the_saved_action(journey_stack: Stack, runs: tuple[Reconciled, Reconciled]) -> None:
    run = runs[0]

    async def read() -> models.ActionView:
        async with cairn.AsyncClient(journey_stack.url, journey_stack.admin) as client:
            candidate = await client.final_outcome_continuation_candidate(run.run_id, run.request_id)
            assert candidate.run_id == run.run_id
            return await client.final_outcome_continuation_status(run.run_id, run.request_id)

    status = asyncio.run(read())
    assert status.action_id is not None and status.run_id == run.run_id
