"""A sandbox's life through the client against a live worker: created, a command run
in it, a file written and read back as bytes, a snapshot, destroyed."""

from __future__ import annotations

import secrets
import time

import pytest
from harness import Stack

import cairn
from cairn import errors, models


def running(client: cairn.Client, sandbox_id: str, stack: Stack) -> models.SandboxView:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view = client.get_sandbox(sandbox_id)
        if view.state == "running" and not view.pending:
            return view
        assert view.state in ("creating", "running"), view
        time.sleep(0.2)
    raise AssertionError(f"sandbox {sandbox_id} never ran\n{stack.logs()}")


def test_a_sandbox_runs_a_command_keeps_files_and_is_destroyed(client: cairn.Client, stack: Stack) -> None:
    key = f"py-sandbox-{secrets.token_hex(6)}"
    created = client.create_sandbox({"agent": "py-sandbox", "timeout_sec": 600}, idempotency_key=key)
    assert client.create_sandbox({"agent": "py-sandbox", "timeout_sec": 600}, idempotency_key=key).sandbox_id == (
        created.sandbox_id
    )
    sandbox_id = created.sandbox_id
    try:
        running(client, sandbox_id, stack)
        done = client.exec_in_sandbox(
            sandbox_id, {"argv": ["sh", "-c", "echo one > a.txt; echo out"], "timeout_sec": 60}
        )
        assert done.state == "done", done
        assert done.result is not None and done.result["exit_code"] == 0 and done.result["stdout"] == "out\n"

        written = client.write_sandbox_file(sandbox_id, "dir/b.bin", b"bytes\x00\xff")
        assert written.state == "done", written
        assert client.read_sandbox_file(sandbox_id, "dir/b.bin") == b"bytes\x00\xff"
        assert client.read_sandbox_file(sandbox_id, "a.txt") == b"one\n"
        listing = client.list_sandbox_files(sandbox_id, ".")
        assert isinstance(listing, dict)
        assert [e["name"] for e in listing["entries"]] == ["a.txt", "dir"], listing
        with pytest.raises(errors.FileError):
            client.read_sandbox_file(sandbox_id, "nothing-here")
        with pytest.raises(cairn.InvalidInput):
            client.exec_in_sandbox(sandbox_id, {"argv": ["true"], "timeout_sec": "60"})

        snapshot = client.create_snapshot(sandbox_id, idempotency_key=f"{key}-snap")
        assert isinstance(snapshot, (models.SnapshotView, models.OperationView))
        assert sandbox_id in [s.sandbox_id for s in client.list_snapshots(sandbox_id=sandbox_id).snapshots]
        kinds = [o.kind for o in client.list_sandbox_operations(sandbox_id).operations]
        assert kinds[:2] == ["exec", "write"], kinds
        assert sandbox_id in [s.sandbox_id for s in client.list_sandboxes(agent="py-sandbox").sandboxes]
    finally:
        destroyed = client.destroy_sandbox(sandbox_id, wait_seconds=30)
    assert destroyed.state == "destroyed", destroyed
    with pytest.raises(errors.InvalidState):
        client.exec_in_sandbox(sandbox_id, {"argv": ["true"]})


def test_labels_filter_the_list_and_pages_follow_the_cursor(client: cairn.Client, stack: Stack) -> None:
    """Labels set at creation come back on the sandbox and filter the list; a label
    filter the scheduler would refuse is refused before anything is sent."""
    team = f"py-{secrets.token_hex(4)}"
    made = []
    try:
        for tier in ("gold", "silver", "gold"):
            spec = {"agent": "py-labels", "timeout_sec": 600, "metadata": {"team": team, "tier": tier}}
            made.append(client.create_sandbox(spec).sandbox_id)
        assert client.get_sandbox(made[0]).metadata == {"team": team, "tier": "gold"}
        gold = client.list_sandboxes(metadata={"team": team, "tier": "gold"})
        assert [s.sandbox_id for s in gold.sandboxes] == [made[2], made[0]]
        paged = [s.sandbox_id for s in client.iter_sandboxes(metadata={"team": team}, page_size=1)]
        assert paged == made[::-1]
        with pytest.raises(cairn.InvalidInput):
            client.list_sandboxes(metadata={"bad key": "x"})
        with pytest.raises(cairn.InvalidInput):
            client.create_sandbox({"agent": "py-labels", "metadata": {"team": 1}})
    finally:
        for sandbox_id in made:
            # A sandbox is destroyed once it runs (`creating` refuses it).
            running(client, sandbox_id, stack)
            client.destroy_sandbox(sandbox_id)


def test_an_execs_output_is_followed_while_it_runs(client: cairn.Client, stack: Stack) -> None:
    """`wait=False` answers with the operation at once; its output arrives as the
    command prints it, then the receipt has its exit."""
    created = client.create_sandbox({"agent": "py-exec", "timeout_sec": 600})
    try:
        running(client, created.sandbox_id, stack)
        spec = {"argv": ["sh", "-c", "echo one; sleep 2; echo two; exit 3"], "timeout_sec": 60}
        started = client.exec_in_sandbox(created.sandbox_id, spec, wait=False)
        assert started.state in ("pending", "running"), started
        chunks = client.follow_exec_output(created.sandbox_id, started.operation_id)
        first = next(iter(chunks))
        assert first.text == "one\n", first
        # The command is still sleeping when its first line arrives.
        assert client.get_sandbox_operation(created.sandbox_id, started.operation_id).state == "running"
        rest = "".join(chunk.text for chunk in chunks)
        assert rest == "two\n", rest
        done = client.get_sandbox_operation(created.sandbox_id, started.operation_id)
        assert done.state == "done" and done.result is not None and done.result["exit_code"] == 3, done
        whole = client.get_operation_output(created.sandbox_id, started.operation_id)
        assert whole == b"one\ntwo\n"
    finally:
        client.destroy_sandbox(created.sandbox_id)


def test_a_template_version_starts_a_sandbox_from_its_snapshot(client: cairn.Client, stack: Stack) -> None:
    source = client.create_sandbox({"agent": "py-template", "timeout_sec": 600})
    made: list[str] = [source.sandbox_id]
    try:
        running(client, source.sandbox_id, stack)
        client.write_sandbox_file(source.sandbox_id, "base.txt", b"from the template\n")
        snapshot = client.create_snapshot(source.sandbox_id, {"name": "py base"})
        assert isinstance(snapshot, models.SnapshotView) and snapshot.status == "ready", snapshot
        name = f"py-{secrets.token_hex(4)}"
        version = client.create_template({"name": name, "source": f"snapshot:{snapshot.snapshot_id}"})
        assert version.version == 1 and version.snapshot_status == "ready", version
        assert [t.template_id for t in client.list_templates(name=name).templates] == [version.template_id]
        with pytest.raises(errors.SnapshotInTemplate):
            client.delete_snapshot(snapshot.snapshot_id)
        started = client.create_sandbox({"agent": "py-template", "timeout_sec": 600, "template_id": version.template_id})
        made.append(started.sandbox_id)
        assert started.template_id == version.template_id
        running(client, started.sandbox_id, stack)
        assert client.read_sandbox_file(started.sandbox_id, "base.txt") == b"from the template\n"
    finally:
        for sandbox_id in made:
            running(client, sandbox_id, stack)
            client.destroy_sandbox(sandbox_id)


def test_a_preview_answers_with_the_sandboxs_own_response(client: cairn.Client, stack: Stack) -> None:
    sandbox_id = client.create_sandbox({"agent": "py-preview", "ports": [8080]}).sandbox_id
    try:
        running(client, sandbox_id, stack)
        client.write_sandbox_file(sandbox_id, "site/hello.txt", b"hello\n")
        script = "cd site && nohup python3 -m http.server 8080 --bind 127.0.0.1 >/dev/null 2>&1 &"
        client.exec_in_sandbox(sandbox_id, {"argv": ["sh", "-c", script], "timeout_sec": 60})
        deadline = time.monotonic() + 10
        while True:
            try:
                answer = client.get_sandbox_preview(sandbox_id, 8080, "/hello.txt")
                break
            except errors.PreviewUnreachable:
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.1)
        assert (answer.status_code, answer.content) == (200, b"hello\n")
        missing = client.get_sandbox_preview(sandbox_id, 8080, "nothing-here")
        assert missing.status_code == 404, "the sandbox's own 404 is an answer, not an error"
        with pytest.raises(errors.PortNotExposed):
            client.get_sandbox_preview(sandbox_id, 9999)
    finally:
        client.destroy_sandbox(sandbox_id)


def test_a_service_is_set_started_and_deleted(client: cairn.Client, stack: Stack) -> None:
    sandbox_id = client.create_sandbox({"agent": "py-service", "ports": [8080]}).sandbox_id
    try:
        running(client, sandbox_id, stack)
        serve = {"argv": ["python3", "-m", "http.server", "8080", "--bind", "127.0.0.1", "--directory", "/workspace"]}
        started = client.set_sandbox_service(sandbox_id, "web", serve)
        assert started.result is not None and started.result["started"] is True, started
        assert client.get_sandbox(sandbox_id).services["web"].argv[0] == "python3"
        ended = client.delete_sandbox_service(sandbox_id, "web")
        assert ended is not None and ended.result is not None and ended.result["started"] is False, ended
        with pytest.raises(errors.NotFound):
            client.delete_sandbox_service(sandbox_id, "web")
        with pytest.raises(cairn.InvalidInput):
            client.set_sandbox_service(sandbox_id, "a b", serve)
    finally:
        client.destroy_sandbox(sandbox_id)


def test_a_volume_keeps_its_files_across_a_stop_and_is_attached_once(client: cairn.Client, stack: Stack) -> None:
    name = f"py-{secrets.token_hex(4)}"
    volume = client.create_volume({"name": name, "size_mb": 16})
    assert (volume.state, volume.attached_to) == ("available", None), volume
    with pytest.raises(errors.VolumeExists):
        client.create_volume({"name": name})
    sandbox_id = client.create_sandbox({"agent": "py-volume", "volumes": [name]}).sandbox_id
    try:
        with pytest.raises(errors.VolumeAttached):
            client.create_sandbox({"agent": "py-volume", "volumes": [name]})
        running(client, sandbox_id, stack)
        client.exec_in_sandbox(sandbox_id, {"argv": ["sh", "-c", f"echo kept > /volumes/{name}/a"], "timeout_sec": 60})
        client.stop_sandbox(sandbox_id, wait_seconds=30)
        client.resume_sandbox(sandbox_id, wait_seconds=30)
        running(client, sandbox_id, stack)
        read = client.exec_in_sandbox(sandbox_id, {"argv": ["cat", f"/volumes/{name}/a"], "timeout_sec": 60})
        assert read.result is not None and read.result["stdout"] == "kept\n", read
        assert client.get_volume(volume.volume_id).attached_to == sandbox_id
        with pytest.raises(errors.VolumeAttached):
            client.delete_volume(volume.volume_id)
    finally:
        client.destroy_sandbox(sandbox_id, wait_seconds=30)
    assert client.delete_volume(volume.volume_id).state in ("deleting", "deleted")


def test_an_exec_takes_input_and_is_killed(client: cairn.Client, stack: Stack) -> None:
    sandbox_id = client.create_sandbox({"agent": "py-input"}).sandbox_id
    try:
        running(client, sandbox_id, stack)
        started = client.exec_in_sandbox(
            sandbox_id, {"argv": ["sh", "-c", "tr a-z A-Z"], "stdin": True, "timeout_sec": 60}, wait=False
        )
        operation_id = started.operation_id
        deadline = time.monotonic() + 30
        while client.get_sandbox_operation(sandbox_id, operation_id).state == "pending":
            assert time.monotonic() < deadline, "the exec never started"
            time.sleep(0.05)
        assert client.send_sandbox_input(sandbox_id, operation_id, b"abc\n").written == 4
        with pytest.raises(errors.NotATerminal):
            client.resize_sandbox_terminal(sandbox_id, operation_id, 30, 100)
        client.send_sandbox_input(sandbox_id, operation_id, b"", eof=True)
        while (done := client.get_sandbox_operation(sandbox_id, operation_id)).state != "done":
            assert time.monotonic() < deadline, "the exec never ended"
            time.sleep(0.05)
        assert done.result is not None and done.result["stdout"] == "ABC\n", done

        sleeper = client.exec_in_sandbox(sandbox_id, {"argv": ["sleep", "300"], "timeout_sec": 600}, wait=False)
        while client.get_sandbox_operation(sandbox_id, sleeper.operation_id).state == "pending":
            time.sleep(0.05)
        with pytest.raises(errors.NoInput):
            client.send_sandbox_input(sandbox_id, sleeper.operation_id, b"x")
        client.kill_sandbox_operation(sandbox_id, sleeper.operation_id)
        while (killed := client.get_sandbox_operation(sandbox_id, sleeper.operation_id)).state != "done":
            time.sleep(0.05)
        assert killed.result is not None and killed.result["killed"] is True, killed
    finally:
        client.destroy_sandbox(sandbox_id)
