"""`cairn-mcp` over stdio, driven by the MCP SDK's own client session against a live
scheduler and worker: it lists its tools, runs a run to completion, shows a hostile
step's bytes escaped, and refuses a coerced continuation body before anything is sent."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio

import cairn
from harness import DroppingProxy, Stack, run_of, shell
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

WRITE_TOOLS = {
    "submit_run",
    "cancel_run",
    "request_checkpoint_continuation",
    "request_final_outcome_continuation",
    "adopt_verification_handoff",
    "create_sandbox",
    "sandbox_exec",
    "sandbox_exec_start",
    "sandbox_write_file",
}
READ_TOOLS = {
    "get_run",
    "wait_for_run",
    "get_run_journal",
    "get_run_logs",
    "execution_requests",
    "get_checkpoint_candidate",
    "get_checkpoint_status",
    "get_final_outcome_candidate",
    "get_final_outcome_status",
    "get_verification_candidates",
    "get_verification_adoption",
    "get_sandbox",
    "get_sandbox_operation",
    "get_exec_output",
    "list_sandboxes",
    "sandbox_list_files",
    "sandbox_read_file",
}


def _params(stack: Stack, server: str | None = None) -> StdioServerParameters:
    env = {"CAIRN_SERVER": server or stack.url, "CAIRN_TOKEN": stack.admin, "PATH": os.environ.get("PATH", "")}
    # The package under test, wherever this test imports it from.
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return StdioServerParameters(command=sys.executable, args=["-m", "cairn.mcp"], env=env)


async def _tool(session: ClientSession, name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    """Calls a tool; its error flag and its answer (structured when it has one, else
    the text)."""
    result = await session.call_tool(name, arguments)
    text = "".join(getattr(block, "text", "") for block in result.content)
    if result.is_error:
        return True, text
    structured = result.structured_content
    if isinstance(structured, dict) and set(structured) == {"result"}:
        return False, structured["result"]
    return False, structured if structured is not None else json.loads(text) if text.startswith("{") else text


def test_an_agent_lists_the_tools_and_runs_a_run_to_completion_over_stdio(stack: Stack) -> None:
    async def journey() -> None:
        async with stdio_client(_params(stack)) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert WRITE_TOOLS | READ_TOOLS <= set(tools), sorted(tools)
            for name, tool in tools.items():
                # The token comes from the server's environment, never from an argument.
                assert "token" not in json.dumps(tool.input_schema).lower(), name
            for name in WRITE_TOOLS - {"cancel_run"}:
                assert "sent once" in (tools[name].description or "").lower(), name

            spec = run_of(
                shell("hello", "echo hello from mcp"),
                shell("hostile", "printf 'a\\000b\\377c\\033[2J\\n'"),
            )
            failed, run = await _tool(session, "submit_run", {"spec": spec, "idempotency_key": "mcp-journey-1"})
            assert not failed, run
            failed, again = await _tool(session, "submit_run", {"spec": spec, "idempotency_key": "mcp-journey-1"})
            assert not failed and again["run_id"] == run["run_id"], again
            failed, done = await _tool(session, "wait_for_run", {"run_id": run["run_id"], "timeout_seconds": 120})
            assert not failed and done["state"] == "completed", f"{done}\n{stack.logs()}"
            failed, logs = await _tool(session, "get_run_logs", {"run_id": run["run_id"], "step_key": "hello"})
            assert not failed and logs == "hello from mcp\n", logs
            failed, hostile = await _tool(session, "get_run_logs", {"run_id": run["run_id"], "step_key": "hostile"})
            assert not failed, hostile
            assert "\x00" not in hostile and "\x1b" not in hostile, repr(hostile)
            assert "\\x00" in hostile and "\\xff" in hostile and "\\x1b" in hostile, repr(hostile)
            failed, journal = await _tool(session, "get_run_journal", {"run_id": run["run_id"]})
            assert not failed and journal, journal

    anyio.run(journey)


def test_a_coerced_continuation_body_is_refused_by_the_tool_before_anything_is_sent(stack: Stack) -> None:
    async def refused() -> None:
        async with stdio_client(_params(stack)) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            failed, run = await _tool(
                session, "submit_run", {"spec": run_of(shell("one", "true")), "idempotency_key": "mcp-refused-1"}
            )
            assert not failed, run
            good = {
                "version": 1,
                "candidate_digest": "a" * 64,
                "valid_for_seconds": 60,
                "acknowledge_already_consumed_final_output": True,
                "acknowledge_no_completed_effect_replay": True,
                "acknowledge_same_request_attempt_and_budgets": True,
                "acknowledge_finite_ownership_lease": True,
            }
            where = {"run_id": run["run_id"], "request_id": run["request_id"], "action_id": "b" * 32}
            for coerced in (1, "true", "yes", 0):
                body = dict(good, acknowledge_already_consumed_final_output=coerced)
                failed, text = await _tool(session, "request_final_outcome_continuation", {**where, "body": body})
                assert failed and "nothing was sent" in text, text
            failed, text = await _tool(
                session, "request_final_outcome_continuation", {**where, "body": dict(good, note="x")}
            )
            assert failed and "nothing was sent" in text, text
            failed, text = await _tool(
                session, "request_final_outcome_continuation", {**where, "action_id": "B" * 32, "body": good}
            )
            assert failed and "nothing was sent" in text, text
            # Nothing was saved for the request: its status has no action.
            status_args = {"run_id": run["run_id"], "request_id": run["request_id"]}
            failed, status = await _tool(session, "get_final_outcome_status", status_args)
            assert not failed and status["status"] == "not_recovered" and "action_id" not in status, status
            # An error from the API reaches the agent with its code and message.
            failed, text = await _tool(session, "get_run", {"run_id": "c" * 32})
            assert failed and "not_found" in text, text

    anyio.run(refused)


def test_a_write_whose_answer_is_lost_tells_the_agent_to_read_and_not_to_resend(stack: Stack) -> None:
    """The MCP server talks to the scheduler through a proxy that lets the scheduler
    answer and drops the answer: the tool's error says the outcome is unknown and what to
    read; the run exists once, and the same key reads it back."""
    proxy = DroppingProxy(stack.port)
    spec = run_of(shell("one", "true"), agent="py-mcp-lost")

    async def lost() -> str:
        async with stdio_client(_params(stack, proxy.url)) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            failed, text = await _tool(session, "submit_run", {"spec": spec, "idempotency_key": "mcp-lost-1"})
            assert failed, text
            return str(text)

    try:
        text = anyio.run(lost)
    finally:
        proxy.close()
    assert "outcome is unknown" in text and "do not send it again under another id" in text, text
    assert len(proxy.answers) == 1 and proxy.answers[0].startswith(b"HTTP/1.1 201"), proxy.answers
    with cairn.Client(stack.url, stack.admin) as direct:
        runs = direct.list_runs(agent="py-mcp-lost").runs
        assert len(runs) == 1, runs
        again = direct.submit_run(spec, idempotency_key="mcp-lost-1")
        assert again.run_id == runs[0].run_id


def test_printable_is_the_schedulers_escaped_form() -> None:
    """A literal backslash is doubled, so printed text never passes for an escape; C0
    and C1 controls and bytes that are not UTF-8 are escaped; newline and tab stay."""
    from cairn.mcp import printable

    assert printable(b"\\x1b") == "\\\\x1b"
    assert printable(b"a\x00\xff\x1b[2J\xc2\x9b\n\t\xe2\x82\xac") == "a\\x00\\xff\\x1b[2J\\xc2\\x9b\n\t\u20ac"


def test_an_agent_starts_a_long_command_and_reads_its_output_while_it_runs(stack: Stack) -> None:
    """`sandbox_exec_start` answers at once; `get_exec_output` reads what the command
    printed so far while it still runs; `get_sandbox_operation` then shows its end."""

    async def long_command() -> None:
        async with stdio_client(_params(stack)) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            spec = {"agent": "py-mcp-exec", "timeout_sec": 600}
            failed, sandbox = await _tool(session, "create_sandbox", {"spec": spec, "idempotency_key": "mcp-exec-1"})
            assert not failed, sandbox
            sandbox_id = sandbox["sandbox_id"]
            with anyio.fail_after(60):
                while sandbox["state"] != "running" or sandbox.get("pending"):
                    await anyio.sleep(0.2)
                    _, sandbox = await _tool(session, "get_sandbox", {"sandbox_id": sandbox_id})
            script = {"argv": ["sh", "-c", "echo started; sleep 4; echo finished"], "timeout_sec": 60}
            failed, started = await _tool(session, "sandbox_exec_start", {"sandbox_id": sandbox_id, "spec": script})
            assert not failed and started["state"] in ("pending", "running"), started
            where = {"sandbox_id": sandbox_id, "operation_id": started["operation_id"]}
            with anyio.fail_after(30):
                text = ""
                while text != "started\n":
                    await anyio.sleep(0.2)
                    failed, text = await _tool(session, "get_exec_output", where)
                    if failed and "not_found" in str(text):
                        text = ""  # not started yet
            _, operation = await _tool(session, "get_sandbox_operation", where)
            assert operation["state"] == "running", operation
            with anyio.fail_after(30):
                while operation["state"] != "done":
                    await anyio.sleep(0.3)
                    _, operation = await _tool(session, "get_sandbox_operation", where)
            assert operation["result"]["exit_code"] == 0, operation
            failed, text = await _tool(session, "get_exec_output", where)
            assert not failed and text == "started\nfinished\n", text
            with cairn.Client(stack.url, stack.admin) as direct:
                direct.destroy_sandbox(sandbox_id)

    anyio.run(long_command)
