"""The shapes of the operation table that `scripts/python-models` generates from the
OpenAPI document (`_operations.py`): what each route takes and answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Param:
    """A path, query or header parameter, with the constraints its schema states."""

    name: str
    location: Literal["path", "query", "header"]
    required: bool
    type: Literal["string", "integer", "boolean"]
    pattern: str | None = None
    minimum: int | None = None
    maximum: int | None = None


@dataclass(frozen=True)
class Body:
    """A request body: a JSON model of `cairn.models`, or raw bytes (`model` None)."""

    media_type: str
    model: str | None
    # `oneOf: [null, X]`: the body may be left out.
    optional: bool
    # Paths (keys, `*` for every item of an array) of booleans that must be `true`.
    acknowledgements: tuple[tuple[str, ...], ...] = ()
    # The body field holding the caller-owned id of the action, when it has one.
    identity_field: str | None = None


@dataclass(frozen=True)
class Reply:
    """A success answer: its status, media types and model (None: a free-form JSON
    object, or bytes)."""

    status: int
    media_types: tuple[str, ...]
    model: str | None


@dataclass(frozen=True)
class Operation:
    id: str
    method: str
    path: str
    params: tuple[Param, ...]
    body: Body | None
    replies: tuple[Reply, ...]

    def reply(self, status: int) -> Reply | None:
        return next((r for r in self.replies if r.status == status), None)
