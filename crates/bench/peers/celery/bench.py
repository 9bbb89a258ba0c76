"""Celery peer benchmark: burst throughput of at-least-once jobs that each commit one
row on PostgreSQL, with RabbitMQ as the broker.

This file is both the Celery app module (imported by the worker as `bench`) and the
driver (run as a script). The driver hands the worker its settings through the
environment variables below.

Run through `run` beside this file, which installs the pinned Celery and psycopg.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

import psycopg
from celery import Celery
from kombu import Queue

DB_NAME = "cairn_peer_celery"
QUEUE = os.environ.get("CAIRN_PEER_CELERY_QUEUE", "cairn-peer-celery")
DSN = os.environ.get("CAIRN_PEER_CELERY_DSN", "")
# What each job starts before its insert: nothing, `/bin/true`, or `/bin/true` in bubblewrap.
PROCESS = os.environ.get("CAIRN_PEER_CELERY_PROCESS", "none")
# A fresh namespace of each kind (the network's empty), the host's root read-only: what a
# job queue that isolated its jobs would do, and no more than Cairn does for a step.
BWRAP = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all", "--ro-bind", "/", "/",
         "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]

app = Celery("bench", broker=os.environ.get("CAIRN_PEER_CELERY_AMQP"))
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={"confirm_publish": True},
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    result_backend=None,
    task_serializer="json",
    accept_content=["json"],
    task_queues=[Queue(QUEUE, durable=True)],  # with a direct exchange of the same name
    task_default_queue=QUEUE,
)

_conn = None  # one connection per worker process, opened after the fork


@app.task(name="effect")
def effect(job_id):
    global _conn
    if _conn is None:
        _conn = psycopg.connect(DSN)
    if PROCESS != "none":
        argv = (BWRAP if PROCESS == "bwrap" else []) + ["/bin/true"]
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
    _conn.execute("INSERT INTO effects (id) VALUES (%s) ON CONFLICT DO NOTHING", (job_id,))
    _conn.commit()


def log(msg):
    print(f"celery peer: {msg}", file=sys.stderr, flush=True)


class Failure(Exception):
    pass


def start_worker(concurrency, hostname):
    cmd = [
        sys.executable, "-m", "celery", "-A", "bench", "--quiet", "worker",
        "--pool", "prefork", "--concurrency", str(concurrency), "-Q", QUEUE,
        "--loglevel", "warning", "-n", hostname, "--without-gossip", "--without-mingle",
    ]
    # Quiet: no banner, and no warning about running as root (the bench machine's user).
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    # Own session, so a stray prefork child can be killed with the whole group.
    return subprocess.Popen(
        cmd, cwd=os.path.dirname(os.path.abspath(__file__)),
        stdout=sys.stderr, start_new_session=True, env=env,
    )


def wait_ready(worker, hostname, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise Failure(f"worker exited with status {worker.returncode} while starting")
        if app.control.ping(destination=[hostname], timeout=0.5):
            return
    raise Failure(f"worker did not answer a ping within {timeout} s")


def stop_worker(worker):
    if worker.poll() is None:
        worker.terminate()  # warm shutdown: running tasks finish
        try:
            worker.wait(10)
        except subprocess.TimeoutExpired:
            log("worker still running 10 s after SIGTERM, killing it")
    try:
        os.killpg(worker.pid, signal.SIGKILL)  # the main process and any leftover children
    except ProcessLookupError:
        pass
    worker.wait()


def run(args, admin):
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {DB_NAME}")
    db = psycopg.connect(DSN, autocommit=True)
    db.execute("CREATE TABLE effects (id bigint PRIMARY KEY, done_at timestamptz DEFAULT now())")
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=3)
    except Exception as e:
        raise Failure(f"cannot connect to RabbitMQ at {args.amqp}: {e}") from e

    hostname = f"{QUEUE}@%h"
    worker = start_worker(args.concurrency, hostname)
    try:
        wait_ready(worker, hostname.replace("%h", os.uname().nodename))
        log(f"worker ready, publishing {args.jobs} jobs to queue {QUEUE}")

        # Start time on the database clock, the clock that stamps done_at.
        t0 = db.execute("SELECT clock_timestamp()").fetchone()[0]
        with app.producer_or_acquire() as producer:
            for i in range(args.jobs):
                effect.apply_async((i,), queue=QUEUE, producer=producer)
        log(f"published in {(db.execute('SELECT clock_timestamp()').fetchone()[0] - t0).total_seconds():.2f} s")

        deadline = time.monotonic() + 600
        while True:
            # Marked: cairn-bench leaves its own statements out of a system's count.
            done = db.execute("SELECT count(*) /* cairn-bench */ FROM effects").fetchone()[0]
            if done >= args.jobs:
                break
            if worker.poll() is not None:
                raise Failure(f"worker exited with status {worker.returncode} after {done} jobs")
            if time.monotonic() > deadline:
                raise Failure(f"only {done} of {args.jobs} jobs done after 600 s")
            time.sleep(0.02)
        t1 = db.execute("SELECT max(done_at) FROM effects").fetchone()[0]
    finally:
        stop_worker(worker)
        db.close()
    return (t1 - t0).total_seconds()


def cleanup(admin, keep_database):
    try:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(QUEUE)
            conn.default_channel.exchange_delete(QUEUE)
    except Exception as e:
        log(f"could not delete queue and exchange {QUEUE}: {e}")
    if keep_database:
        return
    try:
        admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    except Exception as e:
        log(f"could not drop database {DB_NAME}: {e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/%2f")
    p.add_argument("--process", choices=["none", "plain", "bwrap"], default="none",
                   help="what each job starts before its insert: nothing, /bin/true, "
                        "or /bin/true in bubblewrap")
    p.add_argument("--keep-database", action="store_true",
                   help=f"leave {DB_NAME} after a run that succeeded, for the caller to "
                        "read its statistics and drop it")
    args = p.parse_args()
    if args.jobs < 1 or args.concurrency < 1:
        p.error("--jobs and --concurrency must be positive")

    # The worker imports this module afresh: it reads these from the environment.
    global QUEUE, DSN, PROCESS
    QUEUE = f"cairn-peer-celery-{os.getpid()}"
    DSN = psycopg.conninfo.make_conninfo(args.postgres, dbname=DB_NAME)
    PROCESS = args.process
    os.environ.update(CAIRN_PEER_CELERY_QUEUE=QUEUE, CAIRN_PEER_CELERY_DSN=DSN,
                      CAIRN_PEER_CELERY_AMQP=args.amqp, CAIRN_PEER_CELERY_PROCESS=PROCESS)
    app.conf.broker_url = args.amqp
    app.conf.task_queues = [Queue(QUEUE, durable=True)]
    app.conf.task_default_queue = QUEUE

    # SIGTERM unwinds like Ctrl-C, so the worker, queue and database are cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        admin = psycopg.connect(args.postgres, autocommit=True, connect_timeout=10)
    except Exception as e:
        log(f"error: cannot connect to PostgreSQL at {args.postgres}: {e}")
        return 1
    succeeded = False
    try:
        secs = run(args, admin)
        succeeded = True
    except Exception as e:
        log(f"error: {e}")
        return 1
    finally:
        cleanup(admin, args.keep_database and succeeded)
        admin.close()

    started = {"none": "", "plain": "/bin/true and ", "bwrap": "/bin/true in bubblewrap and "}
    print(f"PEER celery (RabbitMQ, acks_late, publisher confirms, {args.concurrency} prefork "
          f"workers, {started[args.process]}a PostgreSQL insert per job): {args.jobs} jobs in "
          f"{secs:.2f} s: {round(args.jobs / secs)} jobs/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
