"""The seed's discipline, enforced by the client before any transport: strict bodies,
acknowledgements that are `true` and nothing else, caller-owned action ids, one send of
a write. Every refused call is made against a socket that records connections, and
nothing may reach it."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from harness import Recorder

import cairn
from cairn import models

RUN = "0123456789abcdef0123456789abcdef"
REQUEST = "fedcba9876543210fedcba9876543210"
ACTION = "00000000000000000000000000000064"
DIGEST = "3f1c0b6a9d2e4f5a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a"


def final_outcome_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "version": 1,
        "candidate_digest": DIGEST,
        "valid_for_seconds": 60,
        "acknowledge_already_consumed_final_output": True,
        "acknowledge_no_completed_effect_replay": True,
        "acknowledge_same_request_attempt_and_budgets": True,
        "acknowledge_finite_ownership_lease": True,
    }
    body.update(changes)
    return body


def without(key: str) -> dict[str, Any]:
    body = final_outcome_body()
    del body[key]
    return body


ACK = "acknowledge_already_consumed_final_output"

# Bodies of a final-outcome continuation action that must be refused before transport.
BAD_BODIES: dict[str, Any] = {
    "an extra field": final_outcome_body(note="reviewed"),
    "acknowledgement 1": final_outcome_body(**{ACK: 1}),
    'acknowledgement "true"': final_outcome_body(**{ACK: "true"}),
    'acknowledgement "yes"': final_outcome_body(**{ACK: "yes"}),
    "acknowledgement 0": final_outcome_body(**{ACK: 0}),
    "acknowledgement False": final_outcome_body(**{ACK: False}),
    "acknowledgement None": final_outcome_body(**{ACK: None}),
    "acknowledgement 1.0": final_outcome_body(**{ACK: 1.0}),
    "a missing acknowledgement": without(ACK),
    "a missing digest": without("candidate_digest"),
    "version 2": final_outcome_body(version=2),
    'version "1"': final_outcome_body(version="1"),
    "version True": final_outcome_body(version=True),
    "version 1.0": final_outcome_body(version=1.0),
    "a window of 0": final_outcome_body(valid_for_seconds=0),
    "a window of 7201": final_outcome_body(valid_for_seconds=7201),
    'a window of "60"': final_outcome_body(valid_for_seconds="60"),
    "a window of 60.0": final_outcome_body(valid_for_seconds=60.0),
    "an uppercase digest": final_outcome_body(candidate_digest=DIGEST.upper()),
    "a checkpoint body": models.CheckpointContinuationInputV1(
        version=1,
        candidate_digest=DIGEST,
        valid_for_seconds=60,
        acknowledge_retained_response_consumed_once=True,
        acknowledge_no_completed_effect_replay=True,
        acknowledge_same_request_attempt_and_budgets=True,
        acknowledge_finite_ownership_lease=True,
    ),
    "a typed model acknowledging False": models.FinalOutcomeContinuationInputV1(**final_outcome_body(**{ACK: False})),
    # A model built without validation still carries what it was given.
    "a typed model holding 1": models.FinalOutcomeContinuationInputV1.model_construct(**final_outcome_body(**{ACK: 1})),
    "a list": [final_outcome_body()],
    "JSON text": '{"version": 1}',
    "bytes": b"{}",
    "None": None,
    "a number": 1,
}

BAD_ACTION_IDS: dict[str, Any] = {
    "uppercase": ACTION.upper().replace("0", "A"),
    "31 characters": ACTION[:31],
    "33 characters": ACTION + "0",
    "a hyphenated uuid": str(uuid.UUID(ACTION)),
    "braced": "{" + ACTION[:30] + "}",
    "a trailing newline": ACTION + "\n",
    "not hex": "g" * 32,
    "an int": int(ACTION, 16),
    "empty": "",
    "None": None,
}


@pytest.mark.parametrize("case", BAD_BODIES)
def test_a_coerced_or_malformed_body_is_refused_before_transport(recorder: Recorder, case: str) -> None:
    with cairn.Client(recorder.url, "token") as client:
        with pytest.raises(cairn.InvalidInput) as refused:
            client.request_final_outcome_continuation(RUN, REQUEST, ACTION, BAD_BODIES[case])
    assert "nothing was sent" in str(refused.value) or "body" in str(refused.value)
    assert recorder.connections == 0, f"{case}: the client connected"


@pytest.mark.parametrize("case", BAD_ACTION_IDS)
def test_an_action_id_that_is_not_32_lowercase_hex_is_refused_before_transport(recorder: Recorder, case: str) -> None:
    with cairn.Client(recorder.url, "token") as client:
        with pytest.raises(cairn.InvalidInput) as refused:
            client.request_final_outcome_continuation(RUN, REQUEST, BAD_ACTION_IDS[case], final_outcome_body())
    assert refused.value.field == "action_id"
    assert recorder.connections == 0, f"{case}: the client connected"


def test_other_writes_refuse_coercion_before_transport(recorder: Recorder) -> None:
    adoption = {
        "request_id": ACTION,
        "agent": "py",
        "pending_request_digest": "p",
        "source_digest": "s",
        "commands_digest": "c",
        "policy_digest": "y",
        "provider_digest": "v",
        "reusable_build_checks": [
            {"command_digest": "d", "purpose": "source_build", "independent_of_time_and_external_state": "true"}
        ],
    }
    checkpoint = {
        "version": 1,
        "candidate_digest": DIGEST,
        "valid_for_seconds": 60,
        "acknowledge_retained_response_consumed_once": True,
        "acknowledge_no_completed_effect_replay": 1,
        "acknowledge_same_request_attempt_and_budgets": True,
        "acknowledge_finite_ownership_lease": True,
    }
    calls: dict[str, Callable[[cairn.Client], object]] = {
        "an adoption's reuse declared as a string": lambda c: c.adopt_verification_handoff(RUN, adoption),
        "an adoption without an id": lambda c: c.adopt_verification_handoff(
            RUN, {k: v for k, v in adoption.items() if k != "request_id"}
        ),
        "a checkpoint acknowledgement of 1": lambda c: c.request_checkpoint_continuation(
            RUN, REQUEST, ACTION, checkpoint
        ),
        "a publication acknowledging False": lambda c: c.request_publication(
            RUN, {"version": 1, "request_id": ACTION, "acknowledge_command_receipts_read": False}
        ),
        "a publication with a generated-looking id": lambda c: c.request_publication(
            RUN, {"version": 1, "request_id": str(uuid.uuid4()), "acknowledge_command_receipts_read": True}
        ),
        'a policy switch of "true"': lambda c: c.set_continuation_policy({"enabled": "true"}),
        "a policy switch of 1": lambda c: c.set_continuation_policy({"allow_final_outcome_continuation": 1}),
        "a run with an unknown field": lambda c: c.submit_run(
            {"agent": "py", "steps": [{"key": "a", "argv": ["true"]}], "urgency": 1}
        ),
        'a run with max_attempts "3"': lambda c: c.submit_run(
            {"agent": "py", "steps": [{"key": "a", "argv": ["true"]}], "max_attempts": "3"}
        ),
        "a run with a NUL in its argv": lambda c: c.submit_run(
            {"agent": "py", "steps": [{"key": "a", "argv": ["a\0"]}]}
        ),
        "a run whose env holds a number": lambda c: c.submit_run(
            {"agent": "py", "steps": [{"key": "a", "argv": ["true"], "env": {"N": 1}}]}
        ),
        "a run with a set of steps": lambda c: c.submit_run({"agent": "py", "steps": {"a"}}),
        "a bad Idempotency-Key": lambda c: c.submit_run(
            {"agent": "py", "steps": [{"key": "a", "argv": ["true"]}]}, idempotency_key=" padded "
        ),
        "a token without a role": lambda c: c.create_token({"name": "x"}),
        "a cancel of a malformed run id": lambda c: c.cancel_run(RUN.upper()),
        "a list filtered by a state that does not exist": lambda c: c.list_runs(state="done"),
        "a limit of 0": lambda c: c.list_runs(limit=0),
        "a limit of True": lambda c: c.list_runs(limit=True),
        "a read of a run id with a slash": lambda c: c.get_run("../" + RUN[3:]),
    }
    with cairn.Client(recorder.url, "token") as client:
        for case, call in calls.items():
            with pytest.raises(cairn.InvalidInput):
                call(client)
            assert recorder.connections == 0, f"{case}: the client connected"


def test_the_async_client_refuses_the_same_before_transport(recorder: Recorder) -> None:
    async def refuse() -> None:
        async with cairn.AsyncClient(recorder.url, "token") as client:
            for case in ("acknowledgement 1", 'acknowledgement "true"', "an extra field", "version 2"):
                with pytest.raises(cairn.InvalidInput):
                    await client.request_final_outcome_continuation(RUN, REQUEST, ACTION, BAD_BODIES[case])
            with pytest.raises(cairn.InvalidInput):
                await client.request_final_outcome_continuation(RUN, REQUEST, str(uuid.uuid4()), final_outcome_body())

    asyncio.run(refuse())
    assert recorder.connections == 0


def test_a_valid_write_is_sent_once_and_a_lost_answer_is_an_unknown_outcome(recorder: Recorder) -> None:
    """The control of the tests above: a valid body does reach the socket, exactly once
    (no retry of a POST), and the connection closed without an answer leaves its
    outcome unknown, with the identity and body to read the status by."""
    body = final_outcome_body()
    with cairn.Client(recorder.url, "token", read_retries=3) as client:
        with pytest.raises(cairn.OutcomeUnknown) as lost:
            client.request_final_outcome_continuation(RUN, REQUEST, ACTION, body)
    error = lost.value
    assert recorder.connections == 1, "a POST is never sent twice"
    assert (error.action_id, error.method, error.body) == (ACTION, "POST", body)
    assert error.path == f"/api/v1/runs/{RUN}/final-outcome-continuations/requests/{REQUEST}/actions/{ACTION}"
    assert error.content is not None and recorder.received[0].endswith(error.content)
    assert "final_outcome_continuation_status" in str(error) and "never resubmit" in str(error)
    assert isinstance(error, cairn.CairnError)


def test_a_model_body_is_sent_as_the_caller_set_it(recorder: Recorder) -> None:
    typed = models.FinalOutcomeContinuationInputV1(**final_outcome_body())
    with cairn.Client(recorder.url, "token") as client:
        with pytest.raises(cairn.OutcomeUnknown) as lost:
            client.request_final_outcome_continuation(RUN, REQUEST, ACTION, typed)
    assert lost.value.body == final_outcome_body()


def test_a_timeout_after_sending_is_an_unknown_outcome() -> None:
    silent = Recorder(hold=5)
    try:
        with cairn.Client(silent.url, "token", timeout=0.5) as client:
            with pytest.raises(cairn.OutcomeUnknown) as lost:
                client.request_publication(
                    RUN, {"version": 1, "request_id": ACTION, "acknowledge_command_receipts_read": True}
                )
        assert silent.connections == 1
        assert lost.value.action_id == ACTION, "the body's caller-owned request id"
        assert "publication_status" in str(lost.value)
    finally:
        silent.close()


def test_a_refused_connection_is_a_plain_transport_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port: the POST was never sent.
    with cairn.Client(f"http://127.0.0.1:{port}", "token") as client:
        with pytest.raises(cairn.TransportError) as refused:
            client.request_final_outcome_continuation(RUN, REQUEST, ACTION, final_outcome_body())
    assert not isinstance(refused.value, cairn.OutcomeUnknown)
    assert "nothing was sent" in str(refused.value)


def test_a_read_is_retried_a_bounded_number_of_times(recorder: Recorder) -> None:
    with cairn.Client(recorder.url, "token", read_retries=2, retry_backoff=0.01) as client:
        with pytest.raises(cairn.TransportError):
            client.get_run(RUN)
    assert recorder.connections == 3, "one try and two retries"


def test_a_503_is_read_again_but_a_write_answered_503_is_not_sent_again() -> None:
    error = b'{"error": {"code": "unavailable", "message": "the database is busy: try again", "field": null}}'
    head = f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(error)}\r\n"
    busy = Recorder(answer=head.encode() + b"Connection: close\r\n\r\n" + error)
    try:
        with cairn.Client(busy.url, "token", read_retries=2, retry_backoff=0.01) as client:
            with pytest.raises(cairn.errors.Unavailable) as read:
                client.get_run(RUN)
            assert busy.connections == 3, "one try and two retries"
            assert (read.value.status, read.value.message) == (503, "the database is busy: try again")
            with pytest.raises(cairn.errors.Unavailable):
                client.request_final_outcome_continuation(RUN, REQUEST, ACTION, final_outcome_body())
            assert busy.connections == 4, "a write is sent once"
    finally:
        busy.close()


def test_the_server_and_token_come_from_the_environment(recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_SERVER", recorder.url)
    monkeypatch.setenv("CAIRN_TOKEN", "from-the-environment")
    with cairn.Client(read_retries=0) as client:
        assert client.server == recorder.url
        with pytest.raises(cairn.TransportError):
            client.get_session()
    assert b"authorization: bearer from-the-environment" in recorder.received[0].lower()


def test_a_call_the_scheduler_holds_is_given_the_time_it_may_be_held() -> None:
    """An exec waits for its command (timeout_sec plus the scheduler's minute), a file
    operation for the minute: a client that gave up sooner would take a slow answer for
    a lost one (a false OutcomeUnknown)."""
    from cairn import _core

    settings = _core.Settings.make("http://127.0.0.1:1", "t", 30.0, 3, 0.25)
    sandbox = "a" * 32
    exec_call = _core.prepare("exec_in_sandbox", {"sandbox_id": sandbox}, {"argv": ["true"], "timeout_sec": 120})
    assert exec_call.timeout(settings).read == 30 + 120 + 60
    at_once = _core.prepare("exec_in_sandbox", {"sandbox_id": sandbox, "wait": False}, {"argv": ["true"]})
    assert at_once.timeout(settings).read == 30
    read = _core.prepare("read_sandbox_file", {"sandbox_id": sandbox, "path": "a.txt"})
    assert read.timeout(settings).read == 30 + 60
    assert _core.prepare("get_run", {"run_id": sandbox}).timeout(settings).read == 30
