#!/usr/bin/env python3
"""Assertions on the manifests the Cairn chart renders.

Run by scripts/helm-check with the environment variable HELM pointing at a helm binary
(default: "helm" on PATH) and KUBE_VERSION (default 1.29.0). Plain asserts, no test
framework: each test_* function is run in order and reported as PASS or FAIL, and the
last line reads "test_rendered: N passed, M failed". The test_* functions of
test_operations.py (scaling, secrets as files, checksums, names, disk, rollouts and the
schema's ordinary options), which use the helpers here, run after these, in the same
count.

The chart fails an install without the connection URLs, so every render starts from
ci/default-values.yaml (the defaults plus those URLs) unless its arguments name a file of
ci/, each of which is a complete value set.
"""

import base64
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback

import yaml

CHART = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CI_DIR = os.path.join(CHART, "ci")
DEFAULT_VALUES = os.path.join(CI_DIR, "default-values.yaml")
REPO = os.path.dirname(os.path.dirname(CHART))
HELM = os.environ.get("HELM", "helm")
KUBE_VERSION = os.environ.get("KUBE_VERSION", "1.29.0")
RELEASE = "t"
WORKSPACES_DIR = "/var/lib/cairn/workspaces"
ARTIFACTS_DIR = "/var/lib/cairn/artifacts"
# Seconds a worker may take to exit after its drain, and the least margin the chart allows.
WORKER_EXIT_AFTER_DRAIN = 1
MIN_TERMINATION_MARGIN = 5

# The reaper's settings and their defaults, which are the binary's own.
REAPER_DEFAULTS = {
    "CAIRN_REAPER_INTERVAL_SECONDS": "60",
    "CAIRN_REAPER_BATCH": "1000",
    "CAIRN_IDLE_HEAD_SECONDS": "1209600",
    "CAIRN_RECLAIM_AFTER_SECONDS": "604800",
    "CAIRN_DESTROYED_GRACE_SECONDS": "86400",
    "CAIRN_MEMORY_CHECKPOINT_SECONDS": "259200",
    "CAIRN_QUARANTINE_KEEP_SECONDS": "2592000",
}
# Where each reaper setting comes from in the values.
REAPER_VALUES = {
    "CAIRN_REAPER_INTERVAL_SECONDS": ("intervalSeconds",),
    "CAIRN_REAPER_BATCH": ("batch",),
    "CAIRN_IDLE_HEAD_SECONDS": ("retention", "idleHeadSeconds"),
    "CAIRN_RECLAIM_AFTER_SECONDS": ("retention", "reclaimAfterSeconds"),
    "CAIRN_DESTROYED_GRACE_SECONDS": ("retention", "destroyedGraceSeconds"),
    "CAIRN_MEMORY_CHECKPOINT_SECONDS": ("retention", "memoryCheckpointSeconds"),
    "CAIRN_QUARANTINE_KEEP_SECONDS": ("retention", "quarantineKeepSeconds"),
}
# The worker's snapshot settings rendered with their defaults (the binary's own).
WORKER_SNAPSHOT_DEFAULTS = {
    "CAIRN_WORKSPACE_BACKEND": "local",
    "CAIRN_WORKSPACE_PERSISTENT": "false",
}

# Fake secret values: distinctive, so that finding one anywhere is never a coincidence.
FAKE_SECRETS = {
    "secrets.databaseUrl": "postgres://cairn:Db-Pw-5f1e2a@db.example:5432/cairn",
    "secrets.redisUrl": "redis://:Redis-Pw-93bd07@redis.example:6379/0",
    "secrets.amqpUrl": "amqp://cairn:Amqp-Pw-c4e811@mq.example:5672/%2f",
    "secrets.bootstrapAdminToken": "boot-token-7d0c5b9e41",
}
# The connection settings, which the pods read from files ("<NAME>_FILE"), never from
# their environment.
SECRET_VARS = ("CAIRN_DATABASE_URL", "CAIRN_REDIS_URL", "CAIRN_AMQP_URL", "CAIRN_BOOTSTRAP_ADMIN_TOKEN")
SECRET_DIR = "/var/run/secrets/cairn"


# ---------------------------------------------------------------- rendering helpers


def ci_files():
    return sorted(
        os.path.join(CI_DIR, f) for f in os.listdir(CI_DIR) if f.endswith((".yaml", ".yml"))
    )


def value_sets():
    """(label, helm arguments) for every ci values file; ci/default-values.yaml is the
    chart's defaults plus the URLs an install needs."""
    return [(os.path.relpath(f, CHART), ["-f", f]) for f in ci_files()]


def with_defaults(args):
    """args after ci/default-values.yaml, unless they name a ci file (a complete set)."""
    args = list(args)
    if any(a.startswith(CI_DIR + os.sep) for a in args):
        return args
    return ["-f", DEFAULT_VALUES] + args


_cache = {}


def helm_template(args, release=RELEASE, bare=False):
    """Run helm template (after ci/default-values.yaml unless bare); return (exit code,
    stdout, stderr)."""
    args = list(args) if bare else with_defaults(args)
    key = (release, tuple(args))
    if key not in _cache:
        cmd = [HELM, "template", release, CHART, "--kube-version", KUBE_VERSION] + args
        p = subprocess.run(cmd, capture_output=True, text=True, check=False)
        _cache[key] = (p.returncode, p.stdout, p.stderr)
    return _cache[key]


def render(args=(), release=RELEASE, bare=False):
    """Render and parse; fail the test if helm fails."""
    rc, out, err = helm_template(args, release, bare)
    assert rc == 0, f"helm template {' '.join(args)} failed: {err.strip()}"
    return [d for d in yaml.safe_load_all(out) if d]


def chart_docs(args=(), release=RELEASE):
    """Like render, without the documents of extraObjects (the user's own manifests)."""
    rc, out, err = helm_template(args, release)
    assert rc == 0, f"helm template {' '.join(args)} failed: {err.strip()}"
    docs = []
    for chunk in re.split(r"^---\s*$", out, flags=re.M):
        source = re.search(r"^# Source: (\S+)", chunk, re.M)
        doc = yaml.safe_load(chunk)
        if doc and not (source and source.group(1).endswith("/extra-objects.yaml")):
            docs.append(doc)
    return docs


def render_fails(args, bare=False):
    """Render, expecting failure; return helm's error output."""
    rc, _, err = helm_template(args, bare=bare)
    assert rc != 0, f"helm template {' '.join(args)} succeeded but should fail"
    return err


def set_args(values):
    args = []
    for k, v in values.items():
        args += ["--set-string", f"{k}={v}"]
    return args


def of_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def component(docs, kind, comp):
    found = [
        d
        for d in of_kind(docs, kind)
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == comp
    ]
    assert len(found) == 1, f"expected one {kind} for {comp}, found {len(found)}"
    return found[0]


def pod_specs(docs):
    """(description, pod spec) of every workload of Cairn's image (not the bundled
    object store's server, which test_bundled_object_store checks)."""
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            comp = d["metadata"]["labels"]["app.kubernetes.io/component"]
            if comp == "object-store":
                continue
            out.append((f"{d['kind']}/{d['metadata']['name']} ({comp})", d["spec"]["template"]["spec"]))
    return out


def container_env(docs, container):
    """Plain environment of a container: env values plus envFrom ConfigMaps."""
    env = {}
    for src in container.get("envFrom", []):
        if "configMapRef" in src:
            cm = one(docs, "ConfigMap", src["configMapRef"]["name"])
            env.update(cm.get("data") or {})
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            env[e["name"]] = e["valueFrom"]
    return env


def worker(docs):
    return component(docs, "Deployment", "worker")


def deep_merge(base, over):
    out = dict(base)
    for k, v in (over or {}).items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def effective_values(args):
    """The chart's values after -f files and --set/--set-string pairs (scalars only)."""
    with open(os.path.join(CHART, "values.yaml"), encoding="utf-8") as f:
        values = yaml.safe_load(f)
    args = with_defaults(args)
    pairs = list(zip(args[::2], args[1::2]))
    # Like helm: every -f file first, in order, then every --set.
    for flag, arg in sorted(pairs, key=lambda p: p[0] != "-f"):
        if flag == "-f":
            with open(arg, encoding="utf-8") as f:
                values = deep_merge(values, yaml.safe_load(f))
        else:
            for pair in arg.split(","):
                key, raw = pair.split("=", 1)
                node = values
                *path, last = key.split(".")
                for part in path:
                    node = node.setdefault(part, {})
                node[last] = raw if flag == "--set-string" else yaml.safe_load(raw)
    return values


# ---------------------------------------------------------------- what the binaries read


def _read_source(path):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return f.read()


def _struct_envs(text):
    """{struct name: env names of its fields} and {struct name: flattened field types}."""
    envs, flattened = {}, {}
    for m in re.finditer(r"pub struct (\w+) \{(.*?)\n\}", text, re.S):
        name, body = m.group(1), m.group(2)
        envs[name] = set(re.findall(r'env = "(CAIRN_[A-Z0-9_]+)"', body))
        flattened[name] = re.findall(r"#\[command\(flatten\)\]\s*pub \w+: (\w+),", body)
    return envs, flattened


def binary_env(crate):
    """CAIRN_* variables a binary reads, taken from its config.rs and the shared arguments
    in crates/common/src/config.rs that it flattens in."""
    common, _ = _struct_envs(_read_source("crates/common/src/config.rs"))
    own, flattened = _struct_envs(_read_source(f"crates/{crate}/src/config.rs"))
    names = set(own["Config"])
    for struct in flattened["Config"]:
        assert struct in common, f"{crate}: flattens {struct}, not found in common/config.rs"
        names |= common[struct]
    assert "CAIRN_DATABASE_URL" in names and "CAIRN_LOG_FORMAT" in names, (crate, names)
    return names


def migration_env():
    common, _ = _struct_envs(_read_source("crates/common/src/config.rs"))
    return common["DatabaseArgs"]


def worker_container(docs):
    containers = worker(docs)["spec"]["template"]["spec"]["containers"]
    return [c for c in containers if c["name"] == "worker"][0]


def reaper(docs):
    return component(docs, "Deployment", "reaper")


def reaper_container(docs):
    containers = reaper(docs)["spec"]["template"]["spec"]["containers"]
    return [c for c in containers if c["name"] == "reaper"][0]


# ---------------------------------------------------------------- values and schema


def test_every_values_key_is_documented():
    path = os.path.join(CHART, "values.yaml")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        if re.match(r"^\s*[A-Za-z0-9_.-]+:(\s|$)", line):
            prev = lines[i - 1].strip() if i > 0 else ""
            if not prev.startswith("#"):
                undocumented.append(f"line {i + 1}: {line.strip()}")
    assert not undocumented, "keys without a comment above them:\n" + "\n".join(undocumented)


def test_schema_closes_every_object():
    with open(os.path.join(CHART, "values.schema.json"), encoding="utf-8") as f:
        schema = json.load(f)
    assert schema.get("$schema") == "http://json-schema.org/draft-07/schema#"
    problems = []

    def walk(node, where):
        if isinstance(node, dict):
            types = node.get("type")
            is_object = types == "object" or (isinstance(types, list) and "object" in types)
            if is_object:
                if "additionalProperties" not in node:
                    problems.append(f"{where}: no additionalProperties")
                elif "properties" in node and node["additionalProperties"] is not False:
                    problems.append(f"{where}: has properties but additionalProperties is not false")
                elif "properties" not in node and node["additionalProperties"] is True:
                    problems.append(f"{where}: additionalProperties is true")
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    walk(schema, "#")
    # The one open object: Kubernetes API types passed through (affinity terms, volume
    # sources, extraObjects), which the API server and kubernetes-validate check.
    problems.remove("#/definitions/kubernetesObject: additionalProperties is true")
    assert not problems, "\n".join(problems)


def test_schema_rejects_unknown_and_bad_values():
    for bad in (
        ["--set", "bogus=1"],
        ["--set", "worker.bogus=1"],
        ["--set", "worker.keda.bogus=1"],
        ["--set", "global.image.bogus=1"],
        ["--set", "global.logFormat=xml"],
        ["--set", "global.securityContext.runAsUser=0"],
        ["--set", "worker.workspaces.type=hostPath"],
        ["--set", "worker.terminationMarginSeconds=4"],
        ["--set", "worker.drainSeconds=0"],
        ["--set", "worker.killGraceSeconds=-1"],
        ["--set", "worker.concurrency=0"],
        ["--set", "worker.concurrency=1025"],
        ["--set", "worker.leaseTtlSeconds=3601"],
        ["--set", "worker.artifacts.bogus=1"],
        ["--set-string", "worker.artifacts.emptyDir.sizeLimit=lots"],
        ["--set", "scheduler.sweepIntervalSeconds=0"],
        ["--set", "scheduler.sweepIntervalSeconds=3601"],
        ["--set", "global.deliveryLimit=0"],
        ["--set", "reaper.intervalSeconds=0"],
        ["--set", "reaper.intervalSeconds=86401"],
        ["--set", "reaper.batch=0"],
        ["--set", "reaper.batch=100001"],
        ["--set", "reaper.retention.idleHeadSeconds=-1"],
        ["--set", "reaper.retention.bogus=1"],
        ["--set-string", "reaper.retention.reclaimAfterSeconds=7d"],
        ["--set-string", "worker.workspacePersistent=yes"],
        ["--set-string", "worker.workspaceBackend="],
        ["--set-string", "worker.captureExclude[0]=a,b"],
        ["--set-string", "worker.captureExclude[0]=build/out"],
        ["--set", "worker.pauseLimitSeconds=0"],
        ["--set", "worker.pauseLimitSeconds=86401"],
        ["--set-string", "worker.pauseLimitSeconds=60"],
        ["--set-string", "worker.snapshotStore.url=ftp://x"],
        ["--set-string", "worker.snapshotStore.url=cairn-snapshots"],
        ["--set-string", "worker.snapshotStore.url=s3://bucket/a b"],
        ["--set-string", "worker.snapshotStore.existingSecret=Not_A_Name"],
        ["--set", "worker.snapshotStore.bogus=1"],
        ["--set", "reaper.drainSeconds=-1"],
        ["--set-string", "reaper.drainSeconds=30"],
        # Gone with the RabbitMQ triggers: KEDA reads the demand from PostgreSQL.
        ["--set-string", "secrets.amqpManagementUrl=http://x"],
        ["--set-string", "secrets.keys.amqpManagementUrl=k"],
        ["--set-string", "worker.keda.queues[0]=runs"],
        ["--set", "worker.keda.combineQueues=true"],
        ["--set-string", "worker.keda.vhostName=cairn"],
        ["--set", "worker.keda.targetMessagesPerReplica=4"],
        ["--set", "worker.keda.activationMessages=1"],
        ["--set", "worker.keda.minReplicaCount=-1"],
        ["--set", "worker.keda.targetJobsPerReplica=-1"],
        ["--set-string", "worker.keda.postgresql.sslmode=sometimes"],
        ["--set", "worker.keda.postgresql.port=0"],
        ["--set", "worker.keda.fallback.bogus=1"],
        ["--set-string", "global.image.digest=latest"],
        ["--set-string", "global.image.digest=sha256:abc"],
        ["--set-string", "worker.hostUsers=no"],
        ["--set", "worker.prefetch=-1"],
        ["--set", "worker.networkPolicy.bogus=1"],
        ["--set-string", "worker.networkPolicy.egress[0].to[0].bogus=x"],
        ["--set", "scheduler.preStopSeconds=-1"],
        ["--set", "scheduler.startupProbe.periodSeconds=0"],
        ["--set-string", "scheduler.priorityClassName=Not_A_Name"],
        ["--set-string", "worker.affinity.bogus=x"],
        ["--set-string", "worker.topologySpreadConstraints[0].topologyKey=zone"],
        ["--set-string", "reaper.extraVolumeMounts[0].name=x"],
        ["--set-string", "reaper.extraEnv[0].name=A"],
        ["--set-string", "reaper.extraEnv[0].name=A", "--set-string", "reaper.extraEnv[0].value=b",
         "--set-string", "reaper.extraEnv[0].valueFrom.secretKeyRef.name=s",
         "--set-string", "reaper.extraEnv[0].valueFrom.secretKeyRef.key=k"],
        ["--set", "extraObjects[0].kind=ConfigMap"],
        # Values no binary reads are gone, not ignored.
        ["--set", "worker.confinement.enabled=true"],
        ["--set-string", "global.artifactsUrl=s3://bucket/prefix"],
        ["--set-string", "secrets.artifactsUrl=s3://bucket/prefix"],
        ["--set-string", "secrets.keys.artifactsUrl=artifacts-url"],
    ):
        render_fails(bad)


def test_all_value_sets_render():
    for label, args in value_sets():
        docs = render(args)
        assert of_kind(docs, "Deployment"), f"{label}: no Deployment"


def test_chart_metadata():
    with open(os.path.join(CHART, "Chart.yaml"), encoding="utf-8") as f:
        chart = yaml.safe_load(f)
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "cairn"
    assert chart["kubeVersion"] == ">=1.27.0-0"
    assert chart["version"] == "0.1.0" and chart["appVersion"] == "0.1.0"


def test_common_labels_on_every_resource():
    required = (
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/component",
        "helm.sh/chart",
    )
    for label, args in value_sets():
        for d in chart_docs(args):
            labels = d["metadata"].get("labels", {})
            missing = [k for k in required if k not in labels]
            assert not missing, f"{label}: {d['kind']}/{d['metadata']['name']} lacks {missing}"


# ---------------------------------------------------------------- worker shutdown


def test_worker_grace_period_exceeds_drain_and_capture():
    cases = value_sets() + [
        ("long drain", ["--set", "worker.drainSeconds=3600", "--set", "worker.captureSeconds=1800"]),
        ("shortest", ["--set", "worker.captureSeconds=0", "--set", "worker.drainSeconds=1",
                      "--set", "worker.killGraceSeconds=0", "--set", "worker.terminationMarginSeconds=5"]),
    ]
    for label, args in cases:
        docs = render(args)
        values = effective_values(args)["worker"]
        grace = worker(docs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        env = container_env(docs, worker_container(docs))
        drain = int(env["CAIRN_DRAIN_SECONDS"])
        capture = values["captureSeconds"]
        assert drain == values["drainSeconds"], f"{label}: CAIRN_DRAIN_SECONDS {drain}"
        assert isinstance(grace, int), f"{label}: grace period {grace!r} is not an integer"
        # The worker exits about drain + 1 s after SIGTERM; capture time is kept free and
        # a margin of at least MIN_TERMINATION_MARGIN seconds comes on top.
        assert grace > drain + WORKER_EXIT_AFTER_DRAIN, f"{label}: grace {grace} <= drain {drain} + exit"
        assert grace >= drain + capture + MIN_TERMINATION_MARGIN, (
            f"{label}: grace {grace} < drain {drain} + capture {capture} + {MIN_TERMINATION_MARGIN}"
        )


def test_worker_kill_grace_less_than_drain():
    for label, args in value_sets():
        docs = render(args)
        env = container_env(docs, worker_container(docs))
        kill, drain = int(env["CAIRN_KILL_GRACE_SECONDS"]), int(env["CAIRN_DRAIN_SECONDS"])
        assert kill < drain, f"{label}: CAIRN_KILL_GRACE_SECONDS {kill} >= CAIRN_DRAIN_SECONDS {drain}"
        assert kill == effective_values(args)["worker"]["killGraceSeconds"], label
    docs = render(["--set", "worker.drainSeconds=6", "--set", "worker.killGraceSeconds=5"])
    env = container_env(docs, worker_container(docs))
    assert (env["CAIRN_DRAIN_SECONDS"], env["CAIRN_KILL_GRACE_SECONDS"]) == ("6", "5")
    for drain, kill in ((5, 5), (30, 60)):
        err = render_fails(["--set", f"worker.drainSeconds={drain}", "--set", f"worker.killGraceSeconds={kill}"])
        assert "worker.killGraceSeconds" in err and "must be less than worker.drainSeconds" in err, err


def test_worker_defaults():
    docs = render()
    env = container_env(docs, worker_container(docs))
    assert env["CAIRN_WORKER_CONCURRENCY"] == "4"
    assert env["CAIRN_SANDBOX_SLOTS"] == "4"
    assert "CAIRN_PREFETCH" not in env, "0: the binary's default, one delivery per queue"
    assert env["CAIRN_LEASE_TTL_SECONDS"] == "30"
    # The longest step expected: a scale-down hands runs back at a step boundary.
    assert env["CAIRN_DRAIN_SECONDS"] == "900"
    assert env["CAIRN_KILL_GRACE_SECONDS"] == "5"
    assert env["CAIRN_METRICS_LISTEN"] == "0.0.0.0:9090"
    assert env["CAIRN_WORKSPACES_DIR"] == WORKSPACES_DIR
    assert env["CAIRN_ARTIFACTS_URL"] == ARTIFACTS_DIR
    assert env["CAIRN_QUEUE_PREFIX"] == ""
    assert env["CAIRN_REDIS_PREFIX"] == "cairn:"
    assert env["CAIRN_DELIVERY_LIMIT"] == "5"
    assert env["CAIRN_MIGRATE"] == "true", "a first install has no hook: the pods migrate"
    assert env["CAIRN_LOG_FORMAT"] == "json"
    assert env["CAIRN_PAUSE_LIMIT_SECONDS"] == "1800"
    assert env["CAIRN_SNAPSHOT_STORE_URL"] == "s3://cairn", "the bundled object store, shared by every pod"
    assert env["CAIRN_SNAPSHOTS_SHARED"] == "true"
    assert "CAIRN_WORKER_ID" not in env, "the default worker id (host name = pod name, pid) is unique"
    assert worker_container(docs)["args"] == ["cairn-worker"]
    assert worker(docs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 900 + 120 + 30


def test_worker_artifacts_in_a_writable_local_directory():
    for label, args in value_sets() + [("sized", ["--set-string", "worker.artifacts.emptyDir.sizeLimit=20Gi"])]:
        docs = render(args)
        c = worker_container(docs)
        env = container_env(docs, c)
        url = env["CAIRN_ARTIFACTS_URL"]
        assert isinstance(url, str), f"{label}: CAIRN_ARTIFACTS_URL comes from {url!r}, not a plain value"
        path = url[len("file://"):] if url.startswith("file://") else url
        assert "://" not in path, f"{label}: {url} is not a local directory; the worker refuses it"
        assert path.startswith("/"), f"{label}: {url} is relative to the read-only root filesystem"
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = [m for m in c["volumeMounts"] if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
        assert len(mounts) == 1, f"{label}: {path} is not on a mounted volume"
        assert not mounts[0].get("readOnly"), f"{label}: {path} is mounted read-only"
        assert mounts[0]["mountPath"] != WORKSPACES_DIR, f"{label}: artifacts share the workspaces volume"
        vols = {v["name"]: v for v in worker(docs)["spec"]["template"]["spec"]["volumes"]}
        vol = vols[mounts[0]["name"]]
        claim = effective_values(args)["worker"]["artifacts"].get("existingClaim")
        if claim:
            assert vol["persistentVolumeClaim"] == {"claimName": claim}, f"{label}: {vol}"
        else:
            size = effective_values(args)["worker"]["artifacts"]["emptyDir"].get("sizeLimit")
            assert vol["emptyDir"] == ({"sizeLimit": size} if size else {}), f"{label}: {vol}"
    for comp in ("scheduler", "reaper"):
        docs = render()
        c = component(docs, "Deployment", comp)["spec"]["template"]["spec"]["containers"][0]
        assert "CAIRN_ARTIFACTS_URL" not in container_env(docs, c), f"{comp} does not read CAIRN_ARTIFACTS_URL"


# ---------------------------------------------------------------- scaling


def test_keda_and_hpa_together_fail():
    err = render_fails(
        ["--set", "worker.keda.enabled=true", "--set", "worker.autoscaling.enabled=true"]
        + set_args({"worker.keda.authenticationRef": "keda-pg"})
    )
    assert "worker.keda.enabled and worker.autoscaling.enabled are both true" in err, err


def test_hpa_values():
    docs = render(["-f", os.path.join(CI_DIR, "hpa-values.yaml")])
    hpas = {h["spec"]["scaleTargetRef"]["name"]: h for h in of_kind(docs, "HorizontalPodAutoscaler")}
    for comp in ("scheduler", "worker"):
        dep = component(docs, "Deployment", comp)
        name = dep["metadata"]["name"]
        assert name in hpas, f"no HPA for {comp}"
        assert hpas[name]["apiVersion"] == "autoscaling/v2"
        assert "replicas" not in dep["spec"], f"{comp}: replicas set next to an HPA"
    assert not of_kind(docs, "ScaledObject")
    assert component(docs, "Deployment", "reaper")["spec"]["replicas"] == 2, "the reaper is never autoscaled"


def test_no_autoscaler_by_default():
    docs = render()
    assert not of_kind(docs, "HorizontalPodAutoscaler")
    assert not of_kind(docs, "ScaledObject")
    assert worker(docs)["spec"]["replicas"] == 2


# ---------------------------------------------------------------- secrets


def test_secret_values_never_in_configmaps():
    docs = render(["-f", os.path.join(CI_DIR, "keda-values.yaml")] + set_args(FAKE_SECRETS))
    secrets = of_kind(docs, "Secret")
    assert secrets, "no Secret rendered"
    plain = set()
    for s in secrets:
        for v in (s.get("data") or {}).values():
            plain.add(base64.b64decode(v).decode())
        plain.update((s.get("stringData") or {}).values())
    assert set(FAKE_SECRETS.values()) <= plain, "the chart's Secret lacks some values"
    configmaps = of_kind(docs, "ConfigMap")
    assert configmaps
    for cm in configmaps:
        text = yaml.safe_dump(cm)
        for secret in plain:
            assert secret not in text, f"ConfigMap {cm['metadata']['name']} holds a secret value"
    # Nor anywhere else outside a Secret (env values, annotations, KEDA metadata).
    for d in docs:
        if d["kind"] == "Secret":
            continue
        text = yaml.safe_dump(d)
        for secret in plain:
            assert secret not in text, f"{d['kind']}/{d['metadata']['name']} holds a secret value"
    # Connection settings reach the pods as files only: test_operations.py checks them.
    for desc, spec in pod_specs(docs):
        for c in spec["containers"]:
            names = {e["name"] for e in c.get("env", [])}
            assert not names & set(SECRET_VARS), f"{desc}: {sorted(names & set(SECRET_VARS))} in the environment"


def test_secret_and_chart_settings_refused_in_plain_values():
    err = render_fails(set_args({"global.extraConfig.CAIRN_DATABASE_URL": "postgres://x"}))
    assert "secret setting" in err, err
    err = render_fails(set_args({"reaper.extraEnv[0].name": "CAIRN_REDIS_URL",
                                 "reaper.extraEnv[0].value": "redis://x"}))
    assert "reaper.extraEnv CAIRN_REDIS_URL is a secret setting" in err, err
    # An object store URL would make the worker refuse to start; the chart sets a local path.
    err = render_fails(set_args({"global.extraConfig.CAIRN_ARTIFACTS_URL": "s3://bucket/prefix"}))
    assert "set by the chart" in err and "worker.artifacts" in err, err
    err = render_fails(set_args({"worker.extraEnv[0].name": "CAIRN_ARTIFACTS_URL",
                                 "worker.extraEnv[0].value": "s3://bucket/prefix"}))
    assert "worker.extraEnv CAIRN_ARTIFACTS_URL is set by the chart" in err, err
    err = render_fails(set_args({"global.extraConfig.CAIRN_DRAIN_SECONDS": "5"}))
    assert "scheduler.drainSeconds, worker.drainSeconds and reaper.drainSeconds" in err, err
    err = render_fails(set_args({"worker.extraEnv[0].name": "CAIRN_PREFETCH", "worker.extraEnv[0].value": "8"}))
    assert "worker.prefetch" in err, err
    # The binaries refuse a setting given both as a value and as a file.
    err = render_fails(set_args({"worker.extraEnv[0].name": "CAIRN_DATABASE_URL",
                                 "worker.extraEnv[0].valueFrom.secretKeyRef.name": "db",
                                 "worker.extraEnv[0].valueFrom.secretKeyRef.key": "url"}))
    assert "worker.extraEnv CAIRN_DATABASE_URL is a secret setting" in err, err
    err = render_fails(set_args({"global.extraConfig.CAIRN_REDIS_URL_FILE": "/x"}))
    assert "set by the chart, from the secrets block" in err, err
    docs = render(set_args({"global.extraConfig.CAIRN_DATABASE_MAX_CONNECTIONS": "20",
                            "worker.extraEnv[0].name": "CAIRN_OUTPUT_TAIL_BYTES", "worker.extraEnv[0].value": "8192"}))
    for comp in ("scheduler", "worker", "reaper"):
        c = component(docs, "Deployment", comp)["spec"]["template"]["spec"]["containers"][0]
        assert container_env(docs, c)["CAIRN_DATABASE_MAX_CONNECTIONS"] == "20", comp
    assert container_env(docs, worker_container(docs))["CAIRN_OUTPUT_TAIL_BYTES"] == "8192"


def secret_sources(spec):
    """{Secret key: (Secret name, file path, optional)} of a pod's projected secret volume."""
    out = {}
    for vol in spec.get("volumes", []):
        for src in (vol.get("projected") or {}).get("sources", []):
            sec = src.get("secret")
            for item in (sec or {}).get("items", []):
                out[item["key"]] = (sec["name"], f"{SECRET_DIR}/{item['path']}", bool(sec.get("optional")))
    return out


def test_existing_secret():
    docs = render(["-f", os.path.join(CI_DIR, "existing-secret-values.yaml")])
    assert [s["metadata"]["name"] for s in of_kind(docs, "Secret")] == [f"{RELEASE}-cairn-object-store"], \
        "the chart rendered a Secret next to existingSecret (the bundled store's own is not one)"
    for desc, spec in pod_specs(docs):
        sources = secret_sources(spec)
        assert sources, f"{desc}: no secret files"
        assert {name for name, _, _ in sources.values()} == {"cairn-connections"}, f"{desc}: {sources}"
        for c in spec["containers"]:
            for src in c.get("envFrom", []):
                assert "secretRef" not in src, f"{desc}: envFrom a Secret"
    sched = component(docs, "Deployment", "scheduler")["spec"]["template"]["spec"]
    assert set(secret_sources(sched)) == {"database-url", "redis-url", "amqp-url", "CAIRN_BOOTSTRAP_ADMIN_TOKEN"}
    migration = component(docs, "Job", "migration")["spec"]["template"]["spec"]
    assert set(secret_sources(migration)) == {"database-url"}
    for d in of_kind(docs, "Deployment"):
        assert "checksum/secret" not in d["spec"]["template"]["metadata"]["annotations"]


def test_existing_secret_with_secret_values_fails():
    err = render_fails(
        ["-f", os.path.join(CI_DIR, "existing-secret-values.yaml")]
        + set_args({"secrets.databaseUrl": "postgres://x"})
    )
    assert "secrets.existingSecret is set" in err, err


def test_components_get_only_the_secrets_they_need():
    docs = render(set_args(FAKE_SECRETS))

    def secret_env(comp, kind="Deployment"):
        spec = component(docs, kind, comp)["spec"]["template"]["spec"]
        return {e["name"] for c in spec["containers"] for e in c.get("env", []) if e["name"].endswith("_FILE")}

    connections = {"CAIRN_DATABASE_URL_FILE", "CAIRN_REDIS_URL_FILE", "CAIRN_AMQP_URL_FILE"}
    assert secret_env("scheduler") == connections | {"CAIRN_BOOTSTRAP_ADMIN_TOKEN_FILE"}
    assert secret_env("worker") == connections
    # The reaper reads the database URL only: no Redis or RabbitMQ credentials.
    assert secret_env("reaper") == {"CAIRN_DATABASE_URL_FILE"}
    assert secret_env("migration", "Job") == {"CAIRN_DATABASE_URL_FILE"}


def test_reaper_gets_no_redis_or_amqp_secret_keys():
    for label, args in value_sets() + [("all secrets", set_args(FAKE_SECRETS))]:
        docs = render(args)
        values = effective_values(args)
        c = reaper_container(docs)
        keys = set(secret_sources(reaper(docs)["spec"]["template"]["spec"]))
        assert keys == {values["secrets"]["keys"]["databaseUrl"]}, f"{label}: reaper reads {keys}"
        # The only Secret it takes whole is the snapshot store's credentials, when set.
        store_secret = values["worker"]["snapshotStore"]["existingSecret"]
        refs = [src["secretRef"]["name"] for src in c.get("envFrom", []) if "secretRef" in src]
        assert refs == ([store_secret] if store_secret else []), f"{label}: reaper envFrom Secrets {refs}"
        assert values["secrets"]["existingSecret"] not in refs, f"{label}: reaper envFrom the connections Secret"
        env = container_env(docs, c)
        for name in ("CAIRN_REDIS_URL", "CAIRN_AMQP_URL", "CAIRN_REDIS_PREFIX", "CAIRN_QUEUE_PREFIX",
                     "CAIRN_DELIVERY_LIMIT", "CAIRN_BOOTSTRAP_ADMIN_TOKEN", "CAIRN_REDIS_URL_FILE",
                     "CAIRN_AMQP_URL_FILE", "CAIRN_BOOTSTRAP_ADMIN_TOKEN_FILE"):
            assert name not in env, f"{label}: reaper gets {name}"


# ---------------------------------------------------------------- settings no binary reads


def test_only_variables_the_binaries_read():
    reads = {
        "scheduler": binary_env("scheduler"),
        "worker": binary_env("worker"),
        "reaper": binary_env("reaper"),
        "migration": migration_env(),
    }
    # A secret setting is read from "<NAME>_FILE" (crates/common/src/secret_files.rs).
    for comp, names in reads.items():
        names |= {f"{n}_FILE" for n in SECRET_VARS if n in names}
    for label, args in value_sets() + [("all secrets", set_args(FAKE_SECRETS))]:
        docs = render(args)
        values = effective_values(args)
        for desc, spec in pod_specs(docs):
            comp = desc.rsplit("(", 1)[1].rstrip(")")
            # A user's own extraEnv variables (a token for git, the node name) are theirs.
            own = {e["name"] for e in values.get(comp, {}).get("extraEnv", []) if not e["name"].startswith("CAIRN_")}
            for c in spec["containers"]:
                names = set(container_env(docs, c))
                unread = {n for n in names if n.startswith("CAIRN_")} - reads[comp]
                assert not unread, f"{label}: {desc} gets {sorted(unread)}, which {comp} does not read"
                # POD_IP: the downward API's address, expanded into CAIRN_PREVIEW_URL.
                expanded = {"POD_IP"} if "CAIRN_PREVIEW_URL" in names else set()
                # The object store's settings: every AWS_* variable is read by the store
                # (crates/snapshot/src/store.rs); they come only with the bundled store.
                store = OBJECT_STORE_ENV if comp != "migration" else set()
                assert names - reads[comp] <= {"HOME"} | own | expanded | store, \
                    f"{label}: {desc}: {sorted(names - reads[comp])}"
        text = yaml.safe_dump_all(docs)
        for gone in ("CAIRN_CAPTURE_SECONDS", "CAIRN_CONFINEMENT"):
            assert gone not in text, f"{label}: {gone} is rendered but no binary reads it"
    assert {"CAIRN_KILL_GRACE_SECONDS", "CAIRN_ARTIFACTS_URL"} <= reads["worker"]
    assert set(WORKER_SNAPSHOT_DEFAULTS) | {"CAIRN_BASE_IMAGE", "CAIRN_CAPTURE_EXCLUDE"} <= reads["worker"]
    assert set(REAPER_DEFAULTS) <= reads["reaper"]
    assert "CAIRN_SWEEP_INTERVAL_SECONDS" in reads["scheduler"]
    assert not reads["reaper"] & {"CAIRN_REDIS_URL", "CAIRN_AMQP_URL", "CAIRN_ARTIFACTS_URL"}


def test_shared_messaging_settings_agree():
    for label, args in value_sets() + [("prefixes", set_args({"global.queuePrefix": "qa.",
                                                             "global.redisPrefix": "qa:"})
                                        + ["--set", "global.deliveryLimit=9"])]:
        docs = render(args)
        values = effective_values(args)["global"]
        sched = component(docs, "Deployment", "scheduler")["spec"]["template"]["spec"]["containers"][0]
        env_s, env_w = container_env(docs, sched), container_env(docs, worker_container(docs))
        for name, value in (("CAIRN_QUEUE_PREFIX", values["queuePrefix"]),
                            ("CAIRN_REDIS_PREFIX", values["redisPrefix"]),
                            ("CAIRN_DELIVERY_LIMIT", str(values["deliveryLimit"]))):
            assert env_s[name] == env_w[name] == value, f"{label}: {name} {env_s[name]!r} {env_w[name]!r}"


def test_scheduler_settings():
    docs = render()
    c = component(docs, "Deployment", "scheduler")["spec"]["template"]["spec"]["containers"][0]
    env = container_env(docs, c)
    assert env["CAIRN_SWEEP_INTERVAL_SECONDS"] == "1"
    assert env["CAIRN_DRAIN_SECONDS"] == "10"
    assert env["CAIRN_LISTEN"] == "0.0.0.0:8080"
    for label, args in value_sets():
        docs = render(args)
        dep = component(docs, "Deployment", "scheduler")
        env = container_env(docs, dep["spec"]["template"]["spec"]["containers"][0])
        grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert int(env["CAIRN_DRAIN_SECONDS"]) < grace, f"{label}: scheduler drain >= grace {grace}"
        assert float(env["CAIRN_SWEEP_INTERVAL_SECONDS"]) == float(
            effective_values(args)["scheduler"]["sweepIntervalSeconds"]), label
    docs = render(["-f", os.path.join(CI_DIR, "artifacts-claim-values.yaml")])
    c = component(docs, "Deployment", "scheduler")["spec"]["template"]["spec"]["containers"][0]
    assert container_env(docs, c)["CAIRN_SWEEP_INTERVAL_SECONDS"] == "2.5"
    err = render_fails(["--set", "scheduler.drainSeconds=25"])
    assert ("scheduler.preStopSeconds (5) + scheduler.drainSeconds (25) must be less than "
            "scheduler.terminationGracePeriodSeconds (30)") in err, err


# ---------------------------------------------------------------- reaper


def test_reaper_leader_and_standby_by_default():
    docs = render()
    dep = reaper(docs)
    assert dep["spec"]["replicas"] == 2, "a leader and a standby by default"
    env = container_env(docs, reaper_container(docs))
    assert env["CAIRN_REAPER_INTERVAL_SECONDS"] == "60", env.get("CAIRN_REAPER_INTERVAL_SECONDS")
    for name, value in REAPER_DEFAULTS.items():
        assert env[name] == value, f"{name}={env.get(name)!r}, expected the binary's default {value}"
    # Its PodDisruptionBudget never lets a drain take both away.
    pdb = component(docs, "PodDisruptionBudget", "reaper")
    spec = pdb["spec"]
    if "minAvailable" in spec:
        assert int(spec["minAvailable"]) >= 1, spec
    else:
        assert isinstance(spec["maxUnavailable"], int), spec
        assert dep["spec"]["replicas"] - spec["maxUnavailable"] >= 1, spec


def check_reaper_settings(label, args):
    docs = render(args)
    values = effective_values(args)["reaper"]
    env = container_env(docs, reaper_container(docs))
    for name, path in REAPER_VALUES.items():
        value = values
        for part in path:
            value = value[part]
        assert float(env[name]) == float(value), f"{label}: {name}={env[name]!r}, values say {value!r}"
        if name != "CAIRN_REAPER_INTERVAL_SECONDS":
            assert re.fullmatch(r"[0-9]+", env[name]), f"{label}: {name}={env[name]!r} is not an integer"
    assert reaper(docs)["spec"]["replicas"] == int(values["replicas"]), label
    if label == "set":
        assert env["CAIRN_REAPER_INTERVAL_SECONDS"] == "0.5", env["CAIRN_REAPER_INTERVAL_SECONDS"]


def test_reaper_settings_follow_the_values():
    # --set passes 0.5 as a string; a values file passes a number.
    fd, fractional = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("reaper:\n  intervalSeconds: 0.5\n")
    cases = value_sets() + [(
        "set",
        ["-f", fractional, "--set", "reaper.batch=50", "--set", "reaper.replicas=1",
         "--set", "reaper.retention.idleHeadSeconds=3600", "--set", "reaper.retention.reclaimAfterSeconds=0",
         "--set", "reaper.retention.destroyedGraceSeconds=60", "--set", "reaper.retention.memoryCheckpointSeconds=120"],
    )]
    try:
        for label, args in cases:
            check_reaper_settings(label, args)
    finally:
        os.unlink(fractional)
    # Large durations stay plain integers (never 1.2096e+06).
    docs = render(["--set", "reaper.retention.idleHeadSeconds=31536000"])
    assert container_env(docs, reaper_container(docs))["CAIRN_IDLE_HEAD_SECONDS"] == "31536000"
    # The settings are the chart's: extraEnv and extraConfig may not shadow them.
    err = render_fails(set_args({"reaper.extraEnv[0].name": "CAIRN_REAPER_INTERVAL_SECONDS",
                                 "reaper.extraEnv[0].value": "5"}))
    assert "set by the chart" in err and "reaper.intervalSeconds" in err, err
    err = render_fails(set_args({"global.extraConfig.CAIRN_RECLAIM_AFTER_SECONDS": "0"}))
    assert "reaper.retention.reclaimAfterSeconds" in err, err


def test_reaper_mounts_the_shared_artifact_store():
    for label, args in value_sets():
        docs = render(args)
        claim = effective_values(args)["worker"]["artifacts"].get("existingClaim")
        spec = reaper(docs)["spec"]["template"]["spec"]
        vols = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m for m in reaper_container(docs)["volumeMounts"]}
        if not claim:
            # Each worker's store is its own emptyDir: there is nothing to share.
            assert ARTIFACTS_DIR not in mounts, f"{label}: reaper mounts {ARTIFACTS_DIR} without a shared claim"
            assert not [v for v in vols.values() if "persistentVolumeClaim" in v], f"{label}: {vols}"
            continue
        # Snapshots record the workers' store URL; the reaper deletes through it, so it
        # must see the same claim at the same path, writable.
        w_env = container_env(docs, worker_container(docs))
        assert w_env["CAIRN_ARTIFACTS_URL"] == ARTIFACTS_DIR, label
        mount = mounts.get(ARTIFACTS_DIR)
        assert mount, f"{label}: the reaper does not mount {ARTIFACTS_DIR}"
        assert not mount.get("readOnly"), f"{label}: the reaper's store is read-only"
        assert vols[mount["name"]]["persistentVolumeClaim"] == {"claimName": claim}, f"{label}: {vols[mount['name']]}"
        w_vols = {v["name"]: v for v in worker(docs)["spec"]["template"]["spec"]["volumes"]}
        w_mount = [m for m in worker_container(docs)["volumeMounts"] if m["mountPath"] == ARTIFACTS_DIR][0]
        assert w_vols[w_mount["name"]]["persistentVolumeClaim"] == {"claimName": claim}, label
        assert "CAIRN_ARTIFACTS_URL" not in container_env(docs, reaper_container(docs)), label


def test_scheduler_reaches_the_output_store_read_only():
    for label, args in value_sets():
        docs = render(args)
        values = effective_values(args)
        claim = values["worker"]["artifacts"].get("existingClaim")
        deployment = component(docs, "Deployment", "scheduler")
        spec = deployment["spec"]["template"]["spec"]
        c = spec["containers"][0]
        vols = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        if claim:
            # Steps' output is read through the URL the workers recorded: the same
            # claim at the same path, and nothing for the scheduler to write there.
            mount = mounts.get(ARTIFACTS_DIR)
            assert mount and mount.get("readOnly") is True, f"{label}: {mounts}"
            assert vols[mount["name"]]["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}, label
        else:
            assert ARTIFACTS_DIR not in mounts, f"{label}: scheduler mounts {ARTIFACTS_DIR} without a shared claim"
        store_secret = values["worker"]["snapshotStore"]["existingSecret"]
        refs = [src["secretRef"]["name"] for src in c.get("envFrom", []) if "secretRef" in src]
        assert refs == ([store_secret] if store_secret else []), f"{label}: scheduler envFrom Secrets {refs}"


# ---------------------------------------------------------------- worker snapshots


def test_worker_snapshot_settings():
    docs = render()
    env = container_env(docs, worker_container(docs))
    for name, value in WORKER_SNAPSHOT_DEFAULTS.items():
        assert env[name] == value, f"{name}={env.get(name)!r}, expected the binary's default {value}"
    for name in ("CAIRN_BASE_IMAGE", "CAIRN_CAPTURE_EXCLUDE"):
        assert name not in env, f"{name} is rendered without a value"
    docs = render(["-f", os.path.join(CI_DIR, "artifacts-claim-values.yaml")])
    env = container_env(docs, worker_container(docs))
    assert env["CAIRN_WORKSPACE_BACKEND"] == "kubernetes"
    assert env["CAIRN_BASE_IMAGE"] == "registry.example.com/cairn:0.1.0"
    assert env["CAIRN_CAPTURE_EXCLUDE"] == "node_modules,*.log"
    docs = render(["--set", "worker.workspacePersistent=true", "--set-string", "worker.captureExclude[0]=target"])
    env = container_env(docs, worker_container(docs))
    assert env["CAIRN_WORKSPACE_PERSISTENT"] == "true"
    assert env["CAIRN_CAPTURE_EXCLUDE"] == "target"
    err = render_fails(set_args({"worker.extraEnv[0].name": "CAIRN_CAPTURE_EXCLUDE",
                                 "worker.extraEnv[0].value": "*.tmp"}))
    assert "worker.captureExclude" in err, err
    for comp in ("scheduler", "reaper"):
        c = component(render(), "Deployment", comp)["spec"]["template"]["spec"]["containers"][0]
        names = set(container_env(render(), c))
        assert not names & (set(WORKER_SNAPSHOT_DEFAULTS) | {"CAIRN_BASE_IMAGE", "CAIRN_CAPTURE_EXCLUDE"}), comp


def envfrom_secrets(container):
    """Names of the Secrets a container takes whole (envFrom secretRef)."""
    return [src["secretRef"]["name"] for src in container.get("envFrom", []) if "secretRef" in src]


def test_worker_pause_limit():
    docs = render()
    assert container_env(docs, worker_container(docs))["CAIRN_PAUSE_LIMIT_SECONDS"] == "1800"
    docs = render(["--set", "worker.pauseLimitSeconds=60"])
    assert container_env(docs, worker_container(docs))["CAIRN_PAUSE_LIMIT_SECONDS"] == "60"
    # Large values stay plain integers (never 8.64e+04).
    docs = render(["--set", "worker.pauseLimitSeconds=86400"])
    assert container_env(docs, worker_container(docs))["CAIRN_PAUSE_LIMIT_SECONDS"] == "86400"
    for label, args in value_sets():
        docs = render(args)
        env = container_env(docs, worker_container(docs))
        assert env["CAIRN_PAUSE_LIMIT_SECONDS"] == str(effective_values(args)["worker"]["pauseLimitSeconds"]), label
    for comp in ("scheduler", "reaper"):
        docs = render()
        c = component(docs, "Deployment", comp)["spec"]["template"]["spec"]["containers"][0]
        assert "CAIRN_PAUSE_LIMIT_SECONDS" not in container_env(docs, c), comp
    err = render_fails(set_args({"worker.extraEnv[0].name": "CAIRN_PAUSE_LIMIT_SECONDS",
                                 "worker.extraEnv[0].value": "5"}))
    assert "worker.pauseLimitSeconds" in err, err


OBJECT_STORE_ENV = {"AWS_ENDPOINT", "AWS_ALLOW_HTTP", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def test_snapshot_store_default_is_the_bundled_object_store():
    docs = render()
    w_cm = one(docs, "ConfigMap", f"{RELEASE}-cairn-worker")
    assert w_cm["data"]["CAIRN_SNAPSHOT_STORE_URL"] == "s3://cairn"
    store = f"{RELEASE}-cairn-object-store"
    scheduler_container = component(docs, "Deployment", "scheduler")["spec"]["template"]["spec"]["containers"][0]
    for c in (worker_container(docs), reaper_container(docs), scheduler_container):
        env = {e["name"]: e for e in c["env"]}
        assert env["AWS_ENDPOINT"]["value"] == f"http://{store}:8333", c["name"]
        assert env["AWS_ALLOW_HTTP"]["value"] == "true"
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env[key]["valueFrom"]["secretKeyRef"] == {"name": store, "key": key}, c["name"]
    migration = component(docs, "Job", "migration")["spec"]["template"]["spec"]["containers"][0]
    assert not {e["name"] for e in migration["env"]} & OBJECT_STORE_ENV


def test_snapshot_store_without_the_bundled_store_is_the_artifacts_directory():
    docs = render(["--set", "objectStore.bundled.enabled=false", "--set", "worker.replicas=1"])
    assert not [d for d in docs if d["kind"] in ("StatefulSet", "Service")
                and d["metadata"]["name"].endswith("object-store")]
    for cm in of_kind(docs, "ConfigMap"):
        assert "CAIRN_SNAPSHOT_STORE_URL" not in (cm.get("data") or {}), cm["metadata"]["name"]
    for desc, spec in pod_specs(docs):
        for c in spec["containers"]:
            assert not envfrom_secrets(c), f"{desc}: envFrom Secrets {envfrom_secrets(c)}"
            assert "CAIRN_SNAPSHOT_STORE_URL" not in container_env(docs, c), desc


def test_snapshot_store_in_an_object_store():
    args = ["-f", os.path.join(CI_DIR, "snapshot-store-values.yaml")]
    no_bundled = ["--set", "objectStore.bundled.enabled=false"]
    docs = render(args)
    w_cm = one(docs, "ConfigMap", f"{RELEASE}-cairn-worker")
    assert w_cm["data"]["CAIRN_SNAPSHOT_STORE_URL"] == "s3://cairn-snapshots/prod"
    assert container_env(docs, worker_container(docs))["CAIRN_SNAPSHOT_STORE_URL"] == "s3://cairn-snapshots/prod"
    # Workers, the reaper and the scheduler (which serves steps' live output from the
    # store) get the store's credentials, from the Secret only.
    scheduler_container = component(docs, "Deployment", "scheduler")["spec"]["template"]["spec"]["containers"][0]
    for c in (worker_container(docs), reaper_container(docs), scheduler_container):
        assert envfrom_secrets(c) == ["cairn-snapshot-store"]
    # The reaper and the scheduler read through the URL each snapshot or step records:
    # they are not given the URL.
    for c in (reaper_container(docs), scheduler_container):
        assert "CAIRN_SNAPSHOT_STORE_URL" not in container_env(docs, c)
    assert not envfrom_secrets(component(docs, "Job", "migration")["spec"]["template"]["spec"]["containers"][0])
    for cm in of_kind(docs, "ConfigMap"):
        if cm["metadata"]["name"] != w_cm["metadata"]["name"]:
            assert "CAIRN_SNAPSHOT_STORE_URL" not in (cm.get("data") or {}), cm["metadata"]["name"]
    # Step output stays on the artifacts volume; no shared claim is needed for snapshots.
    assert container_env(docs, worker_container(docs))["CAIRN_ARTIFACTS_URL"] == ARTIFACTS_DIR
    assert ARTIFACTS_DIR not in [m["mountPath"] for m in reaper_container(docs)["volumeMounts"]]
    # Each setting works alone: a URL without a Secret (workload identity), a local directory.
    docs = render(no_bundled + set_args({"worker.snapshotStore.url": "gs://bucket/prefix"}))
    assert container_env(docs, worker_container(docs))["CAIRN_SNAPSHOT_STORE_URL"] == "gs://bucket/prefix"
    assert not envfrom_secrets(worker_container(docs)) and not envfrom_secrets(reaper_container(docs))
    docs = render(no_bundled + ["--set", "worker.replicas=1"]
                  + set_args({"worker.snapshotStore.url": "file:///var/lib/cairn/artifacts/snapshots"}))
    assert container_env(docs, worker_container(docs))["CAIRN_SNAPSHOT_STORE_URL"] == \
        "file:///var/lib/cairn/artifacts/snapshots"
    # A config change rolls the workers.
    before = worker(render(no_bundled + ["--set", "worker.replicas=1"]))["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    after = worker(render(args))["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert before != after


def test_snapshot_store_credentials_never_plain():
    # Credentials in the URL would land in the ConfigMap.
    for url in ("s3://AKIA:Secret-9f@bucket/prefix", "az://container/prefix?sig=abc"):
        err = render_fails(set_args({"worker.snapshotStore.url": url}))
        assert "worker.snapshotStore.existingSecret" in err, err
    for where in ("global.extraConfig.AWS_SECRET_ACCESS_KEY", "global.extraConfig.AZURE_STORAGE_ACCOUNT_KEY"):
        err = render_fails(set_args({where: "x"}))
        assert "object store credential" in err, err
    err = render_fails(set_args({"reaper.extraEnv[0].name": "GOOGLE_SERVICE_ACCOUNT_KEY",
                                 "reaper.extraEnv[0].value": "x"}))
    assert "reaper.extraEnv GOOGLE_SERVICE_ACCOUNT_KEY is an object store credential" in err, err
    # Non-secret store settings may still be plain values (for a store of one's own).
    docs = render(["-f", os.path.join(CI_DIR, "snapshot-store-values.yaml")]
                  + set_args({"global.extraConfig.AWS_REGION": "eu-west-1"}))
    assert container_env(docs, worker_container(docs))["AWS_REGION"] == "eu-west-1"
    # The connections Secret is never taken whole.
    err = render_fails(["-f", os.path.join(CI_DIR, "existing-secret-values.yaml")]
                       + set_args({"worker.snapshotStore.existingSecret": "cairn-connections"}))
    assert "Secret of the connection URLs" in err, err
    err = render_fails(set_args({"worker.snapshotStore.existingSecret": f"{RELEASE}-cairn"}))
    assert "Secret of the connection URLs" in err, err
    # A local directory must be on the artifacts volume: the root filesystem is read-only.
    for url in ("/tmp/snapshots", "file:///var/lib/cairn/workspaces/s", "/var/lib/cairn/artifactsX"):
        err = render_fails(set_args({"worker.snapshotStore.url": url}))
        assert "outside /var/lib/cairn/artifacts" in err, err


# ---------------------------------------------------------------- security


def check_container_restricted(desc, c):
    sc = c.get("securityContext") or {}
    assert sc.get("runAsNonRoot") is True, f"{desc}: runAsNonRoot"
    assert sc.get("allowPrivilegeEscalation") is False, f"{desc}: allowPrivilegeEscalation"
    assert sc.get("readOnlyRootFilesystem") is True, f"{desc}: readOnlyRootFilesystem"
    assert not sc.get("privileged"), f"{desc}: privileged"
    assert sc.get("runAsUser", 1) != 0, f"{desc}: runAsUser 0"
    caps = sc.get("capabilities") or {}
    assert caps.get("drop") == ["ALL"], f"{desc}: capabilities.drop {caps.get('drop')}"
    seccomp = (sc.get("seccompProfile") or {}).get("type", "RuntimeDefault")
    assert not caps.get("add"), f"{desc}: adds capabilities {caps.get('add')}"
    assert seccomp == "RuntimeDefault", f"{desc}: seccomp {seccomp}"


def test_security_contexts_restricted():
    for label, args in value_sets():
        docs = render(args)
        granted = effective_values(args)["worker"]["sandbox"]["grant"]
        for desc, spec in pod_specs(docs):
            where = f"{label}: {desc}"
            if granted and desc.endswith("(worker)"):
                # Checked by test_worker_sandbox_grant: the one documented exception.
                continue
            psc = spec.get("securityContext") or {}
            assert psc.get("runAsNonRoot") is True, f"{where}: pod runAsNonRoot"
            assert psc.get("runAsUser", 0) > 0, f"{where}: pod runAsUser"
            assert psc.get("runAsUser") == 10001, f"{where}: pod runAsUser {psc.get('runAsUser')}"
            assert psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{where}: pod seccomp"
            assert spec.get("automountServiceAccountToken") is False, f"{where}: token mounted"
            assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
            # hostUsers: false (a user namespace) only narrows what the pod is on the node.
            assert spec.get("hostUsers", False) is False, f"{where}: hostUsers"
            assert "hostUsers" not in spec or desc.endswith("(worker)"), f"{where}: hostUsers"
            tmp_volumes = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
            for c in spec.get("initContainers", []) + spec["containers"]:
                check_container_restricted(f"{where} container {c['name']}", c)
                tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
                assert tmp and tmp[0]["name"] in tmp_volumes, f"{where}: no writable /tmp emptyDir"


# ---------------------------------------------------------------- workloads


def test_commands_ports_and_probes():
    docs = render()
    expected = {
        "scheduler": (["cairn-scheduler"], "http", 8080, "CAIRN_LISTEN"),
        "worker": (["cairn-worker"], "metrics", 9090, "CAIRN_METRICS_LISTEN"),
        "reaper": (["cairn-reaper"], "metrics", 9090, "CAIRN_METRICS_LISTEN"),
    }
    for comp, (args, port_name, port, listen_var) in expected.items():
        c = component(docs, "Deployment", comp)["spec"]["template"]["spec"]["containers"][0]
        assert c["args"] == args, f"{comp}: args {c['args']}"
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports == {port_name: port}, f"{comp}: ports {ports}"
        env = container_env(docs, c)
        assert env[listen_var] == f"0.0.0.0:{port}", f"{comp}: {listen_var}={env.get(listen_var)}"
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port_name}, comp
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port_name}, comp
        # Listeners bind after PostgreSQL answers and migrations ran: the startup probe
        # holds liveness off that long (5 s x 60). The worker is ready once started.
        startup = c["startupProbe"]
        path = "/healthz" if comp == "worker" else "/readyz"
        assert startup["httpGet"] == {"path": path, "port": port_name}, comp
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, comp
    svc = component(docs, "Service", "scheduler")
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert component(docs, "Deployment", "reaper")["spec"]["replicas"] == 2, "a leader and a standby"


def test_pod_disruption_budgets():
    docs = render()
    for comp in ("scheduler", "worker", "reaper"):
        pdb = component(docs, "PodDisruptionBudget", comp)
        pod_labels = component(docs, "Deployment", comp)["spec"]["template"]["metadata"]["labels"]
        for k, v in pdb["spec"]["selector"]["matchLabels"].items():
            assert pod_labels.get(k) == v, f"{comp}: PDB selector {k}={v} misses the pods"
        # An unready pod never blocks a node drain.
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow", comp


def test_selectors_are_distinct_per_component():
    docs = render()
    selectors = {}
    for d in of_kind(docs, "Deployment"):
        sel = tuple(sorted(d["spec"]["selector"]["matchLabels"].items()))
        assert sel not in selectors, f"{d['metadata']['name']} shares a selector"
        selectors[sel] = d["metadata"]["name"]


def test_migration_hook():
    docs = render(set_args(FAKE_SECRETS))
    job = component(docs, "Job", "migration")
    ann = job["metadata"]["annotations"]
    # Before the release's resources, on a first install too.
    assert ann["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["containers"][0]["args"] == ["cairnctl", "migrate"]
    assert "serviceAccountName" not in spec, "the chart's ServiceAccount does not exist yet"
    # The release's Secret does not exist yet either: a hook Secret of its own, made
    # before the Job, holding the database URL alone, and deleted whatever the outcome.
    hook = one(docs, "Secret", f"{RELEASE}-cairn-migration")
    hook_ann = hook["metadata"]["annotations"]
    assert hook_ann["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(hook_ann["helm.sh/hook-weight"]) < int(ann["helm.sh/hook-weight"])
    assert hook_ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded,hook-failed"
    assert set(hook["data"]) == {"CAIRN_DATABASE_URL"}
    assert base64.b64decode(hook["data"]["CAIRN_DATABASE_URL"]).decode() == FAKE_SECRETS["secrets.databaseUrl"]
    assert secret_sources(spec) == {"CAIRN_DATABASE_URL": (f"{RELEASE}-cairn-migration", f"{SECRET_DIR}/database-url", False)}
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["CAIRN_DATABASE_URL_FILE"] == f"{SECRET_DIR}/database-url"
    # With an existing Secret the hook reads it, and the chart makes no hook Secret.
    docs = render(["-f", os.path.join(CI_DIR, "existing-secret-values.yaml")])
    spec = component(docs, "Job", "migration")["spec"]["template"]["spec"]
    assert {name for name, _, _ in secret_sources(spec).values()} == {"cairn-connections"}
    assert not [s for s in of_kind(docs, "Secret") if "helm.sh/hook" in s["metadata"].get("annotations", {})]
    docs = render(["--set", "migration.enabled=false"])
    assert not of_kind(docs, "Job")
    assert not [s for s in of_kind(docs, "Secret") if "helm.sh/hook" in s["metadata"].get("annotations", {})]
    assert container_env(docs, worker_container(docs))["CAIRN_MIGRATE"] == "true"


def test_bundled_object_store():
    docs = render()
    name = f"{RELEASE}-cairn-object-store"
    sts = one(docs, "StatefulSet", name)
    spec = sts["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert c["image"] == "chrislusf/seaweedfs:4.19"
    script = c["args"][0]
    # Only the S3 gateway listens beyond loopback; volumes sized from the disk.
    assert "weed -logtostderr server -dir=/data -ip=127.0.0.1 -ip.bind=127.0.0.1 -filer" in script
    assert "-volume.max=0" in script and "s3.bucket.create" in script
    assert "weed -logtostderr s3 -ip.bind=0.0.0.0 -port=8333 -config=/tmp/s3.json" in script
    np = one(docs, "NetworkPolicy", name)
    assert np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "object-store"
    (rule,) = np["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8333, "protocol": "TCP"}]
    assert sorted(p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"]) == \
        ["reaper", "scheduler", "worker"]
    # A StatefulSet's name leaves room for its pods' revision label.
    long = render(set_args({"fullnameOverride": "c" * 60}))
    (sts_long,) = [d for d in long if d["kind"] == "StatefulSet"]
    assert len(sts_long["metadata"]["name"]) <= 52
    assert {e["name"]: e.get("value") for e in c["env"]}["BUCKET"] == "cairn"
    # Ready only once its bucket exists; its data on a claim of its own.
    assert c["readinessProbe"]["exec"]["command"] == ["test", "-f", "/data/.bucket-ready"]
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    check_container_restricted(f"StatefulSet/{name}", c)
    assert spec["automountServiceAccountToken"] is False
    service = one(docs, "Service", name)
    assert service["spec"]["ports"] == [{"name": "s3", "port": 8333, "targetPort": "s3", "protocol": "TCP"}]
    secret = one(docs, "Secret", name)
    keys = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert set(keys) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert len(keys["AWS_ACCESS_KEY_ID"]) == 20 and len(keys["AWS_SECRET_ACCESS_KEY"]) == 40
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # An existing Secret of credentials: the chart makes none.
    docs = render(set_args({"objectStore.bundled.existingSecret": "my-s3"}))
    assert not [s for s in of_kind(docs, "Secret") if s["metadata"]["name"] == name]
    env = {e["name"]: e for e in worker_container(docs)["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "my-s3"
    # With a store of one's own the bundled one is off, and both at once is refused.
    err = render_fails(set_args({"worker.snapshotStore.url": "s3://mine/cairn"}))
    assert "objectStore.bundled.enabled is true but worker.snapshotStore.url is set" in err, err


def test_pod_local_artifacts_with_more_than_one_worker_are_refused():
    err = render_fails(["--set", "objectStore.bundled.enabled=false"])
    assert "worker.replicas is 2 but the workers' artifacts are pod-local" in err, err
    # Every problem at once, not the first alone.
    err = render_fails(["--set", "objectStore.bundled.enabled=false", "--set", "scheduler.preStopSeconds=40"])
    assert "2 problem(s) in the values" in err and "scheduler.preStopSeconds" in err, err
    render(["--set", "objectStore.bundled.enabled=false", "--set", "worker.replicas=1"])
    render(["-f", os.path.join(CI_DIR, "artifacts-claim-values.yaml")])


def test_worker_workspace_volumes():
    docs = render()
    spec = worker(docs)["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in worker_container(docs)["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols[mounts[WORKSPACES_DIR]]["emptyDir"] == {"sizeLimit": "50Gi"}
    docs = render(set_args({"worker.workspaces.emptyDir.sizeLimit": ""}))
    vols = {v["name"]: v for v in worker(docs)["spec"]["template"]["spec"]["volumes"]}
    assert vols["workspaces"]["emptyDir"] == {}, "empty: no limit"
    docs = render(["-f", os.path.join(CI_DIR, "emptydir-limit-values.yaml")])
    spec = worker(docs)["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["workspaces"]["emptyDir"] == {"sizeLimit": "80Gi"}
    docs = render(["-f", os.path.join(CI_DIR, "ephemeral-workspaces-values.yaml")])
    spec = worker(docs)["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in worker_container(docs)["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    vol = vols[mounts[WORKSPACES_DIR]]
    assert "emptyDir" not in vol
    claim = vol["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == "200Gi"
    assert claim["storageClassName"] == "fast-ssd"
    assert claim["accessModes"] == ["ReadWriteOnce"]
    assert spec["securityContext"]["fsGroup"] == 10001, "the claim must be writable by the worker"


def test_service_monitors():
    docs = render(["-f", os.path.join(CI_DIR, "servicemonitor-values.yaml")])
    monitors = of_kind(docs, "ServiceMonitor")
    assert len(monitors) == 3
    services = of_kind(docs, "Service")
    comps = set()
    for sm in monitors:
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        assert sm["metadata"]["labels"]["release"] == "prometheus"
        sel = sm["spec"]["selector"]["matchLabels"]
        matched = [s for s in services if all(s["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        assert len(matched) == 1, f"{sm['metadata']['name']} selects {len(matched)} Services"
        for ep in sm["spec"]["endpoints"]:
            assert ep["path"] == "/metrics"
            assert ep["port"] in [p["name"] for p in matched[0]["spec"]["ports"]]
        comps.add(sel["app.kubernetes.io/component"])
    assert comps == {"scheduler", "worker", "reaper"}
    assert not of_kind(render(), "ServiceMonitor")


# ---------------------------------------------------------------- runner


def main():
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_") and callable(f)]
    # test_operations.py imports its helpers from this module: give it this one, not a
    # second copy with a cache of its own.
    sys.modules.setdefault("test_rendered", sys.modules[__name__])
    import test_operations  # noqa: E402 - imported here, after the helpers exist

    tests += [(n, f) for n, f in vars(test_operations).items()
              if n.startswith("test_") and callable(f) and f.__module__ == "test_operations"]
    passed = failed = 0
    for name, fn in tests:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report every kind of failure
            failed += 1
            print(f"FAIL {name}")
            detail = str(e) if isinstance(e, AssertionError) and str(e) else traceback.format_exc()
            for line in detail.strip().splitlines():
                print(f"     {line}")
        else:
            passed += 1
            print(f"PASS {name}")
    print(f"test_rendered: {passed} passed, {failed} failed")
    return 1 if failed else 0



# ---------------------------------------------------------------- step sandbox


def test_worker_sandbox_settings():
    docs = render()
    env = container_env(docs, worker_container(docs))
    # Required: a worker pod that cannot isolate steps runs none, and says why.
    assert env["CAIRN_SANDBOX"] == "required"
    assert env["CAIRN_STEP_NETWORK"] == "true"
    assert env["CAIRN_STEP_MEMORY_MB"] == "8192"
    assert env["CAIRN_STEP_PIDS"] == "4096"
    assert env["CAIRN_STEP_CPU_SECONDS"] == "0"
    assert env["CAIRN_STEP_OPEN_FILES"] == "65536"
    spec = worker(docs)["spec"]["template"]["spec"]
    # The grant the sandbox needs is on by default.
    assert "runtimeClassName" not in spec and spec["hostUsers"] is False
    for label, args in value_sets():
        docs = render(args)
        env = container_env(docs, worker_container(docs))
        sandbox = effective_values(args)["worker"]["sandbox"]
        assert env["CAIRN_SANDBOX"] == sandbox["mode"], label
        assert env["CAIRN_STEP_PIDS"] == str(sandbox["pids"]), label
    for comp in ("scheduler", "reaper"):
        c = component(render(), "Deployment", comp)["spec"]["template"]["spec"]["containers"][0]
        assert "CAIRN_SANDBOX" not in container_env(render(), c), comp
    err = render_fails(set_args({"worker.sandbox.mode": "sometimes"}))
    assert "mode" in err, err
    err = render_fails(["--set", "worker.sandbox.pids=2"])
    assert "pids" in err, err


def test_worker_sandbox_grant():
    """grant: the pod gets its own user namespace, the worker container an unmasked
    /proc and the chosen seccomp profile; nothing else of the restricted context moves,
    and no other component changes."""
    grant = ["--set", "worker.sandbox.grant=true"]
    args = grant + set_args({"worker.runtimeClassName": "gvisor"})
    docs = render(args)
    spec = worker(docs)["spec"]["template"]["spec"]
    assert spec["hostUsers"] is False
    assert spec["runtimeClassName"] == "gvisor"
    sc = worker_container(docs)["securityContext"]
    assert sc["procMount"] == "Unmasked"
    assert sc["seccompProfile"] == {"type": "Unconfined"}
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["runAsNonRoot"] is True and not sc.get("privileged")
    for desc, other in pod_specs(docs):
        if not desc.endswith("(worker)"):
            assert "hostUsers" not in other, desc
            for c in other["containers"]:
                check_container_restricted(desc, c)
    local = grant + set_args({"worker.sandbox.seccompProfile.type": "Localhost",
                      "worker.sandbox.seccompProfile.localhostProfile": "profiles/cairn-sandbox.json"})
    sc = worker_container(render(local))["securityContext"]
    assert sc["seccompProfile"] == {"type": "Localhost", "localhostProfile": "profiles/cairn-sandbox.json"}
    err = render_fails(grant + set_args({"worker.sandbox.seccompProfile.type": "Localhost"}))
    assert "localhostProfile" in err, err


# ---------------------------------------------------------------- ingress, alerts, dashboard, helm test

OPERABILITY = ["-f", os.path.join(CI_DIR, "operability-values.yaml")]
DASHBOARD_FILE = os.path.join(CHART, "files", "cairn-dashboard.json")
RULE_TEMPLATE = os.path.join(CHART, "templates", "prometheusrule.yaml")
# Metrics registered with registry.register() rather than register_metrics!: their kind,
# which the call does not show (each is checked to be registered exactly so).
DIRECT_REGISTRATIONS = {
    "dependency_up": "gauge",  # crates/common/src/health.rs: Family<_, Gauge>
    "worker_step_egress_refused_packets": "counter",  # crates/worker/src/metrics.rs: isolation.refused()
    "worker_sandbox_capability": "gauge",  # crates/worker/src/metrics.rs: Family<_, Gauge>
}
# PromQL words the rules and the dashboard may use besides metric names.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "rate", "increase", "histogram_quantile", "vector",
    "by", "on", "and", "or", "unless", "absent",
}
# Labels that pick a release's series (the Prometheus Operator's target labels).
SCOPE_LABELS = {"namespace", "job"}


def exported_metrics():
    """{name: kind} of every series the binaries export: each register_metrics! entry and
    registry.register call in crates/*/src, prefixed "cairn_" (the registry's prefix), a
    counter with "_total", a histogram as "_bucket", "_sum" and "_count" (prometheus-client's
    text format)."""
    kinds, direct = {}, set()
    for path in glob.glob(os.path.join(REPO, "crates", "*", "src", "**", "*.rs"), recursive=True):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        fields = {}
        for field, ty in re.findall(r"^\s*pub (\w+): (.+),\s*$", text, re.M):
            fields.setdefault(field, set()).add(ty)
        for block in re.findall(r"register_metrics!\(\s*\w+;(.*?)\);", text, re.S):
            for name, field in re.findall(r'"([a-z_]+)",\s*"(?:[^"\\]|\\.)*"\s*=>\s*\w+\.(\w+);', block):
                # The field's metric type (another struct of the file may share the name).
                found = {
                    "histogram" if "Histogram" in ty else "counter" if "Counter" in ty else "gauge"
                    for ty in fields.get(field, ())
                    if re.search(r"\b(Histogram|Counter|Gauge)\b", ty)
                }
                assert len(found) == 1, f"{path}: {name}: field {field} is {fields.get(field)}"
                kinds[name] = found.pop()
        direct |= set(re.findall(r'registry\.register\(\s*"([a-z_]+)"', text))
    assert direct == set(DIRECT_REGISTRATIONS), f"registry.register calls: {sorted(direct)}"
    kinds.update(DIRECT_REGISTRATIONS)
    names = {}
    for base, kind in kinds.items():
        full = f"cairn_{base}"
        if kind == "counter":
            names[f"{full}_total"] = kind
        elif kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                names[full + suffix] = kind
        else:
            names[full] = kind
    # The metrics docs/OPERATING.md lists, so the parsing above cannot come back empty.
    for name in ("cairn_runs_admitted_total", "cairn_dependency_up", "cairn_reaper_leader",
                 "cairn_worker_claim_latency_seconds_bucket", "cairn_outbox_publish_failures_total",
                 "cairn_sweeper_needs_reconciliation_total", "cairn_reaper_items_total"):
        assert name in names, f"{name} not found among the registrations"
    return names


def reaper_rule_outcomes():
    """(rule, outcome) pairs cairn_reaper_items_total carries (ReaperMetrics::observe)."""
    pairs = set(re.findall(r'self\.count\("(\w+)", "(\w+)"', _read_source("crates/reaper/src/lib.rs")))
    assert ("reclaim", "failed") in pairs, pairs
    return pairs


def sandbox_capabilities():
    text = _read_source("crates/worker/src/isolation/probe.rs")
    body = re.search(r"fn capabilities\(&self\).*?\[(.*?)\]\s*\}", text, re.S).group(1)
    return set(re.findall(r'\("(\w+)",', body))


def promql_uses(expr):
    """(metric names, [(metric, label, op, value)], grouping labels) of a PromQL
    expression; every other word must be PromQL's."""
    matchers, grouping = [], set()
    for metric, body in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}", expr):
        for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', body):
            matchers.append((metric, label, op, value))
    for group in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr):
        grouping |= {g.strip() for g in group.split(",") if g.strip()}
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(?:by|on)\s*\([^)]*\)", " ", expr)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)) - PROMQL_WORDS
    return words, matchers, grouping


def check_promql(where, expr, exported):
    metrics, matchers, grouping = promql_uses(expr)
    assert metrics, f"{where}: no metric in {expr!r}"
    unknown = metrics - set(exported)
    assert not unknown, f"{where}: {sorted(unknown)} are not exported by the code (or not PromQL)"
    pairs = reaper_rule_outcomes()
    for metric, label, op, value in matchers:
        if label in SCOPE_LABELS:
            continue
        values = value.split("|") if op == "=~" else [value]
        if metric == "cairn_reaper_items_total":
            assert label in ("rule", "outcome"), f"{where}: {metric} has no label {label}"
            known = {p[0] if label == "rule" else p[1] for p in pairs}
            assert set(values) <= known, f"{where}: {metric}{{{label}}} never is {values}"
        elif metric == "cairn_dependency_up":
            known = set(re.findall(r'record\("(\w+)"', _read_source("crates/common/src/health.rs")))
            assert label == "dependency" and set(values) <= known, f"{where}: {label}={values}"
        elif metric == "cairn_worker_sandbox_capability":
            assert label == "capability" and set(values) <= sandbox_capabilities(), f"{where}: {label}={values}"
        else:
            raise AssertionError(f"{where}: {metric} is matched on {label}, which the code does not set")
    labels_of = {"cairn_dependency_up": {"dependency"}, "cairn_reaper_items_total": {"rule", "outcome"},
                 "cairn_worker_sandbox_capability": {"capability"}}
    allowed = SCOPE_LABELS | {"le"} | set().union(*(labels_of.get(m, set()) for m in metrics))
    assert grouping <= allowed, f"{where}: groups by {sorted(grouping - allowed)}"
    # Reaper outcomes that exist together: rule and outcome of one matcher set pair up.
    rules = [v for m, l, o, v in matchers if m == "cairn_reaper_items_total" and l == "rule"]
    outcomes = [v for m, l, o, v in matchers if m == "cairn_reaper_items_total" and l == "outcome"]
    for r in rules:
        for o in outcomes:
            for one_rule in r.split("|"):
                assert (one_rule, o) in pairs, f"{where}: the reaper never counts rule {one_rule} as {o}"


def alert_rules(docs):
    (rule,) = of_kind(docs, "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_operability_objects_off_by_default():
    """The Ingress, the PrometheusRule and the dashboard are off by default. The helm test
    Pod is on (tests.enabled: Helm creates it only on "helm test") but is rendered only when
    a token can be there: not with the defaults, which have no bootstrap token."""
    docs = render()
    for kind in ("Ingress", "PrometheusRule", "Pod"):
        assert not of_kind(docs, kind), f"{kind} rendered by default"
    names = [cm["metadata"]["name"] for cm in of_kind(docs, "ConfigMap")]
    assert f"{RELEASE}-cairn-dashboard" not in names, names
    values = effective_values([])
    assert values["ingress"]["enabled"] is False
    assert values["metrics"]["prometheusRule"]["enabled"] is False
    assert values["metrics"]["dashboard"]["enabled"] is False
    assert values["tests"]["enabled"] is True


def test_ingress_routes_to_the_scheduler_service():
    docs = render(OPERABILITY)
    (ing,) = of_kind(docs, "Ingress")
    svc = component(docs, "Service", "scheduler")
    port = svc["spec"]["ports"][0]["port"]
    assert ing["apiVersion"] == "networking.k8s.io/v1"
    assert ing["spec"]["ingressClassName"] == "nginx"
    assert ing["spec"]["tls"] == [{"secretName": "cairn-tls", "hosts": ["cairn.example.com"]}]
    assert ing["metadata"]["annotations"]["cert-manager.io/cluster-issuer"] == "letsencrypt"
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "cairn.example.com"
    for path in rule["http"]["paths"]:
        assert path["backend"] == {"service": {"name": svc["metadata"]["name"], "port": {"number": port}}}
    assert [p["path"] for p in rule["http"]["paths"]] == ["/"], "the API and the console share /"
    # The defaults: every host, "/", no TLS; the backend follows the Service's port.
    docs = render(["--set", "ingress.enabled=true", "--set", "scheduler.service.port=9000"])
    (ing,) = of_kind(docs, "Ingress")
    (rule,) = ing["spec"]["rules"]
    assert "host" not in rule and "tls" not in ing["spec"] and "ingressClassName" not in ing["spec"]
    assert rule["http"]["paths"] == [{"path": "/", "pathType": "Prefix", "backend": {
        "service": {"name": f"{RELEASE}-cairn-scheduler", "port": {"number": 9000}}}}]
    for bad in (["--set", "ingress.bogus=1"],
                ["--set", "ingress.enabled=true", "--set-string", "ingress.hosts[0].paths[0].pathType=Glob",
                 "--set-string", "ingress.hosts[0].paths[0].path=/"],
                ["--set-string", "ingress.tls[0].hosts[0]=a.example"],
                ["--set-string", "ingress.hosts[0].host=Not A Host"]):
        render_fails(bad)


def test_prometheus_rule_uses_only_exported_metrics():
    exported = exported_metrics()
    docs = render(OPERABILITY)
    (rule,) = of_kind(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    rules = alert_rules(docs)
    with open(os.path.join(CHART, "values.schema.json"), encoding="utf-8") as f:
        schema = json.load(f)
    names = schema["properties"]["metrics"]["properties"]["prometheusRule"]["properties"]["disabled"]["items"]["enum"]
    assert set(rules) == set(names), f"alerts {sorted(rules)} != the schema's {sorted(names)}"
    with open(RULE_TEMPLATE, encoding="utf-8") as f:
        listed = set(re.findall(r"^\s+(cairn_\w+)", f.read().split("*/", 1)[0], re.M))
    services = {s["metadata"]["name"] for s in of_kind(docs, "Service")}
    used = set()
    for name, r in rules.items():
        assert r["labels"]["severity"] in ("critical", "warning"), name
        assert r["labels"]["team"] == "platform", f"{name}: alertLabels"
        assert r["annotations"]["summary"] and r["annotations"]["description"], name
        assert re.fullmatch(r"([0-9]+(ms|s|m|h|d))+", r["for"]), f"{name}: for {r.get('for')}"
        check_promql(name, r["expr"], exported)
        metrics, matchers, _ = promql_uses(r["expr"])
        used |= metrics
        # The default selector: this namespace and the jobs of this release's Services,
        # the job label the Prometheus Operator gives a ServiceMonitor's targets.
        jobs = [v for _, l, o, v in matchers if l == "job"]
        assert jobs, f"{name}: not scoped to the release's jobs"
        for job in jobs:
            assert set(job.split("|")) <= services, f"{name}: job {job} is no Service of the release"
        assert all(v == "default" for _, l, _, v in matchers if l == "namespace"), name
    assert used <= listed, f"the template's list of metrics lacks {sorted(used - listed)}"
    assert listed <= set(exported), f"the template lists {sorted(listed - set(exported))}"
    assert rules["CairnClaimLatencyHigh"]["expr"].rstrip().endswith("> 20")
    # What every alert needs exists: the ServiceMonitors' jobs are the rules' jobs.
    monitored = {sel for sm in of_kind(docs, "ServiceMonitor")
                 for sel in [sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]]}
    assert monitored == {"scheduler", "worker", "reaper"}
    # A selector of one's own replaces the default everywhere; disabled alerts go.
    docs = render(OPERABILITY + set_args({"metrics.prometheusRule.selector": r'cluster="eu-1"\,namespace="cairn"',
                                          "metrics.prometheusRule.disabled[0]": "CairnClaimLatencyHigh"}))
    rules = alert_rules(docs)
    assert "CairnClaimLatencyHigh" not in rules
    for name, r in rules.items():
        _, matchers, _ = promql_uses(r["expr"])
        assert not [m for m in matchers if m[1] == "job"], name
        assert ("cluster", "eu-1") in [(l, v) for _, l, _, v in matchers], name
    # Reclamation failures alert only where the reaper can reach the snapshots; no
    # reaper, no reaper alerts.
    for label, args in value_sets():
        args = args + ["--set", "metrics.prometheusRule.enabled=true"]
        docs = render(args)
        shared = container_env(docs, worker_container(docs))["CAIRN_SNAPSHOTS_SHARED"] == "true"
        assert ("CairnReaperFailing" in alert_rules(docs)) == shared, label
    rules = alert_rules(render(["--set", "metrics.prometheusRule.enabled=true", "--set", "reaper.replicas=0"]))
    assert not [n for n in rules if n.startswith("CairnReaper")], sorted(rules)
    for bad in (["--set", "metrics.prometheusRule.bogus=1"],
                ["--set-string", "metrics.prometheusRule.disabled[0]=CairnNope"],
                ["--set", "metrics.prometheusRule.claimLatency.seconds=60"],
                ["--set-string", "metrics.prometheusRule.workWaiting.window=15 minutes"],
                ["--set-string", "metrics.prometheusRule.selector={job=\"x\"}"]):
        render_fails(bad)


def test_dashboard_is_json_on_real_metrics():
    exported = exported_metrics()
    with open(DASHBOARD_FILE, encoding="utf-8") as f:
        text = f.read()
    dashboard = json.loads(text)
    exprs = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            exprs.append((panel["title"], target["expr"]))
            check_promql(f"panel {panel['title']!r}", target["expr"], exported)
    assert len(exprs) >= 10, exprs
    used = set().union(*(promql_uses(e)[0] for _, e in exprs))
    for needed in ("cairn_runs_admitted_total", "cairn_flow_waiting", "cairn_worker_claim_latency_seconds_bucket",
                   "cairn_sweeper_needs_reconciliation_total", "cairn_worker_jobs_claimed_total",
                   "cairn_reaper_items_total", "cairn_reaper_leader", "cairn_outbox_published_total",
                   "cairn_outbox_publish_failures_total", "cairn_dependency_up"):
        assert needed in used, f"the dashboard shows no {needed}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    docs = render(OPERABILITY)
    cm = one(docs, "ConfigMap", f"{RELEASE}-cairn-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Cairn"}
    assert json.loads(cm["data"]["cairn-dashboard.json"]) == dashboard
    render_fails(["--set", "metrics.dashboard.bogus=1"])


def test_helm_test_pod_runs_cairnctl_against_the_scheduler():
    cli = _read_source("crates/cli/src/main.rs")
    assert 'env = "CAIRN_SERVER"' in cli and 'env = "CAIRN_TOKEN"' in cli
    runs_src = _read_source("crates/cli/src/commands/runs.rs")
    assert "Submit {" in runs_src and "Watch {" in runs_src and "unclaimed_seconds: u64" in runs_src
    docs = render(OPERABILITY)
    (pod,) = of_kind(docs, "Pod")
    ann = pod["metadata"]["annotations"]
    assert ann["helm.sh/hook"] == "test"
    assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == 600
    assert spec["automountServiceAccountToken"] is False
    # The pod and container security contexts of the other pods.
    assert spec["securityContext"] == component(docs, "Deployment", "scheduler")["spec"]["template"]["spec"]["securityContext"]
    (c,) = spec["containers"]
    check_container_restricted("test pod", c)
    assert c["image"] == component(docs, "Deployment", "scheduler")["spec"]["template"]["spec"]["containers"][0]["image"]
    script = c["args"][-1]
    assert "cairnctl runs submit" in script and 'cairnctl runs watch "$run"' in script
    svc = component(docs, "Service", "scheduler")
    env = {e["name"]: e for e in c["env"]}
    assert env["CAIRN_SERVER"]["value"] == f"http://{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}"
    # The token: a file of the one key, never a variable of the spec.
    assert "CAIRN_TOKEN" not in env and all("valueFrom" not in e for e in env.values())
    assert not c.get("envFrom")
    secret_volumes = [v for v in spec["volumes"] if "secret" in v or "projected" in v]
    assert secret_volumes == [{"name": "token", "secret": {
        "secretName": f"{RELEASE}-cairn", "defaultMode": 0o440, "optional": True,
        "items": [{"key": "CAIRN_BOOTSTRAP_ADMIN_TOKEN", "path": "bootstrap-admin-token"}]}}]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert set(mounts) == {"tmp", "token"} and mounts["token"]["readOnly"] is True
    assert env["TOKEN_FILE"]["value"] == f"{mounts['token']['mountPath']}/bootstrap-admin-token"
    # cairnctl reads it from that file itself (crates/common/src/secret_files.rs).
    assert env["CAIRN_TOKEN_FILE"]["value"] == env["TOKEN_FILE"]["value"]
    assert '("CAIRN_TOKEN", false)' in _read_source("crates/common/src/secret_files.rs")
    assert "export CAIRN_TOKEN" not in script
    # The run's single step asks for no network (the chart's non-root worker has no NAT).
    run_file = re.search(r"<<'RUN'\n(.*?)\nRUN\n", script, re.S).group(1)
    run = yaml.safe_load(run_file)
    assert run["agent"] and len(run["steps"]) == 1 and run["steps"][0]["network"] is False
    # No token configured: no test Pod; an existing Secret's key, under its own name.
    assert not of_kind(render(), "Pod")
    assert not of_kind(render(OPERABILITY + ["--set", "tests.enabled=false"]), "Pod")
    docs = render(["--set-string", "secrets.existingSecret=conn",
                   "--set-string", "secrets.keys.bootstrapAdminToken=admin-token"], bare=True)
    (pod,) = of_kind(docs, "Pod")
    (vol,) = [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert vol["secret"]["secretName"] == "conn"
    assert vol["secret"]["items"] == [{"key": "admin-token", "path": "bootstrap-admin-token"}]
    assert "'admin-token' of the Secret 'conn'" in pod["spec"]["containers"][0]["args"][-1]
    render_fails(["--set", "tests.bogus=1"])


if __name__ == "__main__":
    sys.exit(main())
