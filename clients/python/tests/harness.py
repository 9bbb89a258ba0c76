"""Live Cairn for the tests: a scheduler and workers started from the built binaries on
the local PostgreSQL, Redis and RabbitMQ, each stack with its own database, queue prefix
and Redis key prefix, removed when it closes. Also the sockets the tests put between the
client and a server: one that records connections and never answers, and a proxy that
lets the scheduler answer and drops that answer."""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

import httpx
import pika

REPO = Path(__file__).resolve().parents[3]
BIN_DIR = Path(os.environ.get("CAIRN_BIN_DIR", REPO / "target" / "debug"))
POSTGRES = os.environ.get("CAIRN_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432")
REDIS = os.environ.get("CAIRN_REDIS_URL", "redis://127.0.0.1:6379")
AMQP = os.environ.get("CAIRN_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")

# Port reservations held for the whole test process: the Rust harness
# (tests/src/lib.rs, free_addr) locks a file named after each port it hands out, so
# concurrent test suites on this machine never start two servers on one port.
_PORT_LOCKS: list[IO[bytes]] = []


def free_port() -> int:
    directory = Path(tempfile.gettempdir()) / "cairn-test-ports"
    directory.mkdir(parents=True, exist_ok=True)
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        lock = open(directory / str(port), "ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        _PORT_LOCKS.append(lock)
        return port


def binary(name: str) -> Path:
    path = BIN_DIR / name
    # The binaries may be rebuilt while the tests start: wait a little for one that is
    # momentarily missing.
    for _ in range(60):
        if path.exists():
            return path
        time.sleep(1)
    raise RuntimeError(f"{path} is missing: build the binaries first (cargo build --workspace --bins)")


class Process:
    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._out = open(log, "wb")
        self.popen = subprocess.Popen(
            args, env=env, stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL: the process and anything left in its session."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            if self.wait_exit(5) is None:
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(10)
        self._out.close()

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


class Stack:
    """A scheduler and its workers on their own database, queue prefix and Redis
    prefix, with an admin token."""

    def __init__(self, label: str) -> None:
        stamp = secrets.token_hex(6)
        self.database = f"cairn_py_{label}_{stamp}"
        self.prefix = f"py-{label}-{stamp}."
        self.admin = f"py-{label}-admin-{stamp}"
        self.dir = Path(tempfile.mkdtemp(prefix=f"cairn-py-{label}-"))
        (self.dir / "shared").mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.scheduler: Process | None = None
        self.workers: dict[str, Process] = {}

    def _env(self) -> dict[str, str]:
        # Nothing of the caller's Cairn settings leaks in (a CAIRN_TOKEN, say).
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_") and k != "RUST_LOG"}
        env.update(
            CAIRN_DATABASE_URL=f"{POSTGRES}/{self.database}",
            CAIRN_REDIS_URL=REDIS,
            CAIRN_REDIS_PREFIX=self.prefix,
            CAIRN_AMQP_URL=AMQP,
            CAIRN_QUEUE_PREFIX=self.prefix,
            CAIRN_LOG_FORMAT="json",
            RUST_LOG="warn",
        )
        return env

    def start_scheduler(self) -> None:
        env = self._env()
        env.update(
            CAIRN_LISTEN=f"127.0.0.1:{self.port}",
            CAIRN_BOOTSTRAP_ADMIN_TOKEN=self.admin,
            CAIRN_SWEEP_INTERVAL_SECONDS="0.3",
            CAIRN_WORKSPACES_DIR=str(self.dir / "workspaces"),
        )
        self.scheduler = Process("scheduler", [str(binary("cairn-scheduler"))], env, self.dir / "scheduler.log")
        self._wait_ready(self.scheduler, f"{self.url}/readyz")

    def start_worker(self, name: str, faults: str | None = None) -> Process:
        """A worker; one armed with fault points is not waited for (it may reach its
        point and kill itself first)."""
        metrics = free_port()
        env = self._env()
        env.update(
            CAIRN_WORKER_ID=name,
            CAIRN_METRICS_LISTEN=f"127.0.0.1:{metrics}",
            CAIRN_LEASE_TTL_SECONDS="2",
            CAIRN_DRAIN_SECONDS="3",
            CAIRN_KILL_GRACE_SECONDS="1",
            CAIRN_WORKSPACES_DIR=str(self.dir / f"workspaces-{name}"),
            CAIRN_ARTIFACTS_URL=str(self.dir / "artifacts"),
            CAIRN_WORKER_CONCURRENCY="4",
            # Workers share one artifacts directory, so each continues the others' runs.
            CAIRN_SNAPSHOTS_SHARED="true",
            CAIRN_SANDBOX_READ_WRITE=str(self.dir / "shared"),
        )
        if faults:
            env["CAIRN_FAULT_POINTS"] = faults
        worker = Process(f"worker {name}", [str(binary("cairn-worker"))], env, self.dir / f"worker-{name}.log")
        self.workers[name] = worker
        if not faults:
            self._wait_ready(worker, f"http://127.0.0.1:{metrics}/readyz")
        return worker

    def _wait_ready(self, process: Process, url: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not process.alive():
                raise RuntimeError(f"{process.name} exited before it was ready:\n{process.tail()}")
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{process.name} was not ready within {timeout} s:\n{process.tail()}")

    def logs(self) -> str:
        parts = []
        for process in [self.scheduler, *self.workers.values()]:
            if process is not None:
                parts.append(f"--- {process.name} ---\n{process.tail()}")
        return "\n".join(parts)

    def close(self) -> None:
        """Stops every process, then drops the database, the queues and the Redis keys:
        also after a failed test."""
        for worker in self.workers.values():
            worker.stop()
        if self.scheduler is not None:
            self.scheduler.stop()
        _quiet(
            [
                "psql",
                "-q",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
                f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)',
            ]
        )
        _delete_topology(self.prefix)
        keys = _quiet(["redis-cli", "-u", REDIS, "--scan", "--pattern", f"{self.prefix}*"])
        for key in keys.split():
            _quiet(["redis-cli", "-u", REDIS, "del", key])
        shutil.rmtree(self.dir, ignore_errors=True)


def _delete_topology(prefix: str) -> None:
    """Deletes the queues and exchanges named with `prefix` (rabbitmqctl lists them;
    it cannot delete an exchange, so AMQP does)."""

    def named(kind: str) -> list[str]:
        return [n for n in _quiet(["rabbitmqctl", "-q", kind, "name"]).split() if n.startswith(prefix)]

    queues, exchanges = named("list_queues"), named("list_exchanges")
    if not queues and not exchanges:
        return
    try:
        connection = pika.BlockingConnection(pika.URLParameters(AMQP))
    except pika.exceptions.AMQPError:
        return
    try:
        channel = connection.channel()
        for queue in queues:
            channel.queue_delete(queue)
        for exchange in exchanges:
            channel.exchange_delete(exchange)
    except pika.exceptions.AMQPError:
        pass
    finally:
        connection.close()


def _quiet(args: list[str]) -> str:
    """Runs a cleanup command; a missing tool or a failure leaves only its leftover."""
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


# ---------------------------------------------------------------------------------
# Run specs.


def run_of(*steps: dict[str, Any], agent: str = "py") -> dict[str, Any]:
    return {"agent": agent, "steps": list(steps), "budgets": {"max_commands": 20, "max_wall_seconds": 3600}}


def shell(key: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"key": key, "argv": ["sh", "-c", script], **extra}


def verified_run(agent: str = "py") -> dict[str, Any]:
    """A run that writes its source, then reports that it needs one check
    (tests/src/handoff.rs, verified_run)."""
    report = {
        "outcome": "complete",
        "followup_kind": "verification",
        "verification": {"commands": [{"argv": ["sh", "-c", "test -f src.txt && echo ok"], "purpose": "source_build"}]},
    }
    spec = run_of(
        shell("write", "printf '%s' \"$SOURCE\" > src.txt", env={"SOURCE": "fn main() {}"}),
        shell("report", 'printf \'%s\' "$REPORT" > "$CAIRN_REPORT_FILE"', env={"REPORT": json.dumps(report)}),
        agent=agent,
    )
    spec["max_attempts"] = 3
    return spec


# ---------------------------------------------------------------------------------
# Sockets between the client and a server.


class _Listener:
    """A socket listening on a free local port, handing each connection to `_take` on
    a thread of its own until `close`."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._accepted()
            threading.Thread(target=self._take, args=(conn,), daemon=True).start()

    def _accepted(self) -> None:
        """Called on each connection, before it is handled."""

    def _take(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._server.close()


class Recorder(_Listener):
    """A listening socket that records every connection and what it received, and
    never answers: it closes each connection once the request has arrived (or after
    `hold` seconds of holding it open). With `answer`, it sends those bytes first."""

    def __init__(self, hold: float = 0.0, answer: bytes | None = None) -> None:
        super().__init__()
        self.answer = answer
        self.hold = hold
        self.connections = 0
        self.received: list[bytes] = []
        self._lock = threading.Lock()
        self._thread.start()

    def _accepted(self) -> None:
        with self._lock:
            self.connections += 1

    def _take(self, conn: socket.socket) -> None:
        with conn:
            data = read_request(conn)
            with self._lock:
                self.received.append(data)
            if self.answer is not None:
                conn.sendall(self.answer)
            if self.hold:
                time.sleep(self.hold)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def read_request(conn: socket.socket) -> bytes:
    """One HTTP/1.1 message (head and Content-Length body) from `conn`."""
    data = b""
    conn.settimeout(10)
    try:
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        while len(body) < _content_length(head):
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body
    except OSError:
        return data


class DroppingProxy(_Listener):
    """Forwards each request to `upstream`, lets it answer in full, and closes the
    client's connection instead of passing the answer on: the request was applied and
    its answer lost."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__()
        self.upstream_port = upstream_port
        self.answers: list[bytes] = []
        self._thread.start()

    def _take(self, conn: socket.socket) -> None:
        with conn:
            request = read_request(conn)
            with socket.create_connection(("127.0.0.1", self.upstream_port), timeout=30) as upstream:
                upstream.sendall(request)
                # read_request reads any HTTP/1.1 message: here, the whole answer.
                self.answers.append(read_request(upstream))
            # The connection closes with nothing sent back.
