"""The client's surface against the document: every operation is reachable from a
method of both clients, and the two clients have the same methods."""

from __future__ import annotations

import inspect

import cairn
from cairn._operations import OPERATIONS


def methods(cls: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(f) for name, f in vars(cls).items() if callable(f) and not name.startswith("_")}


def test_every_operation_has_a_method() -> None:
    for client in (cairn.Client, cairn.AsyncClient):
        source = inspect.getsource(client)
        missing = [op for op in OPERATIONS if f'"{op}"' not in source]
        assert not missing, f"{client.__name__} cannot reach {missing}"


def test_the_sync_and_async_clients_match() -> None:
    sync, asynchronous = methods(cairn.Client), methods(cairn.AsyncClient)
    assert set(sync) - {"close"} == set(asynchronous) - {"aclose"}
    for name, signature in sync.items():
        if name != "close":
            assert str(signature).replace("Iterator", "AsyncIterator") == str(asynchronous[name]), name
    for name in asynchronous:
        is_generator = inspect.isasyncgenfunction(getattr(cairn.AsyncClient, name))
        assert is_generator or inspect.iscoroutinefunction(getattr(cairn.AsyncClient, name)), name


def test_every_documented_error_code_has_its_class() -> None:
    from cairn import errors

    for code, cls in errors.ERROR_CLASSES.items():
        assert issubclass(cls, errors.CairnError) and cls.CODE == code
        assert cls.__name__ == "".join(part.capitalize() for part in code.split("_"))
    assert errors.ERROR_CLASSES["action_id_conflict"] is errors.ActionIdConflict
    assert errors.ERROR_CLASSES["candidate_held"] is errors.CandidateHeld
