"""The hand-written exceptions; `errors.py` is the public module."""

from __future__ import annotations

from typing import Any, ClassVar


class CairnError(Exception):
    """A failed call. `status`, `code`, `message` and `field` are the API's error when
    the scheduler answered one (`{"error": {"code", "message", "field"}}`)."""

    # The code and status a subclass stands for (None on the base class).
    CODE: ClassVar[str | None] = None
    STATUS: ClassVar[int | None] = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status if status is not None else self.STATUS
        self.code = code if code is not None else self.CODE
        self.field = field

    def __str__(self) -> str:
        where = f" ({self.field})" if self.field else ""
        if self.code is not None and self.status is not None:
            return f"{self.status} {self.code}: {self.message}{where}"
        return f"{self.message}{where}"


class InvalidInput(CairnError, ValueError):
    """The call was refused before anything was sent: a body that does not match its
    strict model, a coerced acknowledgement, a malformed id or parameter. `errors` holds
    pydantic's errors when a model refused it."""

    def __init__(self, message: str, *, field: str | None = None, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message, field=field)
        self.errors = errors or []


class TransportError(CairnError):
    """The scheduler could not be reached before the request was sent (nothing was
    sent), or a read failed after its bounded retries."""


class OutcomeUnknown(CairnError):
    """A write may have reached the scheduler, and its answer was lost (a timeout, a
    connection closed after sending). It may have been applied. Read its status next and
    match the saved identity; never resubmit it under another id.

    `action_id` is the caller-owned identity of the action (the path's action id, or the
    body's `request_id`), `idempotency_key` the header's, `method`, `path` and `body` the
    request exactly as sent (`content` its bytes)."""

    def __init__(
        self,
        message: str,
        *,
        operation: str,
        method: str,
        path: str,
        body: Any,
        content: bytes | None,
        action_id: str | None,
        idempotency_key: str | None,
    ) -> None:
        super().__init__(message)
        self.operation = operation
        self.method = method
        self.path = path
        self.body = body
        self.content = content
        self.action_id = action_id
        self.idempotency_key = idempotency_key


class UnexpectedResponse(CairnError):
    """The scheduler answered something the OpenAPI document does not describe. On a
    write the status says whether it was applied; `text` holds the answer."""

    def __init__(self, message: str, *, status: int, text: str) -> None:
        super().__init__(message, status=status)
        self.text = text


class WaitTimeout(CairnError, TimeoutError):
    """`wait()` reached its timeout before the run reached a state it waits for."""

    def __init__(self, message: str, *, run_id: str, state: str | None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.state = state


__all__ = [
    "CairnError",
    "InvalidInput",
    "OutcomeUnknown",
    "TransportError",
    "UnexpectedResponse",
    "WaitTimeout",
]
