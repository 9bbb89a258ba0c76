"""The generated files follow the document: `scripts/python-models --check` passes on
the scheduler's document, fails with a diff on a changed one, and the document the live
scheduler serves is the one the files were generated from."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
from harness import BIN_DIR, REPO, Stack

SCRIPT = REPO / "scripts" / "python-models"


def check(document: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CAIRN_BIN_DIR=str(BIN_DIR))
    env.pop("CAIRN_OPENAPI_DOCUMENT", None)
    if document is not None:
        env["CAIRN_OPENAPI_DOCUMENT"] = str(document)
    return subprocess.run([str(SCRIPT), "--check"], env=env, capture_output=True, text=True, timeout=120)


def printed_document() -> dict[str, object]:
    out = subprocess.run([str(BIN_DIR / "cairn-scheduler"), "--print-openapi"], capture_output=True, check=True)
    document: dict[str, object] = json.loads(out.stdout)
    return document


def test_the_committed_files_match_the_document() -> None:
    result = check()
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_changed_document_fails_the_check_with_a_diff(tmp_path: Path) -> None:
    document = printed_document()
    codes = document["x-error-codes"]
    assert isinstance(codes, dict)
    codes["brand_new_code"] = {"status": 409, "description": "A code this client was not generated with."}
    changed = tmp_path / "openapi.json"
    changed.write_text(json.dumps(document))
    result = check(changed)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "+class BrandNewCode(CairnError):" in result.stdout
    assert "differ from what the document generates" in result.stderr


def test_the_served_document_is_the_printed_one(stack: Stack) -> None:
    served = httpx.get(f"{stack.url}/api/v1/openapi.json").json()
    assert served == printed_document()
