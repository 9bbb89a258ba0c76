#!/usr/bin/env python3
"""Runs what the chart renders, as local processes, and checks what an install promises.

Usage: run_rendered.py HELM CHART BIN_DIR VALUES_FILE

There is no Kubernetes cluster here, so this plays the kubelet's part: it renders the
chart with VALUES_FILE (helm template), then starts every rendered container of Cairn's
own image -- the migration hook first, then each Deployment's replicas -- with the
rendered command, arguments, environment (env, envFrom, secretKeyRef, configMapKeyRef,
fieldRef, $(VAR) expansion) and mounted Secrets and ConfigMaps, against the local
PostgreSQL, Redis and RabbitMQ and a local S3-compatible store (moto's server). What a pod
has and a local process has not is stood for, and only that:
  - each pod's own IP: every listening port becomes a free local port;
  - volumes: each pod's mounts become directories of its own;
  - Services: the bundled object store's Service is the local S3 store (the SeaweedFS
    container itself is not run here: no container engine);
  - the operator's Secrets: the connection URLs, the bootstrap token and, for an
    external object store, its credentials point at the local services;
  - the binary named by the container's args is BIN_DIR's.
Beside the values file, only the connection values (when the chart makes the Secret),
and the queue and key prefixes are set, as an operator sharing these services would.
Then it checks: a run completes with its steps isolated; its logs are readable after
its worker's pod is gone (SIGKILL, and its emptyDir volumes deleted, as with a lost
node), through another scheduler replica; a
reviewed checkpoint continuation runs on another worker from a checkpoint the dead one
took; the reaper's sweep, told to reclaim at once, reclaims through the shared store and
leaves nothing waiting for an operator's repair; and a worker whose pod cannot isolate
(no bubblewrap) stays unready, saying why, and runs nothing.

The last line reads "run_rendered: N passed, M failed".
"""

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import yaml

TOKEN = "render-and-run-" + uuid.uuid4().hex
NAMESPACE = "cairn"
RELEASE = "cairn"
PASSED, FAILED = [], []


def check(name, ok, detail=""):
    (PASSED if ok else FAILED).append(name)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f"\n     {detail}"), flush=True)
    return ok


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, token=None, timeout=10):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


def wait_for(what, predicate, timeout=120, every=0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


class Store:
    """The local S3-compatible store: moto's server, with the buckets asked for."""

    def __init__(self, work):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        log = open(os.path.join(work, "s3.log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log, stderr=subprocess.STDOUT)
        wait_for("the S3 store", lambda: http("GET", self.endpoint + "/")[0] == 200, 60)

    def bucket(self, name):
        status, body = http("PUT", f"{self.endpoint}/{name}")
        assert status in (200, 409), (status, body)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def render(helm, chart, values_file, sets):
    args = [helm, "template", RELEASE, chart, "--namespace", NAMESPACE, "-f", values_file]
    for key, value in sets.items():
        args += ["--set-string", f"{key}={value}"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


class Install:
    """The rendered objects, and the Secrets an operator would have made beside them."""

    def __init__(self, docs, store, local):
        self.docs = docs
        self.store = store
        self.local = local  # the connection values, by secrets.keys name
        self.configmaps = {d["metadata"]["name"]: d.get("data") or {}
                           for d in docs if d["kind"] == "ConfigMap"}
        self.secrets = {}
        for d in docs:
            if d["kind"] == "Secret":
                data = {k: base64.b64decode(v).decode() for k, v in (d.get("data") or {}).items()}
                data.update(d.get("stringData") or {})
                self.secrets[d["metadata"]["name"]] = data
        self.services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
        # "http://<service>:<port>" as a local process reaches it, once its pods run.
        self.routes = {}

    def route(self, pods):
        """Points each Service of a component at the first of its running pods."""
        for name, service in self.services.items():
            component = service["metadata"]["labels"].get("app.kubernetes.io/component")
            if component not in pods or service["spec"].get("clusterIP") == "None":
                continue
            for port in service["spec"]["ports"]:
                target = pods[component][0].ports[port["targetPort"]][1]
                self.routes[f"http://{name}:{port['port']}"] = f"http://127.0.0.1:{target}"

    def secret(self, name):
        """A rendered Secret, or one the values name as existing: the connection Secret
        holds the local URLs and token, an object store's holds credentials for the local
        store. Any other name is a Secret no one would have made: the pod could not start."""
        if name in self.secrets:
            return self.secrets[name]
        if name == self.local["existingSecret"]:
            return self.local["connection"]
        if name in self.local["ownSecrets"]:
            return self.local["ownSecrets"][name]
        if name in self.local["storeSecrets"]:
            return {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local-secret",
                    "AWS_ENDPOINT": self.store.endpoint, "AWS_ALLOW_HTTP": "true",
                    "AWS_REGION": "us-east-1"}
        raise LookupError(f"the Secret {name!r} is neither rendered nor named in the values")

    def workloads(self, kind):
        return [d for d in self.docs if d["kind"] == kind]


class Pod:
    """One replica of a rendered pod template, run as local processes."""

    def __init__(self, install, name, template, work, bin_dir, overrides=None):
        self.install, self.name, self.bin_dir = install, name, bin_dir
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        spec = template["spec"]
        self.container = spec["containers"][0]
        self.volumes = {v["name"]: v for v in spec.get("volumes") or []}
        self.ports = {p["name"]: (p["containerPort"], free_port())
                      for p in self.container.get("ports") or []}
        self.mounts = self.mount()
        self.env = self.environment(overrides or {})
        self.proc = None

    def mount(self):
        mounts = {}
        for m in self.container.get("volumeMounts") or []:
            local = os.path.join(self.dir, "volumes", m["name"])
            os.makedirs(local, exist_ok=True)
            volume = self.volumes.get(m["name"], {})
            sources = []
            if "projected" in volume:
                sources = volume["projected"]["sources"]
            elif "secret" in volume or "configMap" in volume:
                sources = [volume]
            for source in sources:
                if "secret" in source:
                    ref = source["secret"]
                    data = self.install.secret(ref.get("secretName") or ref["name"])
                else:
                    ref = source["configMap"]
                    data = self.install.configmaps.get(ref["name"], {})
                items = ref.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] not in data:
                        assert ref.get("optional"), f"{self.name}: no key {item['key']}"
                        continue
                    with open(os.path.join(local, item["path"]), "w") as f:
                        f.write(data[item["key"]])
            mounts[m["mountPath"]] = local
        return mounts

    def localize(self, value):
        # Longest mount paths first, so /var/lib/cairn/artifacts is not read as /var/lib/cairn.
        for path in sorted(self.mounts, key=len, reverse=True):
            if value == path or value.startswith(path + "/"):
                return self.mounts[path] + value[len(path):]
        for container_port, local_port in self.ports.values():
            value = re.sub(rf"^(?:0\.0\.0\.0|127\.0\.0\.1):{container_port}$",
                           f"127.0.0.1:{local_port}", value)
            value = value.replace(f"//127.0.0.1:{container_port}", f"//127.0.0.1:{local_port}")
        for name, service in self.install.services.items():
            for port in service["spec"]["ports"]:
                prefix = f"http://{name}:{port['port']}"
                if value.startswith(prefix) and "object-store" in name:
                    value = self.install.store.endpoint + value[len(prefix):]
        for prefix, local in self.install.routes.items():
            if value.startswith(prefix):
                value = local + value[len(prefix):]
        return value

    def environment(self, overrides):
        env = {}
        for source in self.container.get("envFrom") or []:
            if "configMapRef" in source:
                env.update(self.install.configmaps[source["configMapRef"]["name"]])
            if "secretRef" in source:
                data = self.install.secret(source["secretRef"]["name"])
                env.update({k: v for k, v in data.items() if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)})
        fields = {"status.podIP": "127.0.0.1", "spec.nodeName": f"node-{self.name}",
                  "metadata.name": self.name, "metadata.namespace": NAMESPACE}
        for e in self.container.get("env") or []:
            if "value" in e:
                value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                               lambda m: env.get(m.group(1), m.group(0)), str(e["value"]))
            else:
                source = e["valueFrom"]
                if "secretKeyRef" in source:
                    ref = source["secretKeyRef"]
                    value = self.install.secret(ref["name"]).get(ref["key"])
                    # As the kubelet: a missing key of a required reference stops the pod.
                    assert value is not None or ref.get("optional"), \
                        f"{self.name}: no key {ref['key']} in the Secret {ref['name']}"
                elif "configMapKeyRef" in source:
                    ref = source["configMapKeyRef"]
                    value = self.install.configmaps[ref["name"]].get(ref["key"])
                else:
                    value = fields[source["fieldRef"]["fieldPath"]]
                if value is None:
                    continue
            env[e["name"]] = value
        env = {k: self.localize(v) for k, v in env.items()}
        # The image's PATH has the binaries in it. Set after the mounts are localized: a
        # host directory may lie under a path the pod mounts (/tmp).
        env["PATH"] = f"{self.bin_dir}:{os.environ['PATH']}"
        env.update(overrides)
        return env

    def start(self):
        argv = (self.container.get("command") or []) + (self.container.get("args") or [])
        argv = [os.path.join(self.bin_dir, argv[0])] + argv[1:]
        self.log = os.path.join(self.dir, "log")
        self.proc = subprocess.Popen(argv, env=self.env, cwd=self.dir,
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        return self

    def url(self, port_name):
        return f"http://127.0.0.1:{self.ports[port_name][1]}"

    def probe(self, kind="readinessProbe"):
        get = self.container[kind]["httpGet"]
        status, body = http("GET", self.url(get["port"]) + get["path"])
        return status, body

    def ready(self):
        assert self.proc.poll() is None, f"{self.name} exited:\n{self.tail()}"
        return self.probe()[0] == 200

    def tail(self, n=4000):
        try:
            return open(self.log, "rb").read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def kill(self, sig=signal.SIGKILL):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(60)

    def delete(self):
        """The pod is gone, as with a lost node: its processes, and with them the
        volumes that live and die with a pod (emptyDir, generic ephemeral)."""
        self.kill()
        for mount in self.container.get("volumeMounts") or []:
            volume = self.volumes.get(mount["name"], {})
            if "emptyDir" in volume or "ephemeral" in volume:
                shutil.rmtree(self.mounts[mount["mountPath"]], ignore_errors=True)


def scenario(install, pods, bin_dir):
    """The promised behaviour, on the running install."""
    schedulers, workers, reapers = pods["scheduler"], pods["worker"], pods["reaper"]
    call = lambda method, path, body=None, at=0: http(
        method, schedulers[at % len(schedulers)].url("http") + path, body, TOKEN)

    def run_view(run_id, at=0):
        status, body = call("GET", f"/api/v1/runs/{run_id}", at=at)
        return json.loads(body) if status == 200 else {}

    def wait_state(run_id, states, timeout=180):
        return wait_for(f"run {run_id} in {states}",
                        lambda: (lambda v: v if v.get("state") in states else None)(run_view(run_id)),
                        timeout)

    def journal(run_id):
        return {s["step_key"]: s for s in json.loads(call("GET", f"/api/v1/runs/{run_id}/journal")[1])["steps"]}

    # A run of two steps: the first leaves a file in the workspace, the second reads it.
    spec = {"agent": "render-and-run", "max_attempts": 1,
            "budgets": {"max_commands": 20, "max_wall_seconds": 3600},
            "steps": [
                {"key": "write", "argv": ["sh", "-c", "echo from-the-first-worker > marker; echo wrote"]},
                {"key": "read", "argv": ["sh", "-c", "sleep 8; cat marker"], "idempotent": True},
            ]}
    status, body = call("POST", "/api/v1/runs", spec)
    if not check("a run is admitted through the rendered scheduler", status == 201, body):
        return
    admitted = json.loads(body)
    run_id, request_id = admitted["run_id"], admitted["request_id"]
    wait_for("the second step to start", lambda: "read" in journal(run_id), 120)
    first = journal(run_id)["write"]
    holder = next((p for p in workers if first["worker"] and first["worker"].endswith(f"-{p.proc.pid}")), None)
    check("the first step ran isolated on a rendered worker",
          holder is not None and first.get("sandbox", {}).get("isolated") is True, json.dumps(first))
    if holder is None:
        return
    holder.delete()
    status, out = call("GET", f"/api/v1/runs/{run_id}/steps/write/output?stream=stdout", at=1)
    check("its logs are read after its worker is gone, through another scheduler replica",
          status == 200 and out == b"wrote\n", f"{status} {out[:300]!r}")
    stopped = wait_state(run_id, ["stopped_at_checkpoint", "failed", "needs_reconciliation"], 240)
    check("the run stops at its checkpoint once its worker is gone",
          stopped.get("state") == "stopped_at_checkpoint", json.dumps(stopped))
    call("PUT", "/api/v1/invalid-read-continuity/policy",
         {"enabled": True, "allow_checkpoint_continuation": True})
    base = f"/api/v1/runs/{run_id}/checkpoint-continuations/requests/{request_id}"
    candidate = json.loads(call("GET", f"{base}/candidate")[1])
    body = {"version": 1, "candidate_digest": candidate.get("candidate_digest"), "valid_for_seconds": 300,
            "acknowledge_retained_response_consumed_once": True,
            "acknowledge_no_completed_effect_replay": True,
            "acknowledge_same_request_attempt_and_budgets": True,
            "acknowledge_finite_ownership_lease": True}
    status, receipt = call("POST", f"{base}/actions/{uuid.uuid4().hex}", body)
    check("a reviewed continuation is admitted", status == 201, receipt)
    done = wait_state(run_id, ["completed", "failed", "needs_reconciliation", "stopped_at_checkpoint"], 180)
    steps = journal(run_id)
    read = steps.get("read", {})
    moved = read.get("worker") and not read["worker"].endswith(f"-{holder.proc.pid}")
    check("the continuation ran on another worker, from the dead worker's checkpoint",
          done.get("state") == "completed" and moved
          and (read.get("stdout_tail") or "").strip() == "from-the-first-worker"
          and steps["write"]["intent_epoch"] == first["intent_epoch"],
          json.dumps({"run": done, "read": read}))

    # The reaper, as rendered, told to reclaim at once: one sweep, once the rendered
    # replicas (which would lead) are stopped.
    for reaper in reapers:
        reaper.kill(signal.SIGTERM)
    reaper = reapers[0]
    env = dict(reaper.env, CAIRN_RECLAIM_AFTER_SECONDS="0", CAIRN_IDLE_HEAD_SECONDS="1",
               CAIRN_METRICS_LISTEN=f"127.0.0.1:{free_port()}")
    swept = subprocess.run([os.path.join(bin_dir, "cairn-reaper"), "--once"], env=env,
                           cwd=reaper.dir, capture_output=True, text=True, timeout=120)
    status, body = call("GET", "/api/v1/reaper")
    view = json.loads(body) if status == 200 else {}
    summary = (view.get("sweeps") or [{}])[0].get("summary") or {}
    check("the reaper reclaims through the shared store and leaves nothing to repair",
          swept.returncode == 0 and view.get("pending_repairs") == []
          and summary.get("snapshots_reclaimed", 0) > 0 and summary.get("outputs_reclaimed", 0) > 0
          and summary.get("reclaim_failed") == 0 and summary.get("outputs_failed") == 0,
          f"exit {swept.returncode} {swept.stderr[-1500:]} {body[:1500]!r}")


def cannot_isolate(install, pods, template, work, bin_dir):
    """A worker of the rendered template whose pod cannot give steps the sandbox, alone:
    the other workers are stopped first, so a run it took would show."""
    for worker in pods["worker"]:
        worker.kill(signal.SIGTERM)
    pod = Pod(install, "worker-no-sandbox", template, work, bin_dir,
              {"CAIRN_SANDBOX_BWRAP": "/nonexistent/bwrap"})
    check("the rendered worker requires the sandbox", pod.env.get("CAIRN_SANDBOX") == "required",
          pod.env.get("CAIRN_SANDBOX"))
    pod.start()
    api = pods["scheduler"][0].url("http")
    try:
        wait_for("its readiness answer", lambda: pod.probe()[0] != 0, 120)
        spec = {"agent": "render-and-run", "max_attempts": 1,
                "budgets": {"max_commands": 5, "max_wall_seconds": 600},
                "steps": [{"key": "never", "argv": ["true"]}]}
        status, body = http("POST", api + "/api/v1/runs", spec, TOKEN)
        run_id = json.loads(body)["run_id"] if status == 201 else ""
        time.sleep(4)
        status, body = pod.probe()
        live, _ = pod.probe("livenessProbe")
        reason = json.loads(body or b"{}").get("checks", {}).get("work", {}).get("reason", "")
        view = json.loads(http("GET", f"{api}/api/v1/runs/{run_id}", None, TOKEN)[1] or b"{}")
        check("a worker that cannot isolate stays up (live), unready, says why, and runs nothing",
              pod.proc.poll() is None and live == 200 and status == 503 and "bwrap" in reason
              and view.get("state") == "queued",
              f"live {live}, ready {status} {body[:400]!r}, run {view.get('state')}\n{pod.tail()}")
    finally:
        pod.kill(signal.SIGTERM)


def main(argv):
    if len(argv) != 5:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    helm, chart, bin_dir, values_file = argv[1:]
    values = yaml.safe_load(open(values_file)) or {}
    work = tempfile.mkdtemp(prefix="cairn-render-run-")
    database = "cairn_render_run_" + uuid.uuid4().hex[:12]
    prefix = f"rr{uuid.uuid4().hex[:8]}."
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"CREATE DATABASE {database}"], check=True)
    store = Store(work)
    pods = {}
    try:
        secrets_values = values.get("secrets") or {}
        existing = secrets_values.get("existingSecret") or ""
        keys = {"databaseUrl": "CAIRN_DATABASE_URL", "redisUrl": "CAIRN_REDIS_URL",
                "amqpUrl": "CAIRN_AMQP_URL", "bootstrapAdminToken": "CAIRN_BOOTSTRAP_ADMIN_TOKEN"}
        keys.update(secrets_values.get("keys") or {})
        urls = {"databaseUrl": f"postgres://postgres@127.0.0.1:5432/{database}",
                "redisUrl": "redis://127.0.0.1:6379/0",
                "amqpUrl": "amqp://guest:guest@127.0.0.1:5672/%2f",
                "bootstrapAdminToken": TOKEN}
        # Values an operator sharing these services would set too: names of its own.
        sets = {"global.queuePrefix": prefix, "global.redisPrefix": prefix}
        if not existing:
            sets.update({f"secrets.{k}": v for k, v in urls.items()})
        docs = render(helm, chart, values_file, sets)
        store_secrets = {((values.get("worker") or {}).get("snapshotStore") or {}).get("existingSecret"),
                         (((values.get("objectStore") or {}).get("bundled")) or {}).get("existingSecret")} - {None, ""}
        # Secrets of the operator's own that extraEnv entries read (a git token, say).
        own_secrets = {}
        for component in ("scheduler", "worker", "reaper"):
            for entry in (values.get(component) or {}).get("extraEnv") or []:
                ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    own_secrets.setdefault(ref["name"], {})[ref["key"]] = f"local-{ref['key']}"
        install = Install(docs, store, {"existingSecret": existing, "storeSecrets": store_secrets,
                                        "ownSecrets": own_secrets,
                                        "connection": {keys[k]: v for k, v in urls.items()}})
        for d in docs:
            url = (install.configmaps.get(d["metadata"]["name"]) or {}).get("CAIRN_SNAPSHOT_STORE_URL", "")
            if d["kind"] == "ConfigMap" and url.startswith("s3://"):
                store.bucket(url[len("s3://"):].split("/")[0])
        check("the default store is shared by every pod",
              any(url.startswith("s3://") for url in
                  (c.get("CAIRN_SNAPSHOT_STORE_URL", "") for c in install.configmaps.values())))
        jobs = install.workloads("Job")
        check("one migration hook is rendered", len(jobs) == 1, [j["metadata"]["name"] for j in jobs])
        if install.workloads("StatefulSet"):
            print("NOTE the bundled store's own container (SeaweedFS) is not run here: "
                  "moto's S3 server stands for it", flush=True)
        for job in jobs:
            pod = Pod(install, job["metadata"]["name"], job["spec"]["template"], work, bin_dir).start()
            code = pod.proc.wait(300)
            check(f"the migration hook {job['metadata']['name']} succeeds", code == 0, pod.tail())
        for deployment in install.workloads("Deployment"):
            component = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
            # With KEDA the chart leaves the replicas to it: two stand for its choice.
            replicas = deployment["spec"].get("replicas", 2)
            pods[component] = [
                Pod(install, f"{deployment['metadata']['name']}-{i}", deployment["spec"]["template"],
                    work, bin_dir).start() for i in range(replicas)]
        for component, replicas in pods.items():
            for pod in replicas:
                wait_for(f"{pod.name} to be ready", pod.ready, 180)
        check("every rendered pod is ready", True)
        install.route(pods)
        tests = [d for d in install.workloads("Pod")
                 if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
        check("one helm test Pod is rendered", len(tests) == 1, len(tests))
        for test in tests:
            pod = Pod(install, test["metadata"]["name"], test, work, bin_dir).start()
            code = pod.proc.wait(300)
            check(f"helm test: {test['metadata']['name']} passes", code == 0, pod.tail())
        scenario(install, pods, bin_dir)
        worker = next(d for d in install.workloads("Deployment")
                      if d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker")
        cannot_isolate(install, pods, worker["spec"]["template"], work, bin_dir)
    except Exception as e:  # a failure to start is a failed check, with the logs
        logs = "\n".join(f"--- {p.name}\n{p.tail(2000)}" for ps in pods.values() for p in ps)
        check("the install runs", False, f"{type(e).__name__}: {e}\n{logs}")
    finally:
        for replicas in pods.values():
            for pod in replicas:
                pod.kill(signal.SIGTERM)
        store.stop()
        # This install's RabbitMQ queues (its exchanges hold nothing and are left).
        listed = subprocess.run(["rabbitmqctl", "-q", "list_queues", "name"],
                                capture_output=True, text=True, check=False).stdout
        for name in listed.split():
            if name.startswith(prefix):
                subprocess.run(["rabbitmqctl", "-q", "delete_queue", name],
                               capture_output=True, check=False)
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc",
                        f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"], check=False)
        shutil.rmtree(work, ignore_errors=True)
    print(f"run_rendered: {len(PASSED)} passed, {len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
