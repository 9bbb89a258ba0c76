"""Runs through the client against a live scheduler and worker: submission with an
idempotency key, reads, paging, followed output, waiting, cancelling, and the errors the
API answers, each as its own exception class with the API's message."""

from __future__ import annotations

import asyncio
import secrets

import httpx
import pytest
from harness import Stack, run_of, shell

import cairn
from cairn import errors, models


def test_submit_read_and_list_runs(client: cairn.Client, stack: Stack) -> None:
    agent = f"list-{secrets.token_hex(4)}"
    ids = [client.submit_run(run_of(shell("say", f"echo {i}"), agent=agent)).run_id for i in range(3)]
    run = client.get_run(ids[0])
    assert isinstance(run, models.RunView)
    assert (run.run_id, run.agent) == (ids[0], agent)
    assert run.steps[0].argv == ["sh", "-c", "echo 0"]

    # Pages of one, followed by their cursor, list every run of the agent once.
    first = client.list_runs(agent=agent, limit=1)
    assert len(first.runs) == 1 and first.next_cursor
    listed = [r.run_id for r in client.iter_runs(agent=agent, page_size=1)]
    assert sorted(listed) == sorted(ids)
    for run_id in ids:
        assert client.wait(run_id, timeout=60).state == "completed", stack.logs()
    completed = [r.run_id for r in client.iter_runs(agent=agent, state="completed")]
    assert sorted(completed) == sorted(ids)
    assert client.count_runs(agent=agent).counts.get("completed") == 3


def test_an_idempotency_key_replays_its_run_and_refuses_other_input(client: cairn.Client) -> None:
    key = f"py-{secrets.token_hex(8)}"
    spec = run_of(shell("one", "true"))
    first = client.submit_run(spec, idempotency_key=key)
    again = client.submit_run(spec, idempotency_key=key)
    assert again.run_id == first.run_id
    with pytest.raises(errors.IdempotencyKeyConflict) as conflict:
        client.submit_run(run_of(shell("two", "true")), idempotency_key=key)
    assert conflict.value.status == 409 and conflict.value.code == "idempotency_key_conflict"


def test_logs_follow_a_steps_output_lines(client: cairn.Client, stack: Stack) -> None:
    run = client.submit_run(
        run_of(shell("say", "printf 'one\\ntwo\\n'; printf 'three\\n' >&2; printf 'tab\\there\\n'"))
    )
    assert client.wait(run.run_id, timeout=60).state == "completed", stack.logs()
    assert list(client.logs(run.run_id, "say")) == ["one", "two", "tab\there"]
    assert list(client.logs(run.run_id, "say", stream="stderr")) == ["three"]
    assert client.get_step_output(run.run_id, "say") == b"one\ntwo\ntab\there\n"
    assert client.get_step_output(run.run_id, "say", tail_bytes=9) == b"tab\there\n"
    chunks = list(client.follow_output(run.run_id, "say"))
    assert b"".join(cairn.unescape_output(c.text) for c in chunks) == b"one\ntwo\ntab\there\n"
    with pytest.raises(errors.NotFound):
        list(client.logs(run.run_id, "no-such-step"))
    with pytest.raises(cairn.InvalidInput):
        list(client.logs(run.run_id, "no such step!"))


def test_wait_times_out_on_a_run_that_cannot_finish_and_cancel_stops_it(client: cairn.Client, stack: Stack) -> None:
    run = client.submit_run(run_of(shell("sleep", "sleep 600", timeout_seconds=900)))
    with pytest.raises(cairn.WaitTimeout) as timed_out:
        client.wait(run.run_id, timeout=1.5, poll_interval=0.2)
    assert timed_out.value.run_id == run.run_id
    assert timed_out.value.state in ("queued", "running")
    assert run.run_id in str(timed_out.value) and "1.5 s" in str(timed_out.value)
    assert isinstance(timed_out.value, TimeoutError)
    cancelled = client.cancel_run(run.run_id)
    assert cancelled.run_id == run.run_id
    assert client.wait(run.run_id, timeout=60, states=["cancelled"]).state == "cancelled", stack.logs()


def test_an_unknown_run_is_not_found_with_the_apis_message(client: cairn.Client, stack: Stack) -> None:
    missing = secrets.token_hex(16)
    with pytest.raises(errors.NotFound) as not_found:
        client.get_run(missing)
    raw = httpx.get(f"{stack.url}/api/v1/runs/{missing}", headers={"Authorization": f"Bearer {stack.admin}"})
    answer = raw.json()["error"]
    assert (not_found.value.status, not_found.value.code) == (404, "not_found")
    assert not_found.value.message == answer["message"]
    assert isinstance(not_found.value, cairn.CairnError)
    with pytest.raises(errors.NotFound):
        client.cancel_run(missing)


def test_a_bad_token_is_unauthorized_and_a_viewer_is_forbidden_to_write(client: cairn.Client, stack: Stack) -> None:
    with cairn.Client(stack.url, "not-a-token") as stranger:
        with pytest.raises(errors.Unauthorized) as refused:
            stranger.get_session()
    assert refused.value.status == 401 and refused.value.message

    created = client.create_token({"name": f"viewer-{secrets.token_hex(4)}", "role": "viewer"})
    assert created.token and created.role == "viewer"
    with cairn.Client(stack.url, created.token) as viewer:
        assert viewer.get_session().role == "viewer"
        with pytest.raises(errors.Forbidden):
            viewer.submit_run(run_of(shell("a", "true")))
        with pytest.raises(errors.Forbidden):
            viewer.set_continuation_policy({"enabled": False})
    tokens = client.list_tokens()
    assert created.token_id in [t.token_id for t in tokens.tokens]
    revoked = client.revoke_token(created.token_id)
    assert revoked.token_id == created.token_id
    with cairn.Client(stack.url, created.token) as gone:
        with pytest.raises(errors.Unauthorized):
            gone.get_session()


def test_a_rule_only_the_server_knows_is_its_error(client: cairn.Client) -> None:
    """Valid by the document, refused by the server: the error class of its code."""
    spec = run_of(shell("a", "true"), shell("a", "true"))
    with pytest.raises(cairn.CairnError) as refused:
        client.submit_run(spec)
    assert refused.value.status in (400, 422) and refused.value.code
    assert type(refused.value) is errors.ERROR_CLASSES[refused.value.code]


def test_the_fleet_and_policy_reads(client: cairn.Client) -> None:
    session = client.get_session()
    assert session.role == "admin"
    workers = client.list_workers()
    assert [w for w in workers.workers if w.worker_id == "w1"]
    policy = client.get_continuation_policy()
    assert isinstance(policy.enabled, bool)
    assert client.get_qualification().current is not None


def test_the_async_client_submits_waits_reads_and_follows(stack: Stack) -> None:
    async def flow() -> None:
        async with cairn.AsyncClient(stack.url, stack.admin) as client:
            run = await client.submit_run(run_of(shell("say", "echo async")))
            done = await client.wait(run.run_id, timeout=60)
            assert done.state == "completed", stack.logs()
            assert (await client.get_run(run.run_id)).run_id == run.run_id
            assert [line async for line in client.logs(run.run_id, "say")] == ["async"]
            requests = await client.execution_requests(run.run_id)
            assert [r.kind for r in requests.execution_requests] == ["run"]
            journal = await client.get_run_journal(run.run_id)
            assert [(s.step_key, s.stdout_tail) for s in journal.steps] == [("say", "async\n")]
            listed = [r.run_id async for r in client.iter_runs(agent="py", page_size=2)]
            assert run.run_id in listed
            with pytest.raises(errors.NotFound):
                await client.get_run(secrets.token_hex(16))
            with pytest.raises(cairn.WaitTimeout):
                slow = await client.submit_run(run_of(shell("nap", "sleep 30")))
                try:
                    await client.wait(slow.run_id, timeout=0.5, poll_interval=0.1)
                finally:
                    await client.cancel_run(slow.run_id)

    asyncio.run(flow())


def test_the_run_feed_goes_on_from_its_last_event_and_the_overview_samples_the_fleet(
    client: cairn.Client, stack: Stack
) -> None:
    feed = client.run_events()
    first = next(feed)
    while first.kind != "ready":
        first = next(feed)
    run = client.submit_run(run_of(shell("nap", "sleep 1")))
    seen = next(change for change in feed if change.run is not None and change.run.run_id == run.run_id)
    assert seen.kind == "run" and seen.id and seen.run is not None
    assert seen.run.state in ("queued", "running"), seen
    assert client.wait(run.run_id, timeout=60).state == "completed", stack.logs()
    # From the last event had: the run as it is now, and nothing before that event.
    again = client.run_events(run_id=run.run_id, last_event_id=seen.id)
    states = []
    for change in again:
        if change.run is not None:
            states.append(change.run.state)
            break
    assert states == ["completed"], states
    with pytest.raises(cairn.InvalidInput):
        next(client.run_events(last_event_id="not a position"))

    overview = client.get_overview(minutes=5)
    assert isinstance(overview, models.OverviewView)
    assert overview.interval_seconds >= 1
