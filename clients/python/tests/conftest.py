"""Fixtures: live stacks (tests/harness.py), removed at the end of the session even when
a test fails, and clients of them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness import Recorder, Stack

import cairn


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """A scheduler and one worker, shared by the tests that only need runs to run."""
    live = Stack("client")
    try:
        live.start_scheduler()
        live.start_worker("w1")
        yield live
    finally:
        live.close()


@pytest.fixture(scope="session")
def journey_stack() -> Iterator[Stack]:
    """A scheduler of its own, with no worker yet: the continuation tests start a faulty
    worker first, so that no normal worker takes their runs."""
    live = Stack("journey")
    try:
        live.start_scheduler()
        yield live
    finally:
        live.close()


@pytest.fixture
def client(stack: Stack) -> Iterator[cairn.Client]:
    with cairn.Client(stack.url, stack.admin) as admin:
        yield admin


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    listener = Recorder()
    try:
        yield listener
    finally:
        listener.close()
