"""The README's examples run as written against a live scheduler."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from harness import Stack

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_ten_line_example_runs(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    example = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    assert len(example.strip().splitlines()) <= 10
    monkeypatch.setenv("CAIRN_SERVER", stack.url)
    monkeypatch.setenv("CAIRN_TOKEN", stack.admin)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(example, str(README), "exec"), {})
    # `make test` has no Makefile to read in the run's scratch directory: the run fails,
    # and the example prints that.
    assert out.getvalue().splitlines()[-1] == "failed 1", out.getvalue()


@pytest.mark.parametrize("document", ["README.md", "docs/CLIENTS.md"])
def test_the_projects_first_python_example_runs_as_written(
    stack: Stack, document: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = README.parents[2] / document
    example = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)[0]
    assert len(example.strip().splitlines()) <= 10
    monkeypatch.setenv("CAIRN_SERVER", stack.url)
    monkeypatch.setenv("CAIRN_TOKEN", stack.admin)
    # Each document's run is a submission of its own: its idempotency key made unique.
    example = example.replace('"nightly-2026-12-06"', f'"example-{document}"')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(example, str(path), "exec"), {})
    # No Makefile in the run's scratch directory: the run fails (make says why on stderr,
    # which the example does not print).
    assert out.getvalue().splitlines() == ["failed"], out.getvalue()
