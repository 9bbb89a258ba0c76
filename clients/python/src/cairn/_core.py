"""What the synchronous and asynchronous clients share: settings, the validation and
encoding of a call before any transport, the reading of answers and errors, which
failures mean that nothing was sent and which leave a write's outcome unknown, the
bounded retries of reads, and the parsing of followed output. The clients only move the
bytes this module prepares."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from . import models
from ._operations import OPERATIONS
from ._spec import Body, Operation, Param
from .errors import (
    ERROR_CLASSES,
    CairnError,
    InvalidInput,
    OutcomeUnknown,
    TransportError,
    UnexpectedResponse,
)

DEFAULT_SERVER = "http://127.0.0.1:8080"  # cairnctl's default too

# Run states (the `state` of a run view): those a run never leaves, and those where it
# waits for a person. `wait()` returns on either.
TERMINAL_STATES = frozenset({"completed", "failed", "cancelled"})
PERSON_NEEDED_STATES = frozenset({"needs_reconciliation", "stopped_at_checkpoint", "awaiting_verification"})

# Failures before any byte of the request left this process: nothing was sent.
_NOTHING_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.LocalProtocolError,
    httpx.UnsupportedProtocol,
    httpx.ProxyError,
)

# After an unknown outcome, where to read what happened, by operation.
_STATUS_READS = {
    "request_checkpoint_continuation": "checkpoint_continuation_status(run_id, request_id)",
    "request_final_outcome_continuation": "final_outcome_continuation_status(run_id, request_id)",
    "adopt_verification_handoff": "verification_adoption_status(run_id, request_id)",
    "request_publication": "publication_status(run_id, request_id)",
}


def _package_version() -> str:
    try:
        return version("cairn")
    except PackageNotFoundError:  # run from a source tree
        return "0"


USER_AGENT = f"cairn-python/{_package_version()}"


@dataclass(frozen=True)
class Settings:
    server: str
    token: str | None
    timeout: float
    read_retries: int
    retry_backoff: float

    @classmethod
    def make(
        cls,
        server: str | None,
        token: str | None,
        timeout: float,
        read_retries: int,
        retry_backoff: float,
    ) -> Settings:
        """Arguments first, then `CAIRN_SERVER` and `CAIRN_TOKEN` (cairnctl's names)."""
        server = server or os.environ.get("CAIRN_SERVER") or DEFAULT_SERVER
        if not re.match(r"https?://[^/]", server):
            raise InvalidInput(f"the server must be an http:// or https:// URL, not {server!r}", field="server")
        if token is None:
            token = os.environ.get("CAIRN_TOKEN") or None
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise InvalidInput(f"timeout must be a positive number of seconds, not {timeout!r}", field="timeout")
        if not (isinstance(read_retries, int) and read_retries >= 0):
            raise InvalidInput(f"read_retries must be 0 or more, not {read_retries!r}", field="read_retries")
        return cls(server.rstrip("/"), token, float(timeout), read_retries, retry_backoff)

    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers


@dataclass(frozen=True)
class Prepared:
    """One call, validated and encoded: what is sent is exactly this."""

    operation: Operation
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    content: bytes | None
    # The body as sent, parsed back from `content` (None without a JSON body).
    body: Any
    # The caller-owned identity of a write (the path's action id or the body's
    # request id), and its Idempotency-Key.
    action_id: str | None
    idempotency_key: str | None
    # Seconds the server may hold the request before it answers (`wait_seconds`).
    server_wait: float = 0.0
    stream: bool = field(default=False)

    @property
    def method(self) -> str:
        return self.operation.method

    @property
    def is_read(self) -> bool:
        return self.operation.method == "GET"

    def timeout(self, settings: Settings) -> httpx.Timeout:
        if self.stream:
            # A followed output may be quiet for long; the server sends a keep-alive
            # comment every 15 s once it answers, and may first wait up to a minute for
            # an exec to start: ninety seconds of silence is a lost connection.
            return httpx.Timeout(max(settings.timeout, 90.0), connect=settings.timeout)
        return httpx.Timeout(settings.timeout + self.server_wait)


_NO_BODY: Any = object()

# A sandbox label's key (the scheduler's rule).
_LABEL_KEY = re.compile(r"[A-Za-z0-9._-]{1,63}")


def prepare(
    operation_id: str,
    params: Mapping[str, object] | None = None,
    body: Any = _NO_BODY,
    *,
    stream: bool = False,
    labels: Mapping[str, str] | None = None,
) -> Prepared:
    """Validates and encodes a call of `operation_id` (its parameters by name, its body,
    and `labels`, the `metadata.KEY=VALUE` filters of a sandbox list); raises
    `InvalidInput` before anything is sent."""
    operation = OPERATIONS[operation_id]
    given = dict(params or {})
    path = operation.path
    query: dict[str, str] = {}
    headers: dict[str, str] = {}
    for param in operation.params:
        argument = given.pop(param.name, None)
        if argument is None:
            if param.required:
                raise InvalidInput(f"{param.name} is required", field=param.name)
            continue
        text = _param_text(param, argument)
        if param.location == "path":
            path = path.replace("{" + param.name + "}", text)
        elif param.location == "query":
            query[param.name] = text
        else:
            headers[param.name] = text
    if given:
        # A mistake in this package, not the caller's input.
        raise TypeError(f"{operation_id} has no parameters {sorted(given)}")
    for key, label in (labels or {}).items():
        if not (isinstance(key, str) and _LABEL_KEY.fullmatch(key)):
            raise InvalidInput(f"a metadata key is 1 to 63 of A-Za-z0-9._-, not {key!r}", field="metadata")
        if not (isinstance(label, str) and len(label) <= 256 and "\0" not in label):
            raise InvalidInput(f"metadata {key} must be a string of at most 256 characters", field=f"metadata.{key}")
        query[f"metadata.{key}"] = label

    content: bytes | None = None
    value: Any = None
    if operation.body is not None:
        if body is _NO_BODY or body is None:
            if not operation.body.optional:
                raise InvalidInput(f"{operation_id} needs a body", field="body")
        else:
            content, value = _encode_body(operation_id, operation.body, body)
    elif body is not _NO_BODY:
        raise TypeError(f"{operation_id} takes no body")

    action_id = _text_or_none(params, "action_id")
    if action_id is None and operation.body is not None and operation.body.identity_field and isinstance(value, dict):
        action_id = value.get(operation.body.identity_field)
    wait = params.get("wait_seconds") if params else None
    held = _held_for(operation_id, params, value)
    return Prepared(
        operation=operation,
        path=path,
        query=query,
        headers=headers,
        content=content,
        body=value,
        action_id=action_id,
        idempotency_key=headers.get("Idempotency-Key"),
        server_wait=float(wait) if isinstance(wait, int) else held,
        stream=stream,
    )


# How long the scheduler may hold a sandbox operation before it answers (its MARGIN):
# a client that gave up sooner would take a slow answer for a lost one.
_OPERATION_MARGIN = 60.0
_HELD_OPERATIONS = frozenset(
    {
        "fork_sandbox",
        "create_snapshot",
        "restore_snapshot",
        "list_sandbox_files",
        "read_sandbox_file",
        "write_sandbox_file",
    }
)


def _held_for(operation_id: str, params: Mapping[str, object] | None, body: Any) -> float:
    """Seconds the scheduler may hold this call before answering: an exec waits for its
    command (`timeout_sec`, default 60) plus the margin, unless `wait=False`; the other
    sandbox operations, the margin."""
    if operation_id == "exec_in_sandbox":
        if params and params.get("wait") is False:
            return 0.0
        limit = body.get("timeout_sec", 60) if isinstance(body, dict) else 60
        return float(limit if isinstance(limit, int) else 60) + _OPERATION_MARGIN
    return _OPERATION_MARGIN if operation_id in _HELD_OPERATIONS else 0.0


def _text_or_none(params: Mapping[str, object] | None, name: str) -> str | None:
    value = (params or {}).get(name)
    return value if isinstance(value, str) else None


def _param_text(param: Param, value: object) -> str:
    """A parameter as it is sent, once it matches its schema exactly (no coercion)."""
    name = param.name
    if param.type == "boolean":
        if not isinstance(value, bool):
            raise InvalidInput(f"{name} must be True or False, not {value!r}", field=name)
        return "true" if value else "false"
    if param.type == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidInput(f"{name} must be an integer, not {value!r}", field=name)
        if param.minimum is not None and value < param.minimum:
            raise InvalidInput(f"{name} must be at least {param.minimum}, not {value}", field=name)
        if param.maximum is not None and value > param.maximum:
            raise InvalidInput(f"{name} must be at most {param.maximum}, not {value}", field=name)
        return str(value)
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, not {type(value).__name__} {value!r}", field=name)
    if param.pattern is not None and not re.fullmatch(param.pattern, value):
        if param.pattern == "^[0-9a-f]{32}$":
            hint = "32 lowercase hexadecimal characters"
            if name == "action_id":
                hint += " (the id the caller saved before submitting: the client never makes one)"
            raise InvalidInput(f"{name} must be {hint}, not {value!r}", field=name)
        raise InvalidInput(f"{name} must match {param.pattern}, not {value!r}", field=name)
    if param.location == "path":
        # Every path parameter has a pattern today; one without is still one segment.
        return quote(value, safe="")
    return value


def _plain_json(value: Any, where: str) -> Any:
    """`value` as plain JSON values, or `InvalidInput`: nothing is converted (no
    datetimes, sets, bytes or other objects turned into text or lists)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(f"{where} is {value!r}, which JSON cannot hold", field=where)
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInput(f"{where} has a key {key!r} that is not a string", field=where)
            out[key] = _plain_json(item, f"{where}.{key}" if where != "body" else key)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise InvalidInput(
        f"{where} is a {type(value).__name__}, which is not a JSON value: pass strings, numbers, "
        "booleans, lists and dicts (or the typed model)",
        field=where,
    )


def _dotted(loc: tuple[int | str, ...]) -> str:
    """pydantic's error location in the API's style: `steps[2].argv`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _encode_body(operation_id: str, spec: Body, body: Any) -> tuple[bytes, Any]:
    if spec.model is None:
        if not isinstance(body, (bytes, bytearray)):
            raise InvalidInput(f"the body of {operation_id} is bytes, not {type(body).__name__}", field="body")
        return bytes(body), None
    model: type[BaseModel] = getattr(models, spec.model)
    if isinstance(body, BaseModel):
        if type(body) is not model:
            raise InvalidInput(
                f"the body of {operation_id} is a {model.__name__} (or the equivalent dict), "
                f"not a {type(body).__name__}",
                field="body",
            )
        # Only what the caller set: defaults are the server's to fill in.
        try:
            text = body.model_dump_json(exclude_unset=True, by_alias=True, warnings=False)
        except PydanticSerializationError as error:
            raise InvalidInput(
                f"the body of {operation_id} cannot be written as JSON: {error}", field="body"
            ) from error
    elif isinstance(body, Mapping):
        text = json.dumps(_plain_json(body, "body"), ensure_ascii=False, allow_nan=False)
    else:
        raise InvalidInput(
            f"the body of {operation_id} is a {model.__name__} or the equivalent dict, not {type(body).__name__}",
            field="body",
        )
    # The exact bytes to send, validated strictly: an extra field, a coerced boolean or
    # integer ("true", 1, 1.0), a wrong version refuse the call here.
    try:
        model.model_validate_json(text, strict=True)
    except ValidationError as error:
        problems = error.errors(include_url=False)
        first = problems[0]
        where = _dotted(tuple(first["loc"])) or "body"
        detail = "; ".join(f"{_dotted(tuple(p['loc'])) or 'body'}: {p['msg']}" for p in problems)
        raise InvalidInput(
            f"the body of {operation_id} does not match {model.__name__} (nothing was sent): {detail}",
            field=where,
            errors=[dict(p) for p in problems],
        ) from error
    value = json.loads(text)
    for path in spec.acknowledgements:
        for where, found in _at(value, path):
            # `is True`: 1 and 1.0 equal True in Python, and are refused here.
            if found is not True:
                raise InvalidInput(
                    f"the body of {operation_id} must acknowledge {where} with true, not {found!r} (nothing was sent)",
                    field=where,
                )
    return text.encode(), value


def _at(value: Any, path: tuple[str, ...], where: str = "") -> list[tuple[str, Any]]:
    """The values at `path` (`*`: each item of an array) that are present."""
    if not path:
        return [(where, value)]
    head, rest = path[0], path[1:]
    if head == "*":
        if not isinstance(value, list):
            return []
        return [hit for i, item in enumerate(value) for hit in _at(item, rest, f"{where}[{i}]")]
    if not isinstance(value, dict) or head not in value:
        return []
    return _at(value[head], rest, f"{where}.{head}" if where else head)


# ---------------------------------------------------------------------------------
# Answers.


# The header on Cairn's own refusal of a preview, telling it from the sandbox's answer.
PREVIEW_REFUSED = "cairn-preview-refused"


def read_reply(prepared: Prepared, status: int, content_type: str | None, content: bytes) -> Any:
    """The value of a success answer (a model of `cairn.models`, a dict, or bytes), or
    the error an error answer stands for (raised)."""
    if not 200 <= status < 300:
        raise api_error(status, content)
    reply = prepared.operation.reply(status)
    if reply is None:
        raise _unexpected(prepared, status, content, "a status the document does not list")
    media = (content_type or "").split(";")[0].strip().lower()
    if reply.model is not None:
        model: type[BaseModel] = getattr(models, reply.model)
        try:
            return model.model_validate_json(content)
        except ValidationError as error:
            raise _unexpected(prepared, status, content, f"not a {model.__name__}: {error}") from error
    if media == "application/json":
        try:
            return json.loads(content)
        except ValueError as error:
            raise _unexpected(prepared, status, content, "not JSON") from error
    return content


def _unexpected(prepared: Prepared, status: int, content: bytes, why: str) -> UnexpectedResponse:
    text = content.decode("utf-8", "replace")
    applied = "" if prepared.is_read else f"; the write was answered {status}: read its state before anything else"
    return UnexpectedResponse(
        f"{prepared.method} {prepared.path} answered {status}, {why}{applied}: {text[:500]}", status=status, text=text
    )


def api_error(status: int, content: bytes) -> CairnError:
    """The exception of an error answer: the class of its code, with the API's message."""
    try:
        detail = models.ErrorBody.model_validate_json(content).error
    except ValidationError:
        text = content.decode("utf-8", "replace").strip()
        return CairnError(f"HTTP {status}: {text[:500] or 'no error body'}", status=status)
    cls = ERROR_CLASSES.get(detail.code, CairnError)
    return cls(detail.message, status=status, code=detail.code, field=detail.field)


def transport_failure(prepared: Prepared, error: httpx.TransportError, server: str) -> CairnError:
    """What a transport failure means: nothing sent, a failed read, or, for a write that
    may have been sent, an unknown outcome."""
    cause = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    if isinstance(error, _NOTHING_SENT):
        return TransportError(f"cannot reach the scheduler at {server} ({cause}); nothing was sent")
    if prepared.is_read:
        return TransportError(f"{prepared.method} {prepared.path} failed: {cause}")
    identity = ""
    if prepared.action_id is not None:
        identity = f" and match its action id {prepared.action_id}"
    elif prepared.idempotency_key is not None:
        identity = f" (a repeat with the same Idempotency-Key {prepared.idempotency_key!r} reads the original)"
    status_read = _STATUS_READS.get(prepared.operation.id, "the resource's current state")
    return OutcomeUnknown(
        f"the outcome of {prepared.operation.id} ({prepared.method} {prepared.path}) is unknown: {cause} "
        f"after the request may have been sent, so it may have been applied. Keep the saved identity and "
        f"body; read {status_read} next{identity}; never resubmit it under another id.",
        operation=prepared.operation.id,
        method=prepared.method,
        path=prepared.path,
        body=prepared.body,
        content=prepared.content,
        action_id=prepared.action_id,
        idempotency_key=prepared.idempotency_key,
    )


def retry_delay(
    prepared: Prepared, attempt: int, settings: Settings, error: CairnError | None, status: int | None
) -> float | None:
    """Seconds to wait before trying a failed read again, or None: never a write, only a
    transport failure or a 503, at most `read_retries` times, backing off."""
    if not prepared.is_read or attempt >= settings.read_retries:
        return None
    if error is not None and not isinstance(error, TransportError):
        return None
    if status is not None and status != 503:
        return None
    return float(min(settings.retry_backoff * (2**attempt), 2.0))


# ---------------------------------------------------------------------------------
# Followed output.


@dataclass(frozen=True)
class OutputChunk:
    """One `output` event of a followed step: its first chunk's sequence number and the
    text of the bytes in Cairn's escaped text form (see `unescape_output`)."""

    seq: int
    text: str


def output_event(event: str, data: str) -> OutputChunk | None:
    """An `output` event's chunk; None for `end`; anything else is unexpected."""
    try:
        value = json.loads(data)
    except ValueError as error:
        raise UnexpectedResponse(f"an output event that is not JSON: {data[:200]}", status=200, text=data) from error
    if event == "end":
        return None
    if event == "output" and isinstance(value, dict) and isinstance(value.get("text"), str):
        seq = value.get("seq")
        return OutputChunk(seq=seq if isinstance(seq, int) else -1, text=value["text"])
    raise UnexpectedResponse(f"an unexpected output event {event!r}: {data[:200]}", status=200, text=data)


@dataclass(frozen=True)
class RunChange:
    """One event of the run change feed: `kind` is `run` (with the run as it is now),
    `ready` (what changed before the connection has been sent) or `reset` (more changed
    than is replayed: read the list again); `id` is its position, to go on from."""

    kind: str
    id: str
    run: models.RunView | None = None


def run_change(event: str, id: str, data: str) -> RunChange:
    """A run change feed event; anything else is unexpected."""
    if event in ("ready", "reset"):
        return RunChange(kind=event, id=id)
    if event == "run":
        try:
            return RunChange(kind="run", id=id, run=models.RunView.model_validate_json(data))
        except ValueError as error:
            raise UnexpectedResponse(f"a run event that is not a run: {data[:200]}", status=200, text=data) from error
    raise UnexpectedResponse(f"an unexpected run feed event {event!r}: {data[:200]}", status=200, text=data)


class LineBuffer:
    """Cuts followed text into lines (without their newline)."""

    def __init__(self) -> None:
        self._partial = ""

    def feed(self, text: str) -> list[str]:
        *lines, self._partial = (self._partial + text).split("\n")
        return lines

    def finish(self) -> list[str]:
        rest, self._partial = self._partial, ""
        return [rest] if rest else []


def unescape_output(text: str) -> bytes:
    """The bytes of output text in Cairn's escaped form: valid UTF-8 as it is, `\\\\` a
    backslash, `\\xNN` one byte."""
    out = bytearray()
    i = 0
    while i < len(text):
        j = text.find("\\", i)
        if j < 0:
            out += text[i:].encode()
            break
        out += text[i:j].encode()
        if text.startswith("\\\\", j):
            out += b"\\"
            i = j + 2
        elif text.startswith("\\x", j) and re.fullmatch(r"[0-9a-f]{2}", text[j + 2 : j + 4]):
            out.append(int(text[j + 2 : j + 4], 16))
            i = j + 4
        else:
            raise ValueError(f"not Cairn's escaped output text at {j}: {text[j:j + 8]!r}")
    return bytes(out)
