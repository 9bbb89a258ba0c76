#!/usr/bin/env python3
"""Assertions on the manifests the Cairn chart renders.

Run by scripts/helm-check with the environment variable HELM pointing at a helm binary
(default: "helm" on PATH) and KUBE_VERSION (default 1.29.0). Plain asserts, no test
framework: each test_* function is run in order and reported as PASS or FAIL, and the
last line reads "test_rendered: N passed, M failed".
"""

import base64
import json
import os
import re
import subprocess
import sys
import traceback

import yaml

CHART = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CI_DIR = os.path.join(CHART, "ci")
HELM = os.environ.get("HELM", "helm")
KUBE_VERSION = os.environ.get("KUBE_VERSION", "1.29.0")
RELEASE = "t"
WORKSPACES_DIR = "/var/lib/cairn/workspaces"

# Fake secret values: distinctive, so that finding one anywhere is never a coincidence.
FAKE_SECRETS = {
    "secrets.databaseUrl": "postgres://cairn:Db-Pw-5f1e2a@db.example:5432/cairn",
    "secrets.redisUrl": "redis://:Redis-Pw-93bd07@redis.example:6379/0",
    "secrets.amqpUrl": "amqp://cairn:Amqp-Pw-c4e811@mq.example:5672/%2f",
    "secrets.bootstrapAdminToken": "boot-token-7d0c5b9e41",
    "secrets.artifactsUrl": "s3://ak-4a1b:sk-88f0e3@artifacts.example/cairn",
    "secrets.amqpManagementUrl": "http://cairn:Mgmt-Pw-2be9a6@mq.example:15672/%2f",
}


# ---------------------------------------------------------------- rendering helpers


def ci_files():
    return sorted(
        os.path.join(CI_DIR, f) for f in os.listdir(CI_DIR) if f.endswith((".yaml", ".yml"))
    )


def value_sets():
    """(label, helm arguments) for the default values and every ci values file."""
    sets = [("default values", [])]
    sets += [(os.path.relpath(f, CHART), ["-f", f]) for f in ci_files()]
    return sets


_cache = {}


def helm_template(args):
    """Run helm template; return (exit code, stdout, stderr)."""
    key = tuple(args)
    if key not in _cache:
        cmd = [HELM, "template", RELEASE, CHART, "--kube-version", KUBE_VERSION] + list(args)
        p = subprocess.run(cmd, capture_output=True, text=True, check=False)
        _cache[key] = (p.returncode, p.stdout, p.stderr)
    return _cache[key]


def render(args=()):
    """Render and parse; fail the test if helm fails."""
    rc, out, err = helm_template(list(args))
    assert rc == 0, f"helm template {' '.join(args)} failed: {err.strip()}"
    return [d for d in yaml.safe_load_all(out) if d]


def render_fails(args):
    """Render, expecting failure; return helm's error output."""
    rc, _, err = helm_template(list(args))
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
    """(description, pod spec) of every workload."""
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            comp = d["metadata"]["labels"]["app.kubernetes.io/component"]
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


def worker_container(docs):
    containers = worker(docs)["spec"]["template"]["spec"]["containers"]
    return [c for c in containers if c["name"] == "worker"][0]


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
        ["--set", "worker.terminationMarginSeconds=0"],
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
        for d in render(args):
            labels = d["metadata"].get("labels", {})
            missing = [k for k in required if k not in labels]
            assert not missing, f"{label}: {d['kind']}/{d['metadata']['name']} lacks {missing}"


# ---------------------------------------------------------------- worker shutdown


def test_worker_grace_period_exceeds_drain_and_capture():
    cases = value_sets() + [
        ("long drain", ["--set", "worker.drainSeconds=3600", "--set", "worker.captureSeconds=1800"]),
        ("no capture", ["--set", "worker.captureSeconds=0", "--set", "worker.drainSeconds=0"]),
    ]
    for label, args in cases:
        docs = render(args)
        grace = worker(docs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        env = container_env(docs, worker_container(docs))
        drain = int(env["CAIRN_DRAIN_SECONDS"])
        capture = int(env["CAIRN_CAPTURE_SECONDS"])
        assert isinstance(grace, int), f"{label}: grace period {grace!r} is not an integer"
        assert grace > drain, f"{label}: grace {grace} <= CAIRN_DRAIN_SECONDS {drain}"
        assert grace > drain + capture, f"{label}: grace {grace} <= drain {drain} + capture {capture}"


def test_worker_defaults():
    docs = render()
    env = container_env(docs, worker_container(docs))
    assert env["CAIRN_WORKER_CONCURRENCY"] == "4"
    assert env["CAIRN_LEASE_TTL_SECONDS"] == "30"
    assert env["CAIRN_DRAIN_SECONDS"] == "60"
    assert env["CAIRN_METRICS_LISTEN"] == "0.0.0.0:9090"
    assert env["CAIRN_WORKSPACES_DIR"] == WORKSPACES_DIR
    assert env["CAIRN_QUEUE_PREFIX"] == ""
    assert env["CAIRN_MIGRATE"] == "false", "the hook migrates, not the pods"
    assert env["CAIRN_LOG_FORMAT"] == "json"
    assert env["CAIRN_CONFINEMENT"] == "false"
    assert worker_container(docs)["args"] == ["cairn-worker"]
    assert worker(docs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 210


# ---------------------------------------------------------------- scaling


def test_keda_and_hpa_together_fail():
    err = render_fails(
        ["--set", "worker.keda.enabled=true", "--set", "worker.autoscaling.enabled=true"]
        + set_args({"secrets.amqpManagementUrl": FAKE_SECRETS["secrets.amqpManagementUrl"]})
    )
    assert "worker.keda.enabled and worker.autoscaling.enabled are both true" in err, err


def test_keda_without_management_url_fails():
    err = render_fails(["--set", "worker.keda.enabled=true"])
    assert "secrets.amqpManagementUrl" in err, err


def test_keda_scaled_object():
    docs = render(["-f", os.path.join(CI_DIR, "keda-values.yaml")])
    so = one(docs, "ScaledObject", f"{RELEASE}-cairn-worker")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] == worker(docs)["metadata"]["name"]
    assert "replicas" not in worker(docs)["spec"], "KEDA owns the replicas"
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 900
    assert not [
        h for h in of_kind(docs, "HorizontalPodAutoscaler")
        if h["spec"]["scaleTargetRef"]["name"] == worker(docs)["metadata"]["name"]
    ], "an HPA next to the ScaledObject"
    secret = one(docs, "Secret", f"{RELEASE}-cairn")
    for trig in spec["triggers"]:
        md = trig["metadata"]
        assert trig["type"] == "rabbitmq"
        # http: the management API counts ready + unacked messages; amqp counts ready only.
        assert md["protocol"] == "http", md
        assert md["mode"] == "QueueLength", md
        assert md.get("excludeUnacknowledged", "false") == "false", md
        assert md["value"] == "4", "target defaults to worker.concurrency"
        assert "host" not in md, "credentials must come from the TriggerAuthentication"
        ta = one(docs, "TriggerAuthentication", trig["authenticationRef"]["name"])
        (ref,) = ta["spec"]["secretTargetRef"]
        assert ref["parameter"] == "host"
        assert ref["name"] == secret["metadata"]["name"]
        assert ref["key"] in secret["data"], "the management URL key is in the Secret"
    (trig,) = spec["triggers"]
    regex = re.compile(trig["metadata"]["queueName"])
    assert trig["metadata"]["useRegex"] == "true" and trig["metadata"]["operation"] == "sum"
    for q in ("cairn.runs", "cairn.continuations", "cairn.verifications"):
        assert regex.search(q), f"{q} not matched by {regex.pattern}"
    for q in ("cairn.dead", "cairnXruns", "other.cairn.runs", "cairn.runs.x"):
        assert not regex.search(q), f"{q} wrongly matched by {regex.pattern}"


def test_keda_one_trigger_per_queue():
    docs = render(["-f", os.path.join(CI_DIR, "keda-per-queue-values.yaml")])
    so = one(docs, "ScaledObject", f"{RELEASE}-cairn-worker")
    names = sorted(t["metadata"]["queueName"] for t in so["spec"]["triggers"])
    assert names == [
        "staging.cairn.continuations",
        "staging.cairn.runs",
        "staging.cairn.verifications",
    ], names
    for t in so["spec"]["triggers"]:
        assert t["metadata"]["protocol"] == "http" and t["metadata"]["value"] == "8"
        ta = one(docs, "TriggerAuthentication", t["authenticationRef"]["name"])
        assert ta["spec"]["secretTargetRef"][0]["name"] == "cairn-connections"
    env = container_env(docs, worker_container(docs))
    assert env["CAIRN_QUEUE_PREFIX"] == "staging."


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
    assert component(docs, "Deployment", "reaper")["spec"]["replicas"] == 2


def test_no_autoscaler_by_default():
    docs = render()
    assert not of_kind(docs, "HorizontalPodAutoscaler")
    assert not of_kind(docs, "ScaledObject")
    assert worker(docs)["spec"]["replicas"] == 2


# ---------------------------------------------------------------- secrets


def test_secret_values_never_in_configmaps():
    docs = render(set_args(FAKE_SECRETS) + ["--set", "worker.keda.enabled=true"])
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
    # Connection settings reach the pods through secretKeyRef only.
    for desc, spec in pod_specs(docs):
        for c in spec["containers"]:
            for e in c.get("env", []):
                if e["name"] in ("CAIRN_DATABASE_URL", "CAIRN_REDIS_URL", "CAIRN_AMQP_URL",
                                 "CAIRN_BOOTSTRAP_ADMIN_TOKEN", "CAIRN_ARTIFACTS_URL"):
                    assert "secretKeyRef" in e.get("valueFrom", {}), f"{desc}: {e['name']} not from a Secret"


def test_secret_settings_refused_in_configmap_values():
    err = render_fails(set_args({"global.artifactsUrl": "s3://key:secret@bucket/x"}))
    assert "secrets.artifactsUrl" in err, err
    err = render_fails(set_args({"global.extraConfig.CAIRN_DATABASE_URL": "postgres://x"}))
    assert "secret setting" in err, err
    docs = render(set_args({"global.artifactsUrl": "s3://bucket/prefix"}))
    cm = one(docs, "ConfigMap", f"{RELEASE}-cairn-config")
    assert cm["data"]["CAIRN_ARTIFACTS_URL"] == "s3://bucket/prefix"
    env_names = [e["name"] for e in worker_container(docs)["env"]]
    assert "CAIRN_ARTIFACTS_URL" not in env_names, "artifacts URL from both ConfigMap and Secret"


def test_existing_secret():
    docs = render(["-f", os.path.join(CI_DIR, "existing-secret-values.yaml")])
    assert not of_kind(docs, "Secret"), "the chart rendered a Secret next to existingSecret"
    refs = []
    for desc, spec in pod_specs(docs):
        for c in spec["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.append((desc, e["name"], ref))
            for src in c.get("envFrom", []):
                assert "secretRef" not in src, f"{desc}: envFrom a Secret"
    assert refs
    for desc, _, ref in refs:
        assert ref["name"] == "cairn-connections", f"{desc} reads Secret {ref['name']}"
    keys = {name: ref["key"] for _, name, ref in refs}
    assert keys["CAIRN_DATABASE_URL"] == "database-url"
    assert keys["CAIRN_REDIS_URL"] == "redis-url"
    assert keys["CAIRN_AMQP_URL"] == "amqp-url"
    migration = component(docs, "Job", "migration")
    mig_refs = [
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in migration["spec"]["template"]["spec"]["containers"][0]["env"]
        if "valueFrom" in e
    ]
    assert mig_refs == ["cairn-connections"], mig_refs
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
        return {e["name"] for c in spec["containers"] for e in c.get("env", []) if "valueFrom" in e}

    assert "CAIRN_BOOTSTRAP_ADMIN_TOKEN" in secret_env("scheduler")
    for comp in ("worker", "reaper"):
        assert "CAIRN_BOOTSTRAP_ADMIN_TOKEN" not in secret_env(comp), comp
    assert secret_env("reaper") == {"CAIRN_DATABASE_URL", "CAIRN_ARTIFACTS_URL"}
    assert secret_env("migration", "Job") == {"CAIRN_DATABASE_URL"}


# ---------------------------------------------------------------- security


def check_container_restricted(desc, c, confinement=None):
    sc = c.get("securityContext") or {}
    assert sc.get("runAsNonRoot") is True, f"{desc}: runAsNonRoot"
    assert sc.get("allowPrivilegeEscalation") is False, f"{desc}: allowPrivilegeEscalation"
    assert sc.get("readOnlyRootFilesystem") is True, f"{desc}: readOnlyRootFilesystem"
    assert not sc.get("privileged"), f"{desc}: privileged"
    assert sc.get("runAsUser", 1) != 0, f"{desc}: runAsUser 0"
    caps = sc.get("capabilities") or {}
    assert caps.get("drop") == ["ALL"], f"{desc}: capabilities.drop {caps.get('drop')}"
    seccomp = (sc.get("seccompProfile") or {}).get("type", "RuntimeDefault")
    if confinement is None:
        assert not caps.get("add"), f"{desc}: adds capabilities {caps.get('add')}"
        assert seccomp == "RuntimeDefault", f"{desc}: seccomp {seccomp}"
    elif confinement == "capability":
        assert caps.get("add") == ["SYS_ADMIN"], f"{desc}: confinement adds {caps.get('add')}"
        assert seccomp == "RuntimeDefault", f"{desc}: seccomp {seccomp}"
    else:
        assert not caps.get("add"), f"{desc}: adds capabilities {caps.get('add')}"
        assert seccomp == "Localhost", f"{desc}: seccomp {seccomp}"


def test_security_contexts_restricted():
    for label, args in value_sets():
        docs = render(args)
        conf_values = yaml.safe_load(open(args[1])) if args else {}
        confinement = ((conf_values or {}).get("worker") or {}).get("confinement") or {}
        for desc, spec in pod_specs(docs):
            where = f"{label}: {desc}"
            psc = spec.get("securityContext") or {}
            assert psc.get("runAsNonRoot") is True, f"{where}: pod runAsNonRoot"
            assert psc.get("runAsUser", 0) > 0, f"{where}: pod runAsUser"
            assert psc.get("runAsUser") == 10001, f"{where}: pod runAsUser {psc.get('runAsUser')}"
            assert psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{where}: pod seccomp"
            assert spec.get("automountServiceAccountToken") is False, f"{where}: token mounted"
            assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
            tmp_volumes = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
            for c in spec.get("initContainers", []) + spec["containers"]:
                mode = None
                if "(worker)" in desc and confinement.get("enabled"):
                    mode = confinement.get("mode", "capability")
                check_container_restricted(f"{where} container {c['name']}", c, mode)
                tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
                assert tmp and tmp[0]["name"] in tmp_volumes, f"{where}: no writable /tmp emptyDir"


def test_confinement_settings():
    docs = render(["-f", os.path.join(CI_DIR, "confinement-values.yaml")])
    env = container_env(docs, worker_container(docs))
    assert env["CAIRN_CONFINEMENT"] == "true"
    for comp in ("scheduler", "reaper"):
        c = component(docs, "Deployment", comp)["spec"]["template"]["spec"]["containers"][0]
        check_container_restricted(comp, c)
    docs = render(["-f", os.path.join(CI_DIR, "confinement-seccomp-values.yaml")])
    spec = worker(docs)["spec"]["template"]["spec"]
    assert spec["hostUsers"] is False
    sc = worker_container(docs)["securityContext"]
    assert sc["seccompProfile"] == {"type": "Localhost", "localhostProfile": "profiles/cairn-worker.json"}
    err = render_fails(["--set", "worker.confinement.enabled=true",
                        "--set", "worker.confinement.mode=seccompLocalhost"])
    assert "seccompLocalhostProfile" in err, err


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
    svc = component(docs, "Service", "scheduler")
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert component(docs, "Deployment", "reaper")["spec"]["replicas"] == 2


def test_pod_disruption_budgets():
    docs = render()
    for comp in ("scheduler", "worker", "reaper"):
        pdb = component(docs, "PodDisruptionBudget", comp)
        pod_labels = component(docs, "Deployment", comp)["spec"]["template"]["metadata"]["labels"]
        for k, v in pdb["spec"]["selector"]["matchLabels"].items():
            assert pod_labels.get(k) == v, f"{comp}: PDB selector {k}={v} misses the pods"


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
    assert ann["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert "helm.sh/hook-weight" in ann
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["containers"][0]["args"] == ["cairnctl", "migrate"]
    assert "serviceAccountName" not in spec, "the chart's ServiceAccount does not exist during pre-install"
    # Its Secret must exist when the Job starts: a hook with a lower weight.
    hook_secret = [s for s in of_kind(docs, "Secret") if "helm.sh/hook" in s["metadata"].get("annotations", {})]
    assert len(hook_secret) == 1
    s_ann = hook_secret[0]["metadata"]["annotations"]
    assert s_ann["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(s_ann["helm.sh/hook-weight"]) < int(ann["helm.sh/hook-weight"])
    assert list(hook_secret[0]["data"]) == ["CAIRN_DATABASE_URL"], "the hook Secret holds the database URL only"
    (ref,) = [e["valueFrom"]["secretKeyRef"] for e in spec["containers"][0]["env"] if "valueFrom" in e]
    assert ref["name"] == hook_secret[0]["metadata"]["name"]
    docs = render(["--set", "migration.enabled=false"])
    assert not of_kind(docs, "Job")
    assert container_env(docs, worker_container(docs))["CAIRN_MIGRATE"] == "true"


def test_worker_workspace_volumes():
    docs = render()
    spec = worker(docs)["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in worker_container(docs)["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols[mounts[WORKSPACES_DIR]]["emptyDir"] == {}
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


def test_config_change_rolls_pods():
    a = render()
    b = render(["--set", "worker.concurrency=9"])
    for comp in ("scheduler", "worker", "reaper"):
        ca = component(a, "Deployment", comp)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        cb = component(b, "Deployment", comp)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        assert ca != cb, f"{comp}: checksum/config did not change"


# ---------------------------------------------------------------- runner


def main():
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_") and callable(f)]
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


if __name__ == "__main__":
    sys.exit(main())
