"""`cairn-mcp`: Cairn's tools for an agent, as an MCP server over stdio.

It is the official MCP Python SDK (`mcp`) over this package's `AsyncClient`, so a tool
keeps the client's discipline by construction: each write tool takes the caller's
identity (an action id, a request id or an idempotency key) and the exact input,
validates it strictly before anything is sent, and sends it once, never again. The
server and token come from `CAIRN_SERVER` and `CAIRN_TOKEN` in the server's environment,
never from a tool's arguments, so an agent cannot pick another identity.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

from ._async_client import AsyncClient
from .errors import CairnError, InvalidInput, OutcomeUnknown

T = TypeVar("T")

INSTRUCTIONS = """Cairn runs agents' work as runs of steps on a fleet of workers.
Submit a run, follow it (status, journal, logs) and cancel it. A run that needs a person
offers reviewed continuations: read the candidate, build the version-1 body from it,
choose your own action id (32 lowercase hex) and keep it with the body, then request
once. Every write tool validates its input before sending anything and sends it once.
If a write's outcome is unknown, read its status and match your saved id: never send it
again under another id."""

# The text a write tool's description ends with.
ONCE = (
    " Validated strictly before anything is sent (exactly the documented fields; an"
    " acknowledgement is the JSON true, never 1 or \"true\"), then sent once and never"
    " retried. If the outcome is unknown, read the status and match your saved id; do"
    " not send it again under another id."
)

# At most this much of a step's output is returned by `get_run_logs`.
MAX_LOG_BYTES = 1 << 20


def _plain(value: Any) -> Any:
    """A model or a list of them as JSON-ready data."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    return value


def printable(data: bytes) -> str:
    """A step's bytes in Cairn's escaped text form (the scheduler's own): valid UTF-8 as
    it is, a backslash doubled, and every byte that is not UTF-8 and every control
    character but newline and tab (C1 controls included) as `\\xNN` escapes of its bytes,
    so nothing a hostile step prints can pass for an escape, end or forge the answer."""
    out: list[str] = []
    for c in data.decode("utf-8", errors="surrogateescape"):
        code = ord(c)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8
            out.append(f"\\x{code - 0xDC00:02x}")
        elif c == "\\":
            out.append("\\\\")
        elif c in "\n\t":
            out.append(c)
        elif unicodedata.category(c) == "Cc":
            out.extend(f"\\x{b:02x}" for b in c.encode())
        else:
            out.append(c)
    return "".join(out)


def _refusal(error: CairnError, status_hint: str | None) -> ToolError:
    """What the agent reads when a call fails: the API's code and message, and after an
    unknown outcome, what to read next."""
    if isinstance(error, OutcomeUnknown):
        identity = f" (id {error.action_id})" if error.action_id else ""
        read = f" Read {status_hint} next" if status_hint else " Read the resource's status next"
        return ToolError(
            f"the outcome is unknown{identity}: it may have been saved.{read} and match your saved id;"
            " do not send it again under another id."
        )
    if isinstance(error, InvalidInput):
        return ToolError(f"refused before sending (nothing was sent): {error}")
    return ToolError(str(error))


async def _call(call: Awaitable[T], status_hint: str | None = None) -> Any:
    try:
        return _plain(await call)
    except CairnError as error:
        raise _refusal(error, status_hint) from error


async def _tail(read: Callable[[int], Awaitable[bytes]], tail_bytes: int) -> str:
    """The last `tail_bytes` of an output `read` returns, escaped; a size out of bounds
    is refused before anything is sent."""
    if not 1 <= tail_bytes <= MAX_LOG_BYTES:
        raise ToolError(f"tail_bytes must be from 1 to {MAX_LOG_BYTES}")
    return printable(await _call(read(tail_bytes)))


def build(client_factory: Callable[[], AsyncClient]) -> MCPServer:
    """The server with its tools; `client_factory` makes the one client they share, on
    first use (inside the server's event loop)."""
    server = MCPServer("cairn", instructions=INSTRUCTIONS)
    holder: list[AsyncClient] = []

    def client() -> AsyncClient:
        if not holder:
            holder.append(client_factory())
        return holder[0]

    # -- runs -------------------------------------------------------------------------

    @server.tool(description="Submit a run (agent, steps, budgets…) under your idempotency key: the same key and spec return the same run." + ONCE)
    async def submit_run(spec: dict[str, Any], idempotency_key: str) -> Any:
        return await _call(client().submit_run(spec, idempotency_key=idempotency_key), "get_run with the run id, or submit_run with the same key and spec")

    @server.tool(description="A run: its state, attempt, usage, budgets and steps.")
    async def get_run(run_id: str) -> Any:
        return await _call(client().get_run(run_id))

    @server.tool(description="Wait until a run is finished or needs a person (at most timeout_seconds, 1 to 300), and return it.")
    async def wait_for_run(run_id: str, timeout_seconds: int = 60) -> Any:
        if not 1 <= timeout_seconds <= 300:
            raise ToolError("timeout_seconds must be from 1 to 300")
        return await _call(client().wait(run_id, timeout=float(timeout_seconds)))

    @server.tool(description="A run's journal: every step's intent and receipt, and the run's entries.")
    async def get_run_journal(run_id: str) -> Any:
        return await _call(client().get_run_journal(run_id))

    @server.tool(description="The last tail_bytes (1 to 1048576) of a step's output (stream stdout or stderr); bytes that are not UTF-8 text, and control characters, appear escaped (\\xNN).")
    async def get_run_logs(run_id: str, step_key: str, stream: str = "stdout", tail_bytes: int = 16384) -> str:
        return await _tail(lambda n: client().get_step_output(run_id, step_key, stream=stream, tail_bytes=n), tail_bytes)

    @server.tool(description="Cancel a run: at once when no worker holds it, else the worker is signalled.")
    async def cancel_run(run_id: str) -> Any:
        return await _call(client().cancel_run(run_id), "get_run")

    @server.tool(description="A run's execution requests (its tickets): runs, continuations, verification and publication.")
    async def execution_requests(run_id: str) -> Any:
        return await _call(client().execution_requests(run_id))

    # -- reviewed continuations ---------------------------------------------------------

    @server.tool(description="The current checkpoint-continuation candidate of a request (admission READY or its holds, candidate_digest, maximum_window_seconds); admits nothing.")
    async def get_checkpoint_candidate(run_id: str, request_id: str) -> Any:
        return await _call(client().checkpoint_continuation_candidate(run_id, request_id))

    @server.tool(description="Save one reviewed checkpoint continuation under your action_id (32 lowercase hex, kept with the body before the call). body is the strict CheckpointContinuationInputV1: version 1, candidate_digest, valid_for_seconds, and acknowledge_retained_response_consumed_once, acknowledge_no_completed_effect_replay, acknowledge_same_request_attempt_and_budgets, acknowledge_finite_ownership_lease, each true." + ONCE)
    async def request_checkpoint_continuation(run_id: str, request_id: str, action_id: str, body: dict[str, Any]) -> Any:
        call = client().request_checkpoint_continuation(run_id, request_id, action_id, body)
        return await _call(call, "get_checkpoint_status")

    @server.tool(description="The saved checkpoint-continuation action of a request (its action_id) and its worker status.")
    async def get_checkpoint_status(run_id: str, request_id: str) -> Any:
        return await _call(client().checkpoint_continuation_status(run_id, request_id))

    @server.tool(description="The current final-outcome candidate: the retained, already consumed final report of a request that needs a person (admission READY or its holds, retained_outcome, candidate_digest); admits nothing.")
    async def get_final_outcome_candidate(run_id: str, request_id: str) -> Any:
        return await _call(client().final_outcome_continuation_candidate(run_id, request_id))

    @server.tool(description="Accept the retained final report once, under your action_id (32 lowercase hex, kept with the body before the call). body is the strict FinalOutcomeContinuationInputV1: version 1, candidate_digest, valid_for_seconds, and acknowledge_already_consumed_final_output, acknowledge_no_completed_effect_replay, acknowledge_same_request_attempt_and_budgets, acknowledge_finite_ownership_lease, each true." + ONCE)
    async def request_final_outcome_continuation(run_id: str, request_id: str, action_id: str, body: dict[str, Any]) -> Any:
        call = client().request_final_outcome_continuation(run_id, request_id, action_id, body)
        return await _call(call, "get_final_outcome_status")

    @server.tool(description="The saved final-outcome action of a request (its action_id) and its worker status.")
    async def get_final_outcome_status(run_id: str, request_id: str) -> Any:
        return await _call(client().final_outcome_continuation_status(run_id, request_id))

    # -- verification -------------------------------------------------------------------

    @server.tool(description="A run's pending verification handoff for an agent: the frozen checks and the digests an adoption quotes.")
    async def get_verification_candidates(run_id: str, agent: str) -> Any:
        return await _call(client().verification_candidates(run_id, agent=agent))

    @server.tool(description="Approve the frozen checks of a run's verification handoff under your request_id (32 lowercase hex, in body, kept before the call). body is the strict VerificationAdoptionInput: request_id, agent, the candidate's five digests, and reusable_build_checks." + ONCE)
    async def adopt_verification_handoff(run_id: str, body: dict[str, Any]) -> Any:
        return await _call(client().adopt_verification_handoff(run_id, body), "get_verification_adoption")

    @server.tool(description="An adoption of a verification handoff and each check's result.")
    async def get_verification_adoption(run_id: str, request_id: str) -> Any:
        return await _call(client().verification_adoption_status(run_id, request_id))

    # -- sandboxes ----------------------------------------------------------------------

    @server.tool(description="Create a sandbox (agent, optional repository and ref or source snapshot, timeouts) under your idempotency key: the same key and spec return the same sandbox." + ONCE)
    async def create_sandbox(spec: dict[str, Any], idempotency_key: str) -> Any:
        return await _call(client().create_sandbox(spec, idempotency_key=idempotency_key), "get_sandbox")

    @server.tool(description="Sandboxes, newest first (at most limit, 1 to 500): of a state, an agent, and labelled with every metadata pair given.")
    async def list_sandboxes(
        state: str | None = None, agent: str | None = None, metadata: dict[str, str] | None = None, limit: int = 50
    ) -> Any:
        call = client().list_sandboxes(state=state, agent=agent, metadata=metadata, limit=limit)
        return await _call(call)

    @server.tool(description="A sandbox: its state, labels, timeouts and disk.")
    async def get_sandbox(sandbox_id: str) -> Any:
        return await _call(client().get_sandbox(sandbox_id))

    @server.tool(description="Run one command in a sandbox (spec: argv, optional env, cwd, timeout_sec, network) and return its exit and output. Sent once." )
    async def sandbox_exec(sandbox_id: str, spec: dict[str, Any]) -> Any:
        return await _call(client().exec_in_sandbox(sandbox_id, spec), "get_sandbox")

    @server.tool(description="Start one command in a sandbox (spec as for sandbox_exec) and return its operation at once, for a command that runs long: read its output so far with get_exec_output and its end with get_sandbox_operation. Sent once.")
    async def sandbox_exec_start(sandbox_id: str, spec: dict[str, Any]) -> Any:
        return await _call(client().exec_in_sandbox(sandbox_id, spec, wait=False), "get_sandbox_operation")

    @server.tool(description="A sandbox operation: its state (pending, running, done, interrupted) and, once done, its receipt (an exec's exit code and output tails).")
    async def get_sandbox_operation(sandbox_id: str, operation_id: str) -> Any:
        return await _call(client().get_sandbox_operation(sandbox_id, operation_id))

    @server.tool(description="The last tail_bytes (1 to 1048576) of an exec's output so far (stream stdout or stderr), while it runs or after; bytes that are not UTF-8 text, and control characters, appear escaped (\\xNN).")
    async def get_exec_output(
        sandbox_id: str, operation_id: str, stream: str = "stdout", tail_bytes: int = 16384
    ) -> str:
        read = client().get_operation_output
        return await _tail(lambda n: read(sandbox_id, operation_id, stream=stream, tail_bytes=n), tail_bytes)

    @server.tool(description="List a directory of a sandbox's workspace (path relative to it; the root by default).")
    async def sandbox_list_files(sandbox_id: str, path: str | None = None) -> Any:
        return await _call(client().list_sandbox_files(sandbox_id, path))

    @server.tool(description="Read a file of a sandbox's workspace as text (bytes that are not UTF-8, and control characters, appear escaped).")
    async def sandbox_read_file(sandbox_id: str, path: str) -> Any:
        content = await _call(client().read_sandbox_file(sandbox_id, path))
        return printable(content) if isinstance(content, bytes) else content

    @server.tool(description="Write a text file (UTF-8) into a sandbox's workspace, replacing it. Sent once.")
    async def sandbox_write_file(sandbox_id: str, path: str, content: str) -> Any:
        return await _call(client().write_sandbox_file(sandbox_id, path, content.encode()), "sandbox_read_file")

    return server


def main() -> None:
    """`cairn-mcp`: serves the tools over stdio with `CAIRN_SERVER` and `CAIRN_TOKEN`."""
    if not os.environ.get("CAIRN_TOKEN"):
        raise SystemExit("cairn-mcp: set CAIRN_TOKEN (and CAIRN_SERVER, default http://127.0.0.1:8080) in its environment")
    build(AsyncClient).run("stdio")


if __name__ == "__main__":
    main()
