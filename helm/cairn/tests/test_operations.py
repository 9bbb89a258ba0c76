"""Render tests of the chart's operational behaviour: scaling on work, readiness and
startup, secrets as files, the worker's pod options and NetworkPolicy, per-component
checksums, a clean install, names, disk bounds, rollouts and the schema's ordinary
options (issue 22).

Run by test_rendered.py's main(), after its own tests and in the same count; the
helpers are test_rendered.py's.
"""

import glob
import os
import re

from test_rendered import (
    CI_DIR,
    FAKE_SECRETS,
    REPO,
    SECRET_DIR,
    SECRET_VARS,
    component,
    container_env,
    effective_values,
    of_kind,
    one,
    pod_specs,
    reaper_container,
    render,
    render_fails,
    secret_sources,
    set_args,
    value_sets,
    worker,
    worker_container,
)

KEDA = ["-f", os.path.join(CI_DIR, "keda-values.yaml")]
KEDA_AUTH_REF = ["-f", os.path.join(CI_DIR, "keda-auth-ref-values.yaml")]
PRODUCTION = ["-f", os.path.join(CI_DIR, "production-values.yaml")]
RUNS_QUERY = "SELECT runs FROM cairn_worker_demand"
SANDBOXES_QUERY = "SELECT sandboxes FROM cairn_worker_demand"
# The least KEDA needs besides enabled: where PostgreSQL is, the password's Secret, and
# snapshots every worker can restore (an autoscaler removes busy workers).
NO_BUNDLED = ["--set", "objectStore.bundled.enabled=false"]
KEDA_NO_STORE = ["--set", "worker.keda.enabled=true"] + NO_BUNDLED + set_args({
    "worker.keda.postgresql.host": "pg.example",
    "worker.keda.postgresql.userName": "keda",
    "worker.keda.postgresql.dbName": "cairn",
    "worker.keda.postgresql.passwordSecret.name": "keda-pg",
})
KEDA_MINIMAL = KEDA_NO_STORE + set_args({"worker.snapshotStore.url": "s3://cairn-snapshots/t"})
# Which keys of the connection Secret (names under secrets.keys) each workload reads.
SECRET_KEYS_OF = {
    "scheduler": {"databaseUrl", "redisUrl", "amqpUrl", "bootstrapAdminToken"},
    "worker": {"databaseUrl", "redisUrl", "amqpUrl"},
    "reaper": {"databaseUrl"},
    "migration": {"databaseUrl"},
}
ENV_OF_KEY = dict(zip(("databaseUrl", "redisUrl", "amqpUrl", "bootstrapAdminToken"), SECRET_VARS))
COMPONENTS = ("scheduler", "worker", "reaper")
# A release name of 53 characters, Helm's longest; and a 63-character fullnameOverride.
LONG_RELEASE = "acme-production-eu-west-1-blue-green-canary-rollout-x"
LONG_FULLNAME = "cairn-" + "f" * 57
assert len(LONG_RELEASE) == 53 and len(LONG_FULLNAME) == 63
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def pod_template(docs, comp):
    return component(docs, "Deployment", comp)["spec"]["template"]


def first_container(docs, comp):
    return pod_template(docs, comp)["spec"]["containers"][0]


def checksums(docs, comp):
    ann = pod_template(docs, comp)["metadata"]["annotations"]
    return {k: v for k, v in ann.items() if k.startswith("checksum/")}


# ---------------------------------------------------------------- 1. scaling on work


def test_keda_scales_on_the_demand_view():
    # The view the trigger reads is the one the binaries' migrations create.
    sql = "".join(open(f, encoding="utf-8").read()
                  for f in glob.glob(os.path.join(REPO, "crates", "*", "migrations", "*.sql")))
    assert re.search(r"CREATE (OR REPLACE )?VIEW cairn_worker_demand\b", sql), "no cairn_worker_demand view"
    docs = render(KEDA)
    so = one(docs, "ScaledObject", worker(docs)["metadata"]["name"])
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": worker(docs)["metadata"]["name"]}
    assert "replicas" not in worker(docs)["spec"], "KEDA owns the replicas"
    assert not of_kind(docs, "HorizontalPodAutoscaler"), "an HPA next to the ScaledObject"
    # Zero is a safe minimum with activation 0: the demand counts executing work too.
    assert spec["minReplicaCount"] == 0 and spec["maxReplicaCount"] == 30
    assert spec["fallback"] == {"failureThreshold": 5, "replicas": 4}
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert behavior == {"stabilizationWindowSeconds": 900,
                        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]}
    # Runs against the job slots, sandboxes against the sandbox slots (the chart's
    # default, 4): the HPA takes the larger wish.
    (trig, sandboxes) = spec["triggers"]
    connection = {
        "host": "postgres.databases.svc.cluster.local",
        "port": "5432",
        "userName": "keda",
        "dbName": "cairn",
        "sslmode": "verify-full",
    }
    assert trig["type"] == sandboxes["type"] == "postgresql"
    assert (trig["name"], sandboxes["name"]) == ("runs", "sandboxes")
    assert trig["metadata"] == {
        "query": RUNS_QUERY,
        "targetQueryValue": "3",
        "activationTargetQueryValue": "0",
        **connection,
    }
    assert sandboxes["metadata"] == {
        "query": SANDBOXES_QUERY,
        "targetQueryValue": "4",
        "activationTargetQueryValue": "0",
        **connection,
    }
    assert sandboxes["authenticationRef"] == trig["authenticationRef"]
    # The password is a parameter of its own, from a Secret: any character works.
    ta = one(docs, "TriggerAuthentication", trig["authenticationRef"]["name"])
    assert ta["spec"] == {"secretTargetRef": [
        {"parameter": "password", "name": "cairn-keda-postgres", "key": "password"}]}
    text = str(so) + str(ta)
    assert "rabbitmq" not in text.lower() and "amqp" not in text.lower()


def test_keda_target_defaults_to_the_concurrency():
    docs = render(KEDA_MINIMAL + ["--set", "worker.concurrency=7", "--set", "worker.sandboxSlots=5"])
    spec = one(docs, "ScaledObject", worker(docs)["metadata"]["name"])["spec"]
    md = spec["triggers"][0]["metadata"]
    assert (md["targetQueryValue"], md["activationTargetQueryValue"]) == ("7", "0")
    assert spec["triggers"][1]["metadata"]["targetQueryValue"] == "5"
    docs = render(KEDA_MINIMAL + ["--set", "worker.keda.targetSandboxesPerReplica=2"])
    spec = one(docs, "ScaledObject", worker(docs)["metadata"]["name"])["spec"]
    assert spec["triggers"][1]["metadata"]["targetQueryValue"] == "2"
    # A worker that hosts no sandboxes is scaled on its runs alone.
    docs = render(KEDA_MINIMAL + ["--set", "worker.sandboxSlots=0"])
    (only,) = one(docs, "ScaledObject", worker(docs)["metadata"]["name"])["spec"]["triggers"]
    assert only["metadata"]["query"] == RUNS_QUERY
    assert (md["port"], md["sslmode"]) == ("5432", "require")
    assert spec["minReplicaCount"] == 1
    assert "fallback" not in spec, "rendered only when fallback.replicas is set"
    ta = one(docs, "TriggerAuthentication", spec["triggers"][0]["authenticationRef"]["name"])
    assert ta["spec"]["secretTargetRef"][0]["name"] == "keda-pg"


def test_keda_with_an_existing_trigger_authentication():
    docs = render(KEDA_AUTH_REF)
    assert not of_kind(docs, "TriggerAuthentication"), "the chart's would be unused"
    triggers = one(docs, "ScaledObject", worker(docs)["metadata"]["name"])["spec"]["triggers"]
    for trig in triggers:
        assert trig["authenticationRef"] == {"name": "cairn-keda-postgres"}
        # Without a host the connection comes whole from that TriggerAuthentication.
        assert set(trig["metadata"]) == {"query", "targetQueryValue", "activationTargetQueryValue"}
    docs = render(KEDA_AUTH_REF + set_args({"worker.keda.postgresql.host": "pg.example"}))
    triggers = one(docs, "ScaledObject", worker(docs)["metadata"]["name"])["spec"]["triggers"]
    assert [t["metadata"]["host"] for t in triggers] == ["pg.example", "pg.example"]


def test_keda_reads_the_workers_database_url_by_default():
    # One place for the connection: the release's Secret, the workers' own URL.
    docs = render(["--set", "worker.keda.enabled=true"])
    so = one(docs, "ScaledObject", worker(docs)["metadata"]["name"])
    for trig in so["spec"]["triggers"]:
        assert set(trig["metadata"]) == {"query", "targetQueryValue", "activationTargetQueryValue"}, trig
    ta = one(docs, "TriggerAuthentication", so["spec"]["triggers"][0]["authenticationRef"]["name"])
    assert ta["spec"] == {"secretTargetRef": [
        {"parameter": "connection", "name": "t-cairn", "key": "CAIRN_DATABASE_URL"}]}
    docs = render(["--set", "worker.keda.enabled=true", "-f", os.path.join(CI_DIR, "existing-secret-values.yaml")])
    ta = of_kind(docs, "TriggerAuthentication")[0]
    assert ta["spec"]["secretTargetRef"][0]["name"] == "cairn-connections"


def test_keda_with_a_user_of_its_own_needs_all_of_it_and_says_so_at_once():
    err = render_fails(["--set", "worker.keda.enabled=true"] + set_args({"worker.keda.postgresql.host": "pg"}))
    assert "3 problem(s) in the values" in err, err
    assert "worker.keda.postgresql.passwordSecret.name" in err, err
    for missing in ("userName", "dbName"):
        assert f"worker.keda.postgresql.{missing} is required" in err, err


def snapshots_shared(docs):
    return container_env(docs, worker_container(docs))["CAIRN_SNAPSHOTS_SHARED"]


def test_snapshots_shared_follows_the_store():
    claim = set_args({"worker.artifacts.existingClaim": "cairn-artifacts"})
    local = "/var/lib/cairn/artifacts/snapshots"
    cases = [
        ("default: the bundled object store", [], "true"),
        ("an emptyDir per pod", NO_BUNDLED + ["--set", "worker.replicas=1"], "false"),
        ("a shared claim", claim, "true"),
        ("s3", NO_BUNDLED + set_args({"worker.snapshotStore.url": "s3://bucket/prefix"}), "true"),
        ("gs", NO_BUNDLED + set_args({"worker.snapshotStore.url": "gs://bucket/prefix"}), "true"),
        ("az", NO_BUNDLED + set_args({"worker.snapshotStore.url": "az://container/prefix"}), "true"),
        ("local, no claim", NO_BUNDLED + ["--set", "worker.replicas=1"]
         + set_args({"worker.snapshotStore.url": local}), "false"),
        ("file://, no claim", NO_BUNDLED + ["--set", "worker.replicas=1"]
         + set_args({"worker.snapshotStore.url": "file://" + local}), "false"),
        ("local on the claim", NO_BUNDLED + claim + set_args({"worker.snapshotStore.url": local}), "true"),
    ]
    for label, args, expected in cases:
        docs = render(args)
        # Always rendered: the binary alone would take a shared claim for a local store.
        cm = one(docs, "ConfigMap", worker(docs)["metadata"]["name"])
        assert cm["data"]["CAIRN_SNAPSHOTS_SHARED"] == expected, label
        assert snapshots_shared(docs) == expected, label
        for comp in ("scheduler", "reaper"):
            assert "CAIRN_SNAPSHOTS_SHARED" not in container_env(docs, first_container(docs, comp)), (label, comp)
    for label, args in value_sets():
        w = effective_values(args)["worker"]
        bundled = effective_values(args)["objectStore"]["bundled"]["enabled"] and not w["snapshotStore"]["url"]
        shared = bundled or bool(w["artifacts"]["existingClaim"]) \
            or w["snapshotStore"]["url"].startswith(("s3://", "gs://", "az://"))
        assert snapshots_shared(render(args)) == str(shared).lower(), label
        if w["keda"]["enabled"] or w["autoscaling"]["enabled"]:
            assert shared, f"{label}: an autoscaler without shared snapshots"


def test_autoscalers_need_shared_snapshots():
    hpa = ["--set", "worker.autoscaling.enabled=true"] + NO_BUNDLED
    local = set_args({"worker.snapshotStore.url": "/var/lib/cairn/artifacts/snapshots"})
    for which, args in (("worker.keda.enabled", KEDA_NO_STORE), ("worker.autoscaling.enabled", hpa)):
        for extra in ([], local):
            err = render_fails(args + extra)
            assert f"{which} is true but the workers' snapshots are not shared" in err, err
            assert "worker.snapshotStore.url" in err and "worker.artifacts.existingClaim" in err, err
            assert "ReadWriteMany" in err, err
        for store in (set_args({"worker.artifacts.existingClaim": "cairn-artifacts"}),
                      set_args({"worker.snapshotStore.url": "gs://bucket/prefix"})):
            assert snapshots_shared(render(args + store)) == "true", which


def test_keda_to_zero_needs_activation_zero():
    err = render_fails(KEDA + ["--set", "worker.keda.activationJobs=1"])
    assert "worker.keda.minReplicaCount is 0 and worker.keda.activationJobs is 1" in err, err
    assert "cooldownPeriod" in err and "Set activationJobs to 0" in err, err
    # With a worker always there, activation only decides nothing: it applies to 0 <-> 1.
    docs = render(KEDA_MINIMAL + ["--set", "worker.keda.activationJobs=2"])
    md = one(docs, "ScaledObject", worker(docs)["metadata"]["name"])["spec"]["triggers"][0]["metadata"]
    assert md["activationTargetQueryValue"] == "2"
    render(KEDA_MINIMAL + ["--set", "worker.keda.minReplicaCount=0"])


def test_snapshots_shared_is_the_chart_s():
    for args in (set_args({"global.extraConfig.CAIRN_SNAPSHOTS_SHARED": "true"}),
                 set_args({"worker.extraEnv[0].name": "CAIRN_SNAPSHOTS_SHARED", "worker.extraEnv[0].value": "true"})):
        err = render_fails(args)
        assert "CAIRN_SNAPSHOTS_SHARED is set by the chart, from worker.artifacts.existingClaim and " \
               "worker.snapshotStore.url" in err, err


# ---------------------------------------------------------------- 2. prefetch, 3. readiness


def test_worker_prefetch():
    docs = render(["--set", "worker.prefetch=2"])
    assert container_env(docs, worker_container(docs))["CAIRN_PREFETCH"] == "2"
    for comp in ("scheduler", "reaper"):
        assert "CAIRN_PREFETCH" not in container_env(docs, first_container(docs, comp)), comp
    for label, args in value_sets():
        docs = render(args)
        prefetch = effective_values(args)["worker"]["prefetch"]
        env = container_env(docs, worker_container(docs))
        assert env.get("CAIRN_PREFETCH") == (str(prefetch) if prefetch else None), label


def test_startup_probes_follow_the_values():
    args = []
    for i, comp in enumerate(COMPONENTS):
        args += ["--set", f"{comp}.startupProbe.failureThreshold={100 + i}",
                 "--set", f"{comp}.startupProbe.periodSeconds={2 + i}"]
    docs = render(args)
    for i, comp in enumerate(COMPONENTS):
        probe = first_container(docs, comp)["startupProbe"]
        assert (probe["failureThreshold"], probe["periodSeconds"]) == (100 + i, 2 + i), comp


# ---------------------------------------------------------------- 4. agent code in the pod


def test_secrets_are_mounted_files_never_environment():
    for label, args in value_sets() + [("all secrets", set_args(FAKE_SECRETS))]:
        docs = render(args)
        values = effective_values(args)
        keys = values["secrets"]["keys"]
        secret = values["secrets"]["existingSecret"] or f"{values.get('fullnameOverride') or 't-cairn'}"
        for desc, spec in pod_specs(docs):
            comp = desc.rsplit("(", 1)[1].rstrip(")")
            where = f"{label}: {desc}"
            for c in spec["containers"]:
                for e in c.get("env", []):
                    ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                    assert not (ref and ref["name"] == secret), f"{where}: {e['name']} from the connection Secret"
                    assert e["name"] not in SECRET_VARS, f"{where}: {e['name']} in the environment"
                for src in c.get("envFrom", []):
                    assert (src.get("secretRef") or {}).get("name") != secret, f"{where}: envFrom {secret}"
            # Exactly the keys the component reads, from the connection Secret.
            sources = secret_sources(spec)
            assert set(sources) == {keys[k] for k in SECRET_KEYS_OF[comp]}, f"{where}: {sorted(sources)}"
            # The migration hook reads a hook Secret of its own when the chart makes the
            # connection Secret, which does not exist before a first install.
            hook = f"{values.get('fullnameOverride') or 't-cairn'}-migration"
            expected = hook if comp == "migration" and not values["secrets"]["existingSecret"] else secret
            assert {name for name, _, _ in sources.values()} == {expected}, where
            # Only the bootstrap token may be missing (no file: no token).
            optional = {k for k, (_, _, opt) in sources.items() if opt}
            assert optional == ({keys["bootstrapAdminToken"]} if comp == "scheduler" else set()), where
            (vol,) = [v for v in spec["volumes"] if v["name"] == "secrets"]
            assert vol["projected"]["defaultMode"] == 0o440, where
            c = spec["containers"][0]
            (mount,) = [m for m in c["volumeMounts"] if m["name"] == "secrets"]
            assert mount == {"name": "secrets", "mountPath": SECRET_DIR, "readOnly": True}, where
            # Each <NAME>_FILE names the file its key is projected to.
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            files = {k: path for k, (_, path, _) in sources.items()}
            for k in SECRET_KEYS_OF[comp]:
                assert env[f"{ENV_OF_KEY[k]}_FILE"] == files[keys[k]], f"{where}: {ENV_OF_KEY[k]}_FILE"


def test_worker_host_users():
    spec = worker(render())["spec"]["template"]["spec"]
    assert spec["hostUsers"] is False, "the sandbox grant, on by default, forces false"
    spec = worker(render(["--set", "worker.sandbox.grant=false"]))["spec"]["template"]["spec"]
    assert "hostUsers" not in spec, "null: the cluster's default"
    assert worker(render(["--set", "worker.hostUsers=false"]))["spec"]["template"]["spec"]["hostUsers"] is False
    without_grant = ["--set", "worker.sandbox.grant=false"]
    assert worker(render(without_grant + ["--set", "worker.hostUsers=true"]))["spec"]["template"]["spec"]["hostUsers"] is True
    docs = render(["--set", "worker.sandbox.grant=true"])
    assert worker(docs)["spec"]["template"]["spec"]["hostUsers"] is False, "the grant forces false"
    err = render_fails(["--set", "worker.hostUsers=true"])
    assert "worker.sandbox.grant needs hostUsers: false" in err, err
    docs = render(["--set", "worker.hostUsers=false"])
    for comp in ("scheduler", "reaper"):
        assert "hostUsers" not in pod_template(docs, comp)["spec"], comp


STEP_DENIED_V4 = ["0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
                  "172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4"]
STEP_DENIED_V6 = ["::1/128", "::ffff:0:0/96", "fc00::/7", "fe80::/10", "ff00::/8"]


def worker_policies(docs):
    """The worker's NetworkPolicy (the bundled object store has one of its own)."""
    return [d for d in of_kind(docs, "NetworkPolicy")
            if d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"]


def test_worker_network_policy_is_on_by_default_and_matches_the_step_filter():
    (np,) = worker_policies(render())
    dns, store, platform, steps = np["spec"]["egress"]
    # The bundled object store, a pod of the release, on its port only.
    assert store["ports"] == [{"port": 8333, "protocol": "TCP"}]
    assert store["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "object-store"
    assert dns["ports"][0]["port"] == 53
    assert sorted(p["port"] for p in platform["ports"]) == [443, 5432, 5672, 6379]
    assert "to" not in platform
    v4, v6 = (peer["ipBlock"] for peer in steps["to"])
    assert (v4["cidr"], v6["cidr"]) == ("0.0.0.0/0", "::/0")
    # The same ranges the worker's nftables filter refuses to steps (isolation::network).
    assert v4["except"] == STEP_DENIED_V4
    assert v6["except"] == STEP_DENIED_V6
    source = open(os.path.join(os.path.dirname(__file__), "..", "..", "..",
                               "crates", "worker", "src", "isolation", "network.rs")).read()
    for cidr in STEP_DENIED_V4 + STEP_DENIED_V6:
        assert f'"{cidr}"' in source, cidr
    assert "ports" not in steps, "steps reach the public internet on any port"
    assert not worker_policies(render(["--set", "worker.networkPolicy.enabled=false"]))


def test_worker_network_policy():
    docs = render(PRODUCTION)
    values = effective_values(PRODUCTION)["worker"]["networkPolicy"]
    (np,) = worker_policies(docs)
    spec = np["spec"]
    assert spec["podSelector"] == worker(docs)["spec"]["selector"], "the worker pods, and only them"
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"ports": [{"port": 9090, "protocol": "TCP"}], "from": values["metricsFrom"]}]
    dns, *rules = spec["egress"]
    assert dns == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
                   "to": values["dns"]["to"]}
    # Steps share the pod's network namespace: their rules are in the same policy.
    assert rules == values["egress"] + values["stepEgress"]
    # Defaults: metrics and DNS from and to anywhere.
    rule = ["--set-json", "worker.networkPolicy.egress=[{\"ports\": [{\"port\": 5432}]}]",
            "--set-json", "worker.networkPolicy.stepEgress=[]"]
    docs = render(["--set", "worker.networkPolicy.enabled=true"] + rule)
    (np,) = worker_policies(docs)
    assert np["spec"]["ingress"] == [{"ports": [{"port": 9090, "protocol": "TCP"}]}]
    assert "to" not in np["spec"]["egress"][0]
    docs = render(["--set", "worker.networkPolicy.enabled=true", "--set", "worker.networkPolicy.dns.enabled=false"]
                  + rule)
    egress = worker_policies(docs)[0]["spec"]["egress"]
    # The bundled object store's rule, then the given one.
    assert len(egress) == 2 and egress[1] == {"ports": [{"port": 5432}]}, egress
    err = render_fails(["--set-json", "worker.networkPolicy.egress=[]"])
    assert "worker.networkPolicy.enabled with no worker.networkPolicy.egress rules" in err, err


# ---------------------------------------------------------------- 5. checksums


def test_checksums_cover_only_what_each_component_reads():
    base = render()
    for comp in COMPONENTS:
        assert set(checksums(base, comp)) == {"checksum/config-shared", "checksum/config", "checksum/secret"}, comp
    cases = [
        (["--set", "reaper.batch=5"], {"reaper"}),
        (["--set", "reaper.drainSeconds=40"], {"reaper"}),
        (["--set", "scheduler.sweepIntervalSeconds=2"], {"scheduler"}),
        (["--set", "scheduler.drainSeconds=12"], {"scheduler"}),
        (set_args({"secrets.bootstrapAdminToken": FAKE_SECRETS["secrets.bootstrapAdminToken"]}), {"scheduler"}),
        (["--set", "worker.concurrency=9"], {"worker"}),
        (["--set", "worker.sandbox.pids=512"], {"worker"}),
        (set_args({"global.queuePrefix": "qa."}), {"scheduler", "worker"}),
        (set_args({"secrets.redisUrl": FAKE_SECRETS["secrets.redisUrl"]}), {"scheduler", "worker"}),
        (set_args({"secrets.databaseUrl": FAKE_SECRETS["secrets.databaseUrl"]}), set(COMPONENTS)),
        (set_args({"global.logFormat": "pretty"}), set(COMPONENTS)),
    ]
    for args, changed in cases:
        docs = render(args)
        for comp in COMPONENTS:
            moved = checksums(docs, comp) != checksums(base, comp)
            assert moved == (comp in changed), f"{' '.join(args)}: {comp} checksums {'moved' if moved else 'stayed'}"
            if comp not in changed:
                # Nothing else of the pod moves either: no restart at all.
                assert pod_template(docs, comp) == pod_template(base, comp), f"{' '.join(args)}: {comp} pod changed"


# ---------------------------------------------------------------- 6. install


def test_install_without_connection_urls_fails_clearly():
    err = render_fails([], bare=True)
    assert "secrets.databaseUrl is empty" in err and "secrets.existingSecret" in err, err
    for key in ("redisUrl", "amqpUrl"):
        err = render_fails(set_args({f"secrets.{key}": ""}))
        assert f"secrets.{key} is empty" in err, err
    # An existing Secret is the alternative; the token stays optional.
    render(["--set-string", "secrets.existingSecret=conn"], bare=True)
    assert "CAIRN_BOOTSTRAP_ADMIN_TOKEN" not in one(render(), "Secret", "t-cairn")["data"]


def test_the_only_hooks_are_the_migration_and_its_database_url():
    for label, args in value_sets() + [("all secrets", set_args(FAKE_SECRETS))]:
        values = effective_values(args)
        hooks = {(d["kind"], d["metadata"]["name"]): d["metadata"]["annotations"]["helm.sh/hook"]
                 for d in render(args) if "helm.sh/hook" in d["metadata"].get("annotations", {})}
        name = f"{values.get('fullnameOverride') or 't-cairn'}-migration"
        expected = {("Job", name): "pre-install,pre-upgrade"}
        if not values["secrets"]["existingSecret"]:
            expected[("Secret", name)] = "pre-install,pre-upgrade"
        if not values["migration"]["enabled"]:
            expected = {}
        # The helm test's Pod is a hook of `helm test` alone.
        hooks = {k: v for k, v in hooks.items() if v != "test"}
        assert hooks == expected, f"{label}: {hooks}"


# ---------------------------------------------------------------- 7. names


def check_names(label, docs):
    seen = set()
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        assert len(name) <= 63, f"{label}: {kind} {name} has {len(name)} characters"
        assert DNS_1123_LABEL.match(name), f"{label}: {kind} {name} is not a DNS-1123 label"
        if kind == "Service":
            assert DNS_1035.match(name), f"{label}: Service {name} is not a DNS-1035 label"
        assert (kind, name) not in seen, f"{label}: two {kind} named {name}"
        seen.add((kind, name))
        for k, v in d["metadata"].get("labels", {}).items():
            assert len(str(v)) <= 63, f"{label}: {kind} {name} label {k}={v}"
    names = {(k, n) for k, n in seen}
    # References still resolve after the cuts.
    for d in docs:
        if d["kind"] == "ScaledObject":
            assert ("Deployment", d["spec"]["scaleTargetRef"]["name"]) in names, label
            for t in d["spec"]["triggers"]:
                assert ("TriggerAuthentication", t["authenticationRef"]["name"]) in names, label
    for desc, spec in pod_specs(docs):
        for c in spec["containers"]:
            for src in c.get("envFrom", []):
                if "configMapRef" in src:
                    assert ("ConfigMap", src["configMapRef"]["name"]) in names, f"{label}: {desc}"
        if desc.startswith("Deployment"):
            assert ("ServiceAccount", spec["serviceAccountName"]) in names, f"{label}: {desc}"
    for comp in COMPONENTS:
        names_of = {d["metadata"]["name"] for d in docs if d["kind"] in ("Deployment", "Service")
                    and d["metadata"]["labels"]["app.kubernetes.io/component"] == comp}
        others = {d["metadata"]["name"] for d in docs if d["kind"] in ("Deployment", "Service")
                  and d["metadata"]["labels"]["app.kubernetes.io/component"] != comp}
        assert not names_of & others, f"{label}: {comp} shares a name with another component"


def test_names_fit_with_a_long_release_name_or_fullname_override():
    long_override = set_args({"fullnameOverride": LONG_FULLNAME})
    cases = [
        ("53-character release", LONG_RELEASE, []),
        ("53-character release, production", LONG_RELEASE, PRODUCTION),
        ("53-character release, KEDA", LONG_RELEASE, KEDA),
        ("63-character fullnameOverride", "t", long_override),
        ("63-character fullnameOverride, production", "t", PRODUCTION + long_override),
        ("63-character fullnameOverride, KEDA", "t", KEDA + long_override),
    ]
    for label, release, args in cases:
        check_names(label, render(args, release=release))
    # The cut keeps each suffix whole, so the names still say what they are.
    docs = render(long_override)
    name = component(docs, "Deployment", "scheduler")["metadata"]["name"]
    assert len(name) == 63 and name.endswith("-scheduler"), name
    metrics = [s["metadata"]["name"] for s in of_kind(docs, "Service") if "clusterIP" in s["spec"]]
    assert sorted(n.rsplit("-", 2)[-2] for n in metrics) == ["reaper", "worker"], metrics


# ---------------------------------------------------------------- 8. disk


def test_disk_is_bounded():
    docs = render()
    spec = worker(docs)["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["workspaces"]["emptyDir"] == {"sizeLimit": "50Gi"}
    assert vols["artifacts"]["emptyDir"] == {"sizeLimit": "20Gi"}
    res = worker_container(docs)["resources"]
    assert res["requests"]["ephemeral-storage"] == "1Gi"
    # No limit: crossing one would evict the pod without a drain.
    assert "ephemeral-storage" not in res.get("limits", {})
    for label, args in value_sets():
        for desc, spec in pod_specs(render(args)):
            for v in spec["volumes"]:
                if "emptyDir" in v:
                    assert v["emptyDir"].get("sizeLimit"), f"{label}: {desc} volume {v['name']} has no sizeLimit"


# ---------------------------------------------------------------- 9. rollouts


def test_scheduler_pauses_before_it_stops():
    c = first_container(render(), "scheduler")
    assert c["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    for label, args in value_sets():
        docs = render(args)
        values = effective_values(args)["scheduler"]
        spec = pod_template(docs, "scheduler")["spec"]
        env = container_env(docs, spec["containers"][0])
        pause = int(spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
        assert pause == values["preStopSeconds"], label
        assert pause + int(env["CAIRN_DRAIN_SECONDS"]) < spec["terminationGracePeriodSeconds"], label
    assert "lifecycle" not in first_container(render(["--set", "scheduler.preStopSeconds=0"]), "scheduler")
    for comp in ("worker", "reaper"):
        assert "lifecycle" not in first_container(render(), comp), comp


def test_reaper_drain_is_settable():
    for label, args in value_sets():
        docs = render(args)
        values = effective_values(args)["reaper"]
        env = container_env(docs, reaper_container(docs))
        assert env["CAIRN_DRAIN_SECONDS"] == str(values["drainSeconds"]), label
        grace = pod_template(docs, "reaper")["spec"]["terminationGracePeriodSeconds"]
        assert values["drainSeconds"] < grace, label
    assert container_env(render(), reaper_container(render()))["CAIRN_DRAIN_SECONDS"] == "30"
    err = render_fails(["--set", "reaper.drainSeconds=60"])
    assert "reaper.drainSeconds (60) must be less than reaper.terminationGracePeriodSeconds (60)" in err, err


# ---------------------------------------------------------------- 10. the schema's options


def test_image_registry_and_digest():
    def images(docs):
        return {c["image"] for _, spec in pod_specs(docs) for c in spec["containers"]}

    assert images(render()) == {"cairn:0.1.0"}
    assert images(render(set_args({"global.imageRegistry": "mirror.example/", "global.image.tag": "1.2"}))) == \
        {"mirror.example/cairn:1.2"}
    digest = "sha256:" + "ab" * 32
    assert images(render(set_args({"global.image.digest": digest, "global.image.tag": "1.2"}))) == \
        {f"cairn@{digest}"}, "the digest replaces the tag"
    assert images(render(PRODUCTION)) == {
        "registry.example.com/mirror/cairn@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}


def test_extra_env_with_value_from_and_extra_volumes():
    docs = render(PRODUCTION)
    env = {e["name"]: e for e in worker_container(docs)["env"]}
    assert env["GIT_TOKEN"] == {"name": "GIT_TOKEN", "valueFrom": {"secretKeyRef": {"name": "cairn-git", "key": "token"}}}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["CAIRN_OUTPUT_TAIL_BYTES"] == {"name": "CAIRN_OUTPUT_TAIL_BYTES", "value": "8192"}
    vols = {v["name"]: v for v in worker(docs)["spec"]["template"]["spec"]["volumes"]}
    assert vols["ca-bundle"] == {"name": "ca-bundle", "configMap": {"name": "corporate-ca"}}
    mounts = {m["name"]: m for m in worker_container(docs)["volumeMounts"]}
    assert mounts["ca-bundle"] == {"name": "ca-bundle", "mountPath": "/etc/cairn/ca", "readOnly": True}
    for comp in ("scheduler", "reaper"):
        names = {v["name"] for v in pod_template(docs, comp)["spec"]["volumes"]}
        assert "ca-bundle" not in names, comp
    # A store credential may come from a Secret, never as a plain value.
    ok = render(set_args({"reaper.extraEnv[0].name": "AWS_SECRET_ACCESS_KEY",
                          "reaper.extraEnv[0].valueFrom.secretKeyRef.name": "s3",
                          "reaper.extraEnv[0].valueFrom.secretKeyRef.key": "secret"}))
    assert "AWS_SECRET_ACCESS_KEY" in {e["name"] for e in reaper_container(ok)["env"]}
    for name in ("secrets", "tmp", "workspaces", "artifacts"):
        err = render_fails(set_args({"scheduler.extraVolumes[0].name": name,
                                     "scheduler.extraVolumes[0].emptyDir.medium": "Memory"}))
        assert f'scheduler.extraVolumes: the volume name "{name}" is the chart\'s own' in err, err


def test_worker_id_is_refused_everywhere():
    cases = [set_args({"global.extraConfig.CAIRN_WORKER_ID": "w1"})]
    for comp in COMPONENTS:
        cases.append(set_args({f"{comp}.extraEnv[0].name": "CAIRN_WORKER_ID", f"{comp}.extraEnv[0].value": "w1"}))
    cases.append(set_args({"worker.extraEnv[0].name": "CAIRN_WORKER_ID",
                           "worker.extraEnv[0].valueFrom.fieldRef.fieldPath": "metadata.name"}))
    for args in cases:
        err = render_fails(args)
        assert "sets CAIRN_WORKER_ID" in err and "<pod name>-<pid>" in err, err


def test_affinity_topology_spread_and_priority():
    docs = render(PRODUCTION)
    values = effective_values(PRODUCTION)
    w = worker(docs)["spec"]["template"]["spec"]
    assert w["affinity"] == values["worker"]["affinity"], "affinity replaces the preset"
    assert w["priorityClassName"] == "cairn-workers"
    (spread,) = w["topologySpreadConstraints"]
    assert spread["labelSelector"] == {"matchLabels": worker(docs)["spec"]["selector"]["matchLabels"]}
    assert (spread["topologyKey"], spread["whenUnsatisfiable"]) == ("topology.kubernetes.io/zone", "DoNotSchedule")
    s = pod_template(docs, "scheduler")["spec"]
    assert "podAntiAffinity" in s["affinity"], "the preset stays without affinity"
    assert s["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "scheduler"
    assert "topologySpreadConstraints" not in pod_template(docs, "reaper")["spec"]
    # A constraint's own labelSelector is kept.
    own = {"worker.topologySpreadConstraints[0].topologyKey": "z",
           "worker.topologySpreadConstraints[0].whenUnsatisfiable": "ScheduleAnyway",
           "worker.topologySpreadConstraints[0].labelSelector.matchLabels.team": "a"}
    args = set_args(own) + ["--set", "worker.topologySpreadConstraints[0].maxSkew=1"]
    (spread,) = worker(render(args))["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"] == {"matchLabels": {"team": "a"}}
    for _, spec in pod_specs(render()):
        assert "priorityClassName" not in spec


def test_extra_objects():
    docs = render(PRODUCTION)
    pc = one(docs, "PriorityClass", "cairn-workers")
    assert pc["value"] == 1000
    notes = one(docs, "ConfigMap", "t-cairn-notes")
    assert notes["metadata"]["labels"] == {"app.kubernetes.io/instance": "t"}, "strings go through tpl"
    assert not [d for d in render() if d["kind"] == "PriorityClass"]
