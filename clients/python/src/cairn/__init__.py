"""Typed client of Cairn's scheduler API.

`Client` (synchronous) and `AsyncClient` take the server and token from their arguments
or from `CAIRN_SERVER` and `CAIRN_TOKEN`. Every body is a model of `cairn.models` or the
equivalent dict, validated strictly before anything is sent; a write is sent once and
never retried, and a lost answer raises `OutcomeUnknown`. The exceptions are in
`cairn.errors`.
"""

from . import errors, models
from ._async_client import AsyncClient
from ._core import PERSON_NEEDED_STATES, TERMINAL_STATES, OutputChunk, unescape_output
from ._sync_client import Client
from .errors import (
    CairnError,
    InvalidInput,
    OutcomeUnknown,
    TransportError,
    UnexpectedResponse,
    WaitTimeout,
)

__all__ = [
    "AsyncClient",
    "CairnError",
    "Client",
    "InvalidInput",
    "OutcomeUnknown",
    "OutputChunk",
    "PERSON_NEEDED_STATES",
    "TERMINAL_STATES",
    "TransportError",
    "UnexpectedResponse",
    "WaitTimeout",
    "errors",
    "models",
    "unescape_output",
]
