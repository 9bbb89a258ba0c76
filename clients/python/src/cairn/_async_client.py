"""The asynchronous client. `_sync_client.py` is generated from this file by
`scripts/python-models` (async and await taken out): edit this one.

Every method validates its call before any transport (`_core.prepare`): a body that
does not match its strict model, a coerced acknowledgement or a malformed id raises
`InvalidInput` and nothing is sent. A write (POST, PUT, DELETE) is sent once and never
retried; when its answer is lost it raises `OutcomeUnknown`. A read (GET) is tried
again, a bounded number of times, after a transport failure or a 503.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import Any, Self

import httpx
from httpx_sse import ServerSentEvent, aconnect_sse

from . import _core, models
from .errors import CairnError, TransportError, WaitTimeout

Body = Mapping[str, Any]


class AsyncClient:
    """An asynchronous client of Cairn's scheduler API.

    `server` and `token` default to `CAIRN_SERVER` and `CAIRN_TOKEN` (the names cairnctl
    reads), the server to http://127.0.0.1:8080. `timeout` bounds each call in seconds
    (plus the `wait_seconds` a call asks the server to wait); `read_retries` bounds how
    often a read is tried again after a transport failure or a 503, `retry_backoff` the
    first pause between tries (doubled each time, at most 2 s).
    """

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        read_retries: int = 3,
        retry_backoff: float = 0.25,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._settings = _core.Settings.make(server, token, timeout, read_retries, retry_backoff)
        self._http = httpx.AsyncClient(
            base_url=self._settings.server,
            headers=self._settings.headers(),
            transport=transport,
            # No redirects: a write answered by a redirect is not sent a second time.
            follow_redirects=False,
        )

    @property
    def server(self) -> str:
        return self._settings.server

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -----------------------------------------------------------------------------
    # Transport.

    def _headers(self, prepared: _core.Prepared) -> dict[str, str]:
        headers = dict(prepared.headers)
        body = prepared.operation.body
        if prepared.content is not None and body is not None:
            headers["Content-Type"] = body.media_type
        return headers

    async def _call(self, prepared: _core.Prepared) -> Any:
        """Sends `prepared` (a write once; a read with its bounded retries) and reads its
        answer."""
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    prepared.method,
                    prepared.path,
                    params=prepared.query,
                    headers=self._headers(prepared),
                    content=prepared.content,
                    timeout=prepared.timeout(self._settings),
                )
            except httpx.TransportError as error:
                failure = _core.transport_failure(prepared, error, self._settings.server)
                delay = _core.retry_delay(prepared, attempt, self._settings, failure, None)
                if delay is None:
                    raise failure from error
            else:
                status = response.status_code
                delay = _core.retry_delay(prepared, attempt, self._settings, None, status) if status == 503 else None
                if delay is None:
                    return _core.read_reply(prepared, status, response.headers.get("content-type"), response.content)
            attempt += 1
            await asyncio.sleep(delay)

    async def _op(
        self, operation_id: str, params: Mapping[str, object] | None = None, body: Any = _core._NO_BODY
    ) -> Any:
        return await self._call(_core.prepare(operation_id, params, body))

    # -----------------------------------------------------------------------------
    # Runs.

    async def submit_run(self, spec: models.RunSpec | Body, *, idempotency_key: str | None = None) -> models.RunView:
        """Submits a run. With an `idempotency_key`, a repeat of the same spec answers the
        original run; the same key with another spec is `IdempotencyKeyConflict`."""
        return await self._op("submit_run", {"Idempotency-Key": idempotency_key}, spec)

    async def submit_runs(
        self, batch: models.BatchRequest | Body, *, idempotency_key: str | None = None
    ) -> models.BatchResponse:
        """Submits up to 1,000 runs at once (`{"runs": [...]}`)."""
        return await self._op("submit_runs", {"Idempotency-Key": idempotency_key}, batch)

    async def get_run(self, run_id: str) -> models.RunView:
        return await self._op("get_run", {"run_id": run_id})

    async def list_runs(
        self,
        *,
        state: str | None = None,
        agent: str | None = None,
        label: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> models.RunPage:
        """One page of runs, newest first; pass `next_cursor` as `cursor` for the next.
        `label` is `key=value[,key=value…]`: all must match."""
        params = {"state": state, "agent": agent, "label": label, "limit": limit, "cursor": cursor}
        return await self._op("list_runs", params)

    async def iter_runs(
        self, *, state: str | None = None, agent: str | None = None, page_size: int | None = None
    ) -> AsyncIterator[models.RunView]:
        """Every run that matches, page after page."""
        cursor: str | None = None
        while True:
            page = await self.list_runs(state=state, agent=agent, limit=page_size, cursor=cursor)
            for run in page.runs:
                yield run
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def count_runs(self, *, agent: str | None = None) -> models.RunCounts:
        return await self._op("count_runs", {"agent": agent})

    async def cancel_run(self, run_id: str) -> models.RunView:
        return await self._op("cancel_run", {"run_id": run_id})

    async def pause_run(self, run_id: str, *, wait_seconds: int | None = None) -> models.PauseView:
        return await self._op("pause_run", {"run_id": run_id, "wait_seconds": wait_seconds})

    async def get_run_pause(self, run_id: str) -> models.PauseView:
        return await self._op("get_run_pause", {"run_id": run_id})

    async def resume_run(self, run_id: str, *, wait_seconds: int | None = None) -> models.PauseView:
        return await self._op("resume_run", {"run_id": run_id, "wait_seconds": wait_seconds})

    async def get_run_journal(self, run_id: str) -> models.Journal:
        return await self._op("get_run_journal", {"run_id": run_id})

    async def execution_requests(self, run_id: str) -> models.ExecutionRequestList:
        """The run's execution requests: its own, publications, continuations."""
        return await self._op("list_execution_requests", {"run_id": run_id})

    async def get_queues(self) -> models.Queues:
        """Runs held by flow control, queued and executing, the workers' run slots, and
        how each concurrency or rate key stands (platform tokens)."""
        return await self._op("get_queues")

    async def get_overview(self, minutes: int = 60) -> models.OverviewView:
        """The fleet's samples over the last `minutes` (1 to 1440): runs ended per second,
        queue depth, admission-to-start latency, runs that need a person, workers
        (platform tokens)."""
        return await self._op("get_overview", {"minutes": minutes})

    async def run_events(
        self, *, run_id: str | None = None, last_event_id: str | None = None
    ) -> AsyncIterator[_core.RunChange]:
        """The runs of the token's tenant (or one run) as they change, without end: after
        a dropped connection it connects again (backing off, as a read) and goes on from
        the last event's id, so no change is missed and none is sent twice. Give
        `last_event_id` to go on from an earlier iteration."""
        attempt = 0
        while True:
            params = {"run_id": run_id, "Last-Event-ID": last_event_id}
            prepared = _core.prepare("get_run_events", params, stream=True)
            try:
                # The feed has no end: only the connection's opening is bounded.
                timeout = httpx.Timeout(self._settings.timeout, read=None)
                async for event in self._events(prepared, timeout):
                    change = _core.run_change(event.event, event.id, event.data)
                    last_event_id = change.id or last_event_id
                    attempt = 0
                    yield change
                raise TransportError("the run feed ended")
            except httpx.TransportError as error:
                failure = _core.transport_failure(prepared, error, self._settings.server)
                delay = _core.retry_delay(prepared, attempt, self._settings, failure, None)
                if delay is None:
                    raise failure from error
            except CairnError as error:
                status = error.status if error.status == 503 else None
                transport = error if isinstance(error, TransportError) else None
                delay = (
                    None
                    if status is None and transport is None
                    else _core.retry_delay(prepared, attempt, self._settings, transport, status)
                )
                if delay is None:
                    raise
            attempt += 1
            await asyncio.sleep(delay)

    async def rerun_run(self, run_id: str) -> models.RunView:
        """A new run from this run's spec, linked to it by `rerun_of`."""
        return await self._op("create_run_rerun", {"run_id": run_id})

    async def bulk_runs(
        self,
        action: str,
        filter: models.BulkFilter | Body,
        *,
        dry_run: bool = True,
    ) -> models.BulkResponse:
        """Cancels (`"cancel"`) or reruns (`"retry"`) every run the filter matches (at
        least one of `state`, `agent`, `labels`, `created_within_seconds`); by default a
        dry run, which counts and lists them and changes nothing."""
        if isinstance(filter, models.BulkFilter):
            filter = filter.model_dump(exclude_none=True)
        body = {"action": action, "filter": filter, "dry_run": dry_run}
        return await self._op("create_runs_bulk_action", None, body)

    async def get_run_reconciliation(self, run_id: str) -> models.Reconciliation:
        """What a run that needs a person waits for: each uncertain step (its intent, what
        is known of it) and the decisions taken."""
        return await self._op("get_run_reconciliation", {"run_id": run_id})

    async def decide_reconciliation_step(
        self, run_id: str, decision_id: str, body: models.DecisionInput | Body
    ) -> models.DecisionView:
        """Decides one uncertain step (`mark_done`, `mark_not_done` or `fail_run`, with a
        reason) under the caller's `decision_id` (32 lowercase hex), sent once. The same id
        and body read the same decision; another body under it is `DecisionIdConflict`."""
        params = {"run_id": run_id, "decision_id": decision_id}
        return await self._op("create_reconciliation_decision", params, body)

    async def list_reconciliation_decisions(self, run_id: str) -> models.DecisionList:
        return await self._op("list_reconciliation_decisions", {"run_id": run_id})

    async def get_reconciliation_decision(self, run_id: str, decision_id: str) -> models.DecisionView:
        params = {"run_id": run_id, "decision_id": decision_id}
        return await self._op("get_reconciliation_decision", params)

    async def get_step_output(
        self, run_id: str, step_key: str, *, stream: str = "stdout", tail_bytes: int | None = None
    ) -> bytes:
        """A step's output so far, as bytes (the last `tail_bytes` only, when given)."""
        params = {"run_id": run_id, "step_key": step_key, "stream": stream, "tail_bytes": tail_bytes}
        return await self._op("get_step_output", params)

    async def follow_output(
        self, run_id: str, step_key: str, *, stream: str = "stdout"
    ) -> AsyncIterator[_core.OutputChunk]:
        """A step's output as it is written (server-sent `output` events), until its
        `end`. Each chunk's text is in Cairn's escaped form (`cairn.unescape_output`)."""
        params = {"run_id": run_id, "step_key": step_key, "stream": stream, "follow": True}
        prepared = _core.prepare("get_step_output", params, stream=True)
        async for chunk in self._follow(prepared, f"{run_id}/{step_key}"):
            yield chunk

    async def _events(self, prepared: _core.Prepared, timeout: Any) -> AsyncIterator[ServerSentEvent]:
        """The server-sent events of one connection; an answer other than 200 raises its
        error. A keep-alive comment, which reads as a nameless event with no data, is
        left out."""
        async with aconnect_sse(
            self._http,
            prepared.method,
            prepared.path,
            params=prepared.query,
            headers=prepared.headers,
            timeout=timeout,
        ) as source:
            response = source.response
            if response.status_code != 200:
                await response.aread()
                _core.read_reply(prepared, response.status_code, response.headers.get("content-type"), response.content)
            async for event in source.aiter_sse():
                if event.event == "message" and not event.data:
                    continue
                yield event

    async def _follow(self, prepared: _core.Prepared, what: str) -> AsyncIterator[_core.OutputChunk]:
        """The `output` events of a followed output until its `end`; the connection is
        tried again (bounded) only before the first event."""
        attempt = 0
        started = False
        while True:
            try:
                async for event in self._events(prepared, prepared.timeout(self._settings)):
                    chunk = _core.output_event(event.event, event.data)
                    if chunk is None:
                        return
                    started = True
                    yield chunk
                raise TransportError(f"the output of {what} ended before its end event")
            except httpx.TransportError as error:
                failure: CairnError = _core.transport_failure(prepared, error, self._settings.server)
                delay = None if started else _core.retry_delay(prepared, attempt, self._settings, failure, None)
                if delay is None:
                    raise failure from error
            except CairnError as error:
                status = error.status if error.status == 503 else None
                delay = (
                    None
                    if started or status is None
                    else _core.retry_delay(prepared, attempt, self._settings, None, status)
                )
                if delay is None:
                    raise
            attempt += 1
            await asyncio.sleep(delay)

    async def logs(self, run_id: str, step_key: str, *, stream: str = "stdout") -> AsyncIterator[str]:
        """A step's output lines (escaped text form, without newlines) as they are
        written, until the step's attempt ends."""
        lines = _core.LineBuffer()
        async for chunk in self.follow_output(run_id, step_key, stream=stream):
            for line in lines.feed(chunk.text):
                yield line
        for line in lines.finish():
            yield line

    async def wait(
        self,
        run_id: str,
        *,
        timeout: float,
        poll_interval: float = 0.5,
        states: Iterable[str] | None = None,
    ) -> models.RunView:
        """Polls the run until it is in one of `states` (by default: finished, or
        waiting for a person) and returns it; raises `WaitTimeout` after `timeout`
        seconds. Waiting changes nothing on the server."""
        wanted = frozenset(states) if states is not None else _core.TERMINAL_STATES | _core.PERSON_NEEDED_STATES
        deadline = time.monotonic() + timeout
        while True:
            run = await self.get_run(run_id)
            if run.state in wanted:
                return run
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(
                    f"run {run_id} is still {run.state} after {timeout:g} s (waited for {', '.join(sorted(wanted))})",
                    run_id=run_id,
                    state=run.state,
                )
            await asyncio.sleep(min(poll_interval, left))

    # -----------------------------------------------------------------------------
    # Reviewed continuations. A request saves one caller-owned action: persist the
    # action id and the exact body before the call; after `OutcomeUnknown`, read the
    # status and match its action id; never send the action again under another id.

    async def checkpoint_continuation_candidate(self, run_id: str, request_id: str) -> models.Candidate:
        """The current checkpoint-continuation candidate; admits nothing."""
        params = {"run_id": run_id, "request_id": request_id}
        return await self._op("get_checkpoint_continuation_candidate", params)

    async def request_checkpoint_continuation(
        self,
        run_id: str,
        request_id: str,
        action_id: str,
        body: models.CheckpointContinuationInputV1 | Body,
    ) -> models.ActionView:
        """Saves one reviewed checkpoint continuation under the caller's `action_id` (32
        lowercase hex), sent once. The same id and body read the same receipt."""
        params = {"run_id": run_id, "request_id": request_id, "action_id": action_id}
        return await self._op("request_checkpoint_continuation", params, body)

    async def checkpoint_continuation_status(self, run_id: str, request_id: str) -> models.ActionView:
        """The saved checkpoint-continuation action and its worker outcome."""
        params = {"run_id": run_id, "request_id": request_id}
        return await self._op("get_checkpoint_continuation_status", params)

    async def final_outcome_continuation_candidate(self, run_id: str, request_id: str) -> models.Candidate:
        """The current final-outcome candidate (the retained, already consumed report);
        admits nothing."""
        params = {"run_id": run_id, "request_id": request_id}
        return await self._op("get_final_outcome_continuation_candidate", params)

    async def request_final_outcome_continuation(
        self,
        run_id: str,
        request_id: str,
        action_id: str,
        body: models.FinalOutcomeContinuationInputV1 | Body,
    ) -> models.ActionView:
        """Saves one reviewed acceptance of the retained final report under the caller's
        `action_id` (32 lowercase hex), sent once. The same id and body read the same
        receipt."""
        params = {"run_id": run_id, "request_id": request_id, "action_id": action_id}
        return await self._op("request_final_outcome_continuation", params, body)

    async def final_outcome_continuation_status(self, run_id: str, request_id: str) -> models.ActionView:
        """The saved final-outcome action and its worker outcome."""
        params = {"run_id": run_id, "request_id": request_id}
        return await self._op("get_final_outcome_continuation_status", params)

    async def get_continuation_policy(self) -> models.Policy:
        return await self._op("get_continuation_policy")

    async def set_continuation_policy(self, update: models.PolicyUpdate | Body) -> models.Policy:
        """Changes only the named settings of the saved-work recovery policy."""
        return await self._op("set_continuation_policy", None, update)

    async def get_qualification(self) -> models.QualificationView:
        return await self._op("get_qualification")

    async def set_source_profile(self, profile_digest: str, update: models.ProfileUpdate | Body) -> models.Registered:
        params = {"profile_digest": profile_digest}
        return await self._op("set_source_profile", params, update)

    # -----------------------------------------------------------------------------
    # Verification handoffs.

    async def verification_candidates(self, run_id: str, *, agent: str) -> models.HandoffCandidate:
        """The run's pending verification handoff and the digests an adoption quotes."""
        params = {"run_id": run_id, "agent": agent}
        return await self._op("list_verification_candidates", params)

    async def adopt_verification_handoff(
        self, run_id: str, body: models.VerificationAdoptionInput | Body
    ) -> models.AdoptionView:
        """Adopts the current candidate under the body's caller-owned `request_id`, sent
        once. The same id and body read the same receipt."""
        return await self._op("adopt_verification_handoff", {"run_id": run_id}, body)

    async def verification_adoption_status(self, run_id: str, request_id: str) -> models.AdoptionView:
        params = {"run_id": run_id, "request_id": request_id}
        return await self._op("get_verification_adoption", params)

    async def verification_adoptions(self, run_id: str) -> models.AdoptionList:
        return await self._op("list_verification_adoptions", {"run_id": run_id})

    # -----------------------------------------------------------------------------
    # Publication and the delivery hold.

    async def request_publication(self, run_id: str, body: models.PublicationInputV1 | Body) -> models.PublicationView:
        """Publishes a completed run's result under the body's caller-owned
        `request_id`, sent once."""
        return await self._op("request_publication", {"run_id": run_id}, body)

    async def publication_status(self, run_id: str, request_id: str) -> models.PublicationView:
        params = {"run_id": run_id, "request_id": request_id}
        return await self._op("get_publication", params)

    async def get_delivery_hold(self, run_id: str) -> models.DeliveryHold:
        return await self._op("get_delivery_hold", {"run_id": run_id})

    async def set_delivery_hold(self, run_id: str, body: models.DeliveryHoldInput | Body) -> models.DeliveryHold:
        return await self._op("set_delivery_hold", {"run_id": run_id}, body)

    async def clear_delivery_hold(self, run_id: str) -> models.DeliveryHold:
        return await self._op("clear_delivery_hold", {"run_id": run_id})

    # -----------------------------------------------------------------------------
    # Sandboxes and their snapshots. A call that answers 202 (the worker has not
    # finished yet) returns the operation or the sandbox as it stands.

    async def create_sandbox(
        self, spec: models.CreateSpec | Body, *, idempotency_key: str | None = None
    ) -> models.SandboxView:
        return await self._op("create_sandbox", {"Idempotency-Key": idempotency_key}, spec)

    async def get_sandbox(self, sandbox_id: str) -> models.SandboxView:
        return await self._op("get_sandbox", {"sandbox_id": sandbox_id})

    async def list_sandboxes(
        self,
        *,
        state: str | None = None,
        agent: str | None = None,
        metadata: Mapping[str, str] | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> models.SandboxList:
        """One page of sandboxes, newest first; `metadata` keeps those whose labels hold
        every pair given. Pass `next_cursor` as `cursor` for the next page."""
        params = {"state": state, "agent": agent, "limit": limit, "cursor": cursor}
        return await self._call(_core.prepare("list_sandboxes", params, labels=metadata))

    async def iter_sandboxes(
        self,
        *,
        state: str | None = None,
        agent: str | None = None,
        metadata: Mapping[str, str] | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[models.SandboxView]:
        """Every sandbox that matches, page after page."""
        cursor: str | None = None
        while True:
            page = await self.list_sandboxes(
                state=state, agent=agent, metadata=metadata, limit=page_size, cursor=cursor
            )
            for sandbox in page.sandboxes:
                yield sandbox
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def exec_in_sandbox(
        self, sandbox_id: str, spec: models.ExecSpec | Body, *, wait: bool = True
    ) -> models.OperationView:
        """Runs one command in the sandbox, sent once; its `result` holds the exit and
        the output's tails. `wait=False` answers at once with the operation, to follow
        its output (`follow_exec_output`) and read its receipt (`get_sandbox_operation`)."""
        params = {"sandbox_id": sandbox_id, "wait": None if wait else False}
        return await self._op("exec_in_sandbox", params, spec)

    async def get_sandbox_operation(self, sandbox_id: str, operation_id: str) -> models.OperationView:
        """One operation of the sandbox: its intent and, once it ended, its receipt."""
        return await self._op("get_sandbox_operation", {"sandbox_id": sandbox_id, "operation_id": operation_id})

    async def get_operation_output(
        self, sandbox_id: str, operation_id: str, *, stream: str = "stdout", tail_bytes: int | None = None
    ) -> bytes:
        """An exec's output so far, as bytes (the last `tail_bytes` only, when given)."""
        params = {"sandbox_id": sandbox_id, "operation_id": operation_id, "stream": stream, "tail_bytes": tail_bytes}
        return await self._op("get_operation_output", params)

    async def follow_exec_output(
        self, sandbox_id: str, operation_id: str, *, stream: str = "stdout"
    ) -> AsyncIterator[_core.OutputChunk]:
        """An exec's output as the command prints it (server-sent `output` events),
        until the command ends. Each chunk's text is in Cairn's escaped form."""
        params = {"sandbox_id": sandbox_id, "operation_id": operation_id, "stream": stream, "follow": True}
        prepared = _core.prepare("get_operation_output", params, stream=True)
        async for chunk in self._follow(prepared, f"exec {operation_id}"):
            yield chunk

    async def get_sandbox_preview(
        self,
        sandbox_id: str,
        port: int,
        path: str = "",
        *,
        method: str = "GET",
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Sends a request to an exposed port of the sandbox (`ports` on create) and returns
        the sandbox's own answer, whatever its status. A stopped or paused persistent
        sandbox is woken and the request held up to 10 s, then `SandboxWaking` (retry after
        its `Retry-After`). Cairn's own refusals raise; the sandbox's never do. Sent once:
        the sandbox's server decides what a repeat means."""
        prepared = _core.prepare("get_sandbox_preview", {"sandbox_id": sandbox_id, "port": port, "path": "-"})
        url = prepared.path[: -len("-")] + path.lstrip("/")
        response = await self._http.request(method, url, content=content, headers=dict(headers or {}))
        if response.headers.get(_core.PREVIEW_REFUSED) is not None:
            _core.read_reply(prepared, response.status_code, response.headers.get("content-type"), response.content)
        return response

    async def set_sandbox_service(
        self, sandbox_id: str, name: str, spec: models.ServiceSpec | Body
    ) -> models.OperationView:
        """Sets a service (a deploy): kept for every later start and resume, and
        (re)started now, a stopped or paused persistent sandbox resumed first. The
        receipt's `result.started` says whether it started."""
        return await self._op("set_sandbox_service", {"sandbox_id": sandbox_id, "name": name}, spec)

    async def delete_sandbox_service(self, sandbox_id: str, name: str) -> models.OperationView | None:
        """Deletes a service: it ends now and is not started again (the receipt of its
        end). On a stopped sandbox only its record changes: `None`."""
        ended = await self._op("delete_sandbox_service", {"sandbox_id": sandbox_id, "name": name})
        return ended if isinstance(ended, models.OperationView) else None

    async def list_sandbox_files(
        self, sandbox_id: str, path: str | None = None
    ) -> dict[str, Any] | models.OperationView:
        return await self._op("list_sandbox_files", {"sandbox_id": sandbox_id, "path": path})

    async def read_sandbox_file(self, sandbox_id: str, path: str) -> bytes | models.OperationView:
        return await self._op("read_sandbox_file", {"sandbox_id": sandbox_id, "path": path})

    async def write_sandbox_file(self, sandbox_id: str, path: str, content: bytes) -> models.OperationView:
        return await self._op("write_sandbox_file", {"sandbox_id": sandbox_id, "path": path}, content)

    async def send_sandbox_input(
        self, sandbox_id: str, operation_id: str, data: bytes, *, eof: bool = False
    ) -> models.InputWritten:
        """Writes bytes (at most 64 KiB) to a running exec started with `stdin` or `pty`;
        `eof` closes its input after them. `written` is how many it took within 5 s."""
        params = {"sandbox_id": sandbox_id, "operation_id": operation_id, "eof": eof or None}
        return await self._op("send_sandbox_input", params, data)

    async def resize_sandbox_terminal(self, sandbox_id: str, operation_id: str, rows: int, cols: int) -> None:
        """Sets the size of a running exec's terminal (`pty`)."""
        params = {"sandbox_id": sandbox_id, "operation_id": operation_id}
        await self._op("resize_sandbox_terminal", params, {"rows": rows, "cols": cols})

    async def kill_sandbox_operation(self, sandbox_id: str, operation_id: str) -> models.OperationView:
        """Ends a running exec (SIGTERM, then SIGKILL after the grace); its receipt says
        `killed`. Answers at once with the operation as it stands."""
        return await self._op("kill_sandbox_operation", {"sandbox_id": sandbox_id, "operation_id": operation_id})

    async def list_sandbox_operations(self, sandbox_id: str) -> models.OperationList:
        return await self._op("list_sandbox_operations", {"sandbox_id": sandbox_id})

    async def extend_sandbox(self, sandbox_id: str, spec: models.ExtendSpec | Body | None = None) -> models.SandboxView:
        return await self._op("extend_sandbox", {"sandbox_id": sandbox_id}, spec)

    async def pause_sandbox(self, sandbox_id: str, *, wait_seconds: int | None = None) -> models.SandboxView:
        return await self._op("pause_sandbox", {"sandbox_id": sandbox_id, "wait_seconds": wait_seconds})

    async def resume_sandbox(
        self,
        sandbox_id: str,
        spec: models.ResumeSpec | Body | None = None,
        *,
        wait_seconds: int | None = None,
        idempotency_key: str | None = None,
    ) -> models.SandboxView:
        params = {"sandbox_id": sandbox_id, "wait_seconds": wait_seconds, "Idempotency-Key": idempotency_key}
        return await self._op("resume_sandbox", params, spec)

    async def stop_sandbox(self, sandbox_id: str, *, wait_seconds: int | None = None) -> models.SandboxView:
        return await self._op("stop_sandbox", {"sandbox_id": sandbox_id, "wait_seconds": wait_seconds})

    async def destroy_sandbox(self, sandbox_id: str, *, wait_seconds: int | None = None) -> models.SandboxView:
        return await self._op("destroy_sandbox", {"sandbox_id": sandbox_id, "wait_seconds": wait_seconds})

    async def fork_sandbox(
        self, sandbox_id: str, spec: models.ForkSpec | Body | None = None, *, idempotency_key: str | None = None
    ) -> models.ForkView | models.OperationView:
        params = {"sandbox_id": sandbox_id, "Idempotency-Key": idempotency_key}
        return await self._op("fork_sandbox", params, spec)

    async def create_template(self, spec: models.TemplateSpec | Body) -> models.TemplateView:
        """Publishes a ready named snapshot as the next version of a template's name,
        sent once; a version never changes."""
        return await self._op("create_template", None, spec)

    async def list_templates(self, *, name: str | None = None) -> models.TemplateList:
        """Templates' versions, newest first by name (one name's with `name`)."""
        return await self._op("list_templates", {"name": name})

    async def get_template(self, template_id: str) -> models.TemplateView:
        """One template version; `template_id` on `create_sandbox` starts from it."""
        return await self._op("get_template", {"template_id": template_id})

    async def create_volume(self, spec: models.VolumeSpec | Body) -> models.VolumeView:
        """Creates a volume, attached at `/volumes/<name>` by `create_sandbox(volumes=[...])`;
        it takes room on a worker's disk when a sandbox first attaches it."""
        return await self._op("create_volume", None, spec)

    async def list_volumes(self) -> models.VolumeList:
        """Volumes not deleted, by name."""
        return await self._op("list_volumes", None)

    async def get_volume(self, volume_id: str) -> models.VolumeView:
        return await self._op("get_volume", {"volume_id": volume_id})

    async def delete_volume(self, volume_id: str) -> models.VolumeView:
        """Deletes a volume and its data (`deleting` until its worker removed it); refused
        with `VolumeAttached` while a sandbox has it attached."""
        return await self._op("delete_volume", {"volume_id": volume_id})

    async def create_snapshot(
        self, sandbox_id: str, spec: models.SnapshotSpec | Body | None = None, *, idempotency_key: str | None = None
    ) -> models.SnapshotView | models.OperationView:
        params = {"sandbox_id": sandbox_id, "Idempotency-Key": idempotency_key}
        return await self._op("create_snapshot", params, spec)

    async def list_snapshots(self, *, sandbox_id: str | None = None, limit: int | None = None) -> models.SnapshotList:
        return await self._op("list_snapshots", {"sandbox_id": sandbox_id, "limit": limit})

    async def get_snapshot(self, snapshot_id: str) -> models.SnapshotView:
        return await self._op("get_snapshot", {"snapshot_id": snapshot_id})

    async def delete_snapshot(self, snapshot_id: str) -> models.SnapshotView:
        return await self._op("delete_snapshot", {"snapshot_id": snapshot_id})

    async def restore_snapshot(
        self, snapshot_id: str, spec: models.RestoreSpec | Body | None = None, *, idempotency_key: str | None = None
    ) -> models.SandboxView:
        params = {"snapshot_id": snapshot_id, "Idempotency-Key": idempotency_key}
        return await self._op("restore_snapshot", params, spec)

    # -----------------------------------------------------------------------------
    # Tokens, tenants, the session, the fleet.

    async def create_token(self, request: models.TokenRequest | Body) -> models.CreatedToken:
        """A new token; its secret is in the answer only."""
        return await self._op("create_token", None, request)

    async def list_tokens(self) -> models.TokenList:
        return await self._op("list_tokens")

    async def revoke_token(self, token_id: str) -> models.RevokedToken:
        return await self._op("revoke_token", {"token_id": token_id})

    async def get_session(self) -> models.SessionView:
        """The calling token: its id, name, role and tenant."""
        return await self._op("get_session")

    async def create_tenant(self, request: models.TenantRequest | Body) -> models.TenantView:
        return await self._op("create_tenant", None, request)

    async def list_tenants(self) -> models.TenantList:
        return await self._op("list_tenants")

    async def get_tenant_network_policy(self, tenant_id: str) -> models.TenantNetwork:
        return await self._op("get_tenant_network_policy", {"tenant_id": tenant_id})

    async def set_tenant_network_policy(
        self, tenant_id: str, update: models.NetworkPolicyUpdate | Body
    ) -> models.TenantNetwork:
        return await self._op("set_tenant_network_policy", {"tenant_id": tenant_id}, update)

    async def rotate_agent_credentials(self, agent: str) -> models.Rotation:
        return await self._op("rotate_agent_credentials", {"agent": agent})

    async def list_workers(self) -> models.WorkerList:
        return await self._op("list_workers")

    async def get_reaper(self) -> models.ReaperView:
        return await self._op("get_reaper")
