//! The step sandbox end to end (invariant 10), through the API and the real binaries:
//! the three escapes a hostile step tried before it existed, the spec's network and
//! limits, and the worker's report of what the host allows.

use cairn_e2e::cluster::{run_spec, Cluster, Settings};
use cairn_e2e::ServiceLock;
use serde_json::{json, Value};
use std::net::TcpListener;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);

fn sh(key: &str, script: &str) -> Value {
    json!({"key": key, "argv": ["sh", "-c", script], "timeout_seconds": 120})
}

/// `sleep 1000.<random>`: a command line no other process has.
fn unique_sleep() -> String {
    format!(
        "sleep 1000.{}",
        uuid::Uuid::new_v4().as_u128() % 1_000_000_000
    )
}

/// The journal's row of `key`.
fn step_of(cluster: &Cluster, run_id: &str, key: &str) -> Value {
    let journal = cluster.journal(run_id);
    journal["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["step_key"] == key)
        .cloned()
        .unwrap_or_else(|| panic!("no step {key}: {journal}"))
}

/// A worker holds an AWS key, a database URL with a password and the bootstrap admin
/// token in its environment: a step that reads every environment and descriptor it can
/// reach finds none of them.
#[tokio::test]
async fn a_step_cannot_read_the_worker_environment_or_descriptors() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-environ", 0, Settings::default()).await;
    // Not shaped like any token the output redaction knows: only the sandbox keeps them.
    let secrets = [
        ("AWS_SECRET_ACCESS_KEY", "plain-aws-secret-4417"),
        ("DATABASE_URL", "postgres://app:plain-db-pass-9921@db/app"),
        ("CAIRN_BOOTSTRAP_ADMIN_TOKEN", "plain-admin-token-5530"),
    ];
    for (name, value) in secrets {
        cluster.worker_env.push((name.into(), value.into()));
    }
    cluster.add_worker();
    let script = "tr '\\0' '\\n' </proc/$PPID/environ; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' <$f; done; \
                  ls -l /proc/[0-9]*/fd/ 2>&1; cat /proc/1/cmdline | tr '\\0' ' '; echo; id";
    let (run_id, _) = cluster.submit(&run_spec(vec![sh("read", script)], 1));
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let step = step_of(&cluster, &run_id, "read");
    let seen = format!("{}{}", step["stdout_tail"], step["stderr_tail"]);
    for (_, value) in secrets {
        for part in ["plain-aws-secret", "plain-db-pass", "plain-admin-token"] {
            assert!(
                !(value.contains(part) && seen.contains(part)),
                "{part} leaked: {seen}"
            );
        }
    }
    assert!(!seen.contains("CAIRN_DATABASE_URL"), "{seen}");
    assert!(seen.contains("uid=1000"), "{seen}");
    assert_eq!(step["sandbox"]["isolated"], true, "{step}");
}

/// Step 1 links `/` into the tree; step 2 asks for `cwd: escape/etc`: it is refused with
/// a receipt that says why, and the run fails there. Nothing a step writes to a host path
/// lands, and it sees neither the workspaces nor the snapshot store.
#[tokio::test]
async fn a_symlink_cwd_is_refused_and_a_write_outside_is_impossible() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-cwd", 1, Settings::default()).await;
    let outside = cluster.dir.join("outside-marker");
    let workspaces = cluster.workspaces("w1");
    let etc_marker = format!("cairn-marker-{}", uuid::Uuid::new_v4().simple());
    let mut read = sh("read", "cat passwd");
    read["cwd"] = json!("escape/etc");
    let spec = run_spec(
        vec![
            sh(
                "link",
                &format!(
                    "ln -s / escape; touch {0} /etc/{3} {1}/marker 2>/dev/null; \
                     ls {1} >/dev/null 2>&1 && echo saw-workspaces; \
                     ls {2} >/dev/null 2>&1 && echo saw-store; echo linked",
                    outside.display(),
                    workspaces.display(),
                    cluster.dir.join("artifacts").display(),
                    etc_marker,
                ),
            ),
            read,
            sh("after", "echo should-not-run"),
        ],
        1,
    );
    let (run_id, request_id) = cluster.submit(&spec);
    cluster.wait_for_state(&run_id, &["failed"], LONG);
    let (reason, _) = cluster.stop_reason(&request_id).await;
    let reason = reason.unwrap_or_default();
    assert!(
        reason.contains("leaves the workspace"),
        "the refusal says why: {reason}"
    );
    // Neither the worker's workspaces (this run's and others') nor the snapshot store
    // are in its view.
    let link = step_of(&cluster, &run_id, "link");
    assert_eq!(link["stdout_tail"], "linked\n", "{link}");
    let read = step_of(&cluster, &run_id, "read");
    assert!(
        read["stderr_tail"]
            .as_str()
            .unwrap_or_default()
            .contains("escape/etc"),
        "{read}"
    );
    assert!(!read["stdout_tail"]
        .as_str()
        .unwrap_or_default()
        .contains("root:"));
    let journal = cluster.journal(&run_id);
    assert!(
        journal["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .all(|s| s["step_key"] != "after"),
        "{journal}"
    );
    assert!(!outside.exists(), "a write outside the workspace landed");
    assert!(!workspaces.join("marker").exists());
    assert!(!std::path::Path::new("/etc").join(&etc_marker).exists());
}

/// `sh -c "setsid sh -c 'sleep …' & sleep 100"`: on its timeout, and on a cancel, the
/// step ends within the kill grace, its receipt is written on time, and the `setsid`
/// orphan is gone.
#[tokio::test]
async fn a_setsid_orphan_is_gone_within_the_kill_grace_after_timeout_and_cancel() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-orphan", 1, Settings::default()).await;
    let grace = Duration::from_secs(cluster.settings.kill_grace_seconds);

    // Timeout.
    // Unique per run: an orphan of another run (or of an older build) is not this one's.
    let (timed_marker, cancelled_marker) = (unique_sleep(), unique_sleep());
    let mut timed = sh(
        "orphan",
        &format!("setsid sh -c '{timed_marker}' & sleep 100"),
    );
    timed["timeout_seconds"] = json!(2);
    let submitted = Instant::now();
    let (run_id, _) = cluster.submit(&run_spec(vec![timed], 1));
    cluster.wait_for_state(&run_id, &["failed"], LONG);
    let took = submitted.elapsed();
    assert!(
        took < Duration::from_secs(2) + grace + Duration::from_secs(8),
        "the timed-out step ended after {took:?}"
    );
    let step = step_of(&cluster, &run_id, "orphan");
    assert_eq!(step["timed_out"], true, "{step}");
    assert!(
        cairn_e2e::processes_with(&timed_marker).is_empty(),
        "the orphan outlived its step"
    );

    // Cancel.
    let started = cluster.path("started");
    let cancelled = sh(
        "orphan",
        &format!("setsid sh -c '{cancelled_marker}' & touch {started}; sleep 100"),
    );
    let (run_id, _) = cluster.submit(&run_spec(vec![cancelled], 1));
    cluster.wait_until("the step to start", LONG, || {
        std::path::Path::new(&started).exists()
    });
    assert!(!cairn_e2e::processes_with(&cancelled_marker).is_empty());
    let asked = Instant::now();
    let (status, body) = cluster.call("POST", &format!("/api/v1/runs/{run_id}/cancel"), None);
    assert_eq!(status, 202, "{body}");
    cluster.wait_for_state(&run_id, &["cancelled"], LONG);
    let took = asked.elapsed();
    assert!(
        took < grace + Duration::from_secs(8),
        "the cancelled step ended after {took:?}"
    );
    cluster.wait_until(
        "the orphan to be gone",
        grace + Duration::from_secs(2),
        || cairn_e2e::processes_with(&cancelled_marker).is_empty(),
    );
}

/// Two hosts of the test's own, each in a network namespace behind a veth pair: a
/// "public" server on a documentation address and a "private" one on a 10.x address,
/// each answering its name on two ports. Removed (servers and namespaces) on drop.
/// Its addresses are fixed, so one topology stands at a time on the machine: it holds
/// a lock file for its life.
struct Topology {
    names: Vec<String>,
    servers: Vec<std::process::Child>,
    _alone: std::fs::File,
}

const PUBLIC: &str = "203.0.113.10";
const PRIVATE: &str = "10.213.0.10";

impl Topology {
    fn start() -> Topology {
        let alone = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open("/tmp/cairn-e2e-topology.lock")
            .expect("topology lock file");
        alone.lock().expect("topology lock");
        let tag = std::process::id() % 100_000;
        let mut topology = Topology {
            names: Vec::new(),
            servers: Vec::new(),
            _alone: alone,
        };
        for (n, (name, net)) in [("public", "203.0.113"), ("private", "10.213.0")]
            .into_iter()
            .enumerate()
        {
            let ns = format!("cairn-{name}-{tag}");
            let (host, peer) = (format!("cvh{n}{tag}"), format!("cvp{n}{tag}"));
            let _ = run("ip", &["netns", "del", &ns]);
            let _ = run("ip", &["link", "del", &host]);
            topology.names.push(ns.clone());
            for args in [
                vec!["netns", "add", &ns],
                vec!["link", "add", &host, "type", "veth", "peer", "name", &peer],
                vec!["link", "set", &peer, "netns", &ns],
            ] {
                run("ip", &args).expect("topology");
            }
            let (host_addr, peer_addr) = (format!("{net}.1/24"), format!("{net}.10/24"));
            run("ip", &["addr", "add", &host_addr, "dev", &host]).expect("addr");
            run("ip", &["link", "set", &host, "up"]).expect("up");
            for args in [
                vec!["addr", "add", &peer_addr, "dev", &peer],
                vec!["link", "set", &peer, "up"],
                vec!["link", "set", "lo", "up"],
            ] {
                let mut full = vec!["netns", "exec", &ns, "ip"];
                full.extend(args);
                run("ip", &full).expect("peer");
            }
            let server = format!(
                "import socket, threading\n\
                 def serve(port):\n\
                 \x20   s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
                 \x20   s.bind(('{net}.10', port)); s.listen(16)\n\
                 \x20   while True:\n\
                 \x20       c, _ = s.accept(); c.sendall(b'{name}-%d' % port); c.close()\n\
                 threading.Thread(target=serve, args=(8081,), daemon=True).start()\n\
                 serve(8080)\n"
            );
            let child = std::process::Command::new("ip")
                .args(["netns", "exec", &ns, "python3", "-c", &server])
                .spawn()
                .expect("server");
            topology.servers.push(child);
        }
        // Both answer from the host before any step tries them.
        for addr in [PUBLIC, PRIVATE] {
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect((addr, 8080)).is_err() {
                assert!(Instant::now() < deadline, "{addr} does not answer");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        topology
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for server in &mut self.servers {
            let _ = server.kill();
            let _ = server.wait();
        }
        for ns in &self.names {
            let _ = run("ip", &["netns", "del", ns]);
        }
    }
}

/// A Python program that connects to each `(name, host, port)` and prints `NAME reached
/// WHAT-IT-SAID` or `NAME refused ERROR`, then its network namespace.
fn probe_script(targets: &[(&str, String, u16)]) -> String {
    let probe = targets
        .iter()
        .map(|(name, host, port)| format!("('{name}', '{host}', {port})"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "import os, socket\n\
         for name, host, port in [{probe}]:\n\
         \x20   try:\n\
         \x20       s = socket.create_connection((host, port), timeout=3)\n\
         \x20       s.settimeout(3)\n\
         \x20       try: said = s.recv(64).decode()\n\
         \x20       except Exception: said = ''\n\
         \x20       print(name, 'reached', said or '-')\n\
         \x20   except Exception as e:\n\
         \x20       print(name, 'refused', type(e).__name__)\n\
         print('netns', os.readlink('/proc/self/ns/net'))\n"
    )
}

/// The line of `name` in a probe's output.
fn probe_line(out: &str, name: &str) -> String {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name}: {out}"))
        .to_string()
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A step with the network (the default) is in a network namespace of its own and
/// reaches the public internet (a documentation address in the test's topology) and
/// what the operator allows by name, and nothing that belongs to the platform: not
/// PostgreSQL, Redis, RabbitMQ, the API or the worker on the host's loopback, not the
/// worker's own addresses, not a private server, not the metadata address. A step
/// without the network reaches nothing at all; one with its own list, only what it
/// names of what the worker allows.
#[tokio::test]
async fn a_step_reaches_the_public_and_what_is_allowed_and_nothing_of_the_platform() {
    let _services = ServiceLock::shared().await;
    let topology = Topology::start();
    let mut cluster = Cluster::start("sandbox-egress", 0, Settings::default()).await;
    cluster
        .worker_env
        .push(("CAIRN_STEP_EGRESS_ALLOW".into(), format!("{PRIVATE}:8080")));
    cluster.add_worker();
    // A listener on every host address: the worker's own addresses are refused too.
    let listener = TcpListener::bind("0.0.0.0:0").expect("listener");
    let port = listener.local_addr().expect("addr").port();
    let api = cluster.api.port();
    let worker = cluster.workers[0].addr.port();
    let targets = [
        ("postgres", "127.0.0.1".to_string(), 5432),
        ("redis", "127.0.0.1".into(), 6379),
        ("rabbitmq", "127.0.0.1".into(), 5672),
        ("api", "127.0.0.1".into(), api),
        ("worker", "127.0.0.1".into(), worker),
        ("own-address", "203.0.113.1".into(), port),
        ("own-private-address", "10.213.0.1".into(), port),
        ("metadata", "169.254.169.254".into(), 80),
        ("private-other-port", PRIVATE.into(), 8081),
        ("private-allowed", PRIVATE.into(), 8080),
        ("public", PUBLIC.into(), 8080),
        ("public-other-port", PUBLIC.into(), 8081),
    ];
    let script = probe_script(&targets);
    let argv =
        |key: &str| json!({"key": key, "argv": ["python3", "-c", script], "timeout_seconds": 120});
    let mut offline = argv("offline");
    offline["network"] = json!(false);
    // A step's own list narrows the worker's policy and never widens it: of what it
    // names, it reaches only what the worker allows too.
    let mut narrowed = argv("narrowed");
    narrowed["network"] = json!({"allow": [
        format!("{PUBLIC}:8080"),
        format!("{PRIVATE}:8080"),
        format!("{PRIVATE}:8081"),
        "127.0.0.1:5432",
    ]});
    let (run_id, _) = cluster.submit(&run_spec(vec![argv("online"), offline, narrowed], 1));
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let host_ns = std::fs::read_link("/proc/self/ns/net").expect("netns");
    let seen = |key: &str| {
        let step = step_of(&cluster, &run_id, key);
        let out = step["stdout_tail"].as_str().unwrap_or_default().to_string();
        (step, out)
    };
    let (online, out) = seen("online");
    assert_eq!(online["sandbox"]["network"], true, "{online}");
    assert!(
        online["sandbox"]["namespaces"]
            .as_array()
            .is_some_and(|n| n.contains(&json!("network"))),
        "{online}"
    );
    let line = probe_line;
    for (name, _, _) in &targets {
        let got = line(&out, name);
        match *name {
            "private-allowed" => assert_eq!(got, "private-allowed reached private-8080", "{out}"),
            "public" => assert_eq!(got, "public reached public-8080", "{out}"),
            "public-other-port" => {
                assert_eq!(got, "public-other-port reached public-8081", "{out}")
            }
            _ => assert!(got.contains(" refused "), "{name} must be refused: {out}"),
        }
    }
    let netns = line(&out, "netns");
    assert_ne!(netns, format!("netns {}", host_ns.display()), "{out}");
    let (_, out) = seen("offline");
    for (name, _, _) in &targets {
        assert!(
            line(&out, name).contains(" refused "),
            "offline {name}: {out}"
        );
    }
    let (narrowed, out) = seen("narrowed");
    let layers = &narrowed["sandbox"]["egress"]["narrowed_by"];
    assert_eq!(layers.as_array().map(Vec::len), Some(1), "{narrowed}");
    assert_eq!(layers[0]["by"], "run", "{narrowed}");
    assert_eq!(
        layers[0]["allow"].as_array().map(Vec::len),
        Some(4),
        "{narrowed}"
    );
    for (name, _, _) in &targets {
        let got = line(&out, name);
        match *name {
            "private-allowed" => assert_eq!(got, "private-allowed reached private-8080", "{out}"),
            "public" => assert_eq!(got, "public reached public-8080", "{out}"),
            _ => assert!(
                got.contains(" refused "),
                "narrowed {name} must be refused: {out}"
            ),
        }
    }
    // What the filters refused is counted.
    cluster.wait_until("the refusals are counted", LONG, || {
        cluster.metric(0, "cairn_worker_step_egress_refused_packets_total") >= 1.0
    });
    drop(listener);
    drop(topology);
}

/// A worker that cannot give a step a NAT of its own fails the step that asks for the
/// network, saying why; it never runs it on the host's network.
#[tokio::test]
async fn without_its_nat_a_step_with_the_network_fails_clearly() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-no-nat", 0, Settings::default()).await;
    // A PATH with bubblewrap and nsenter, but no slirp4netns or nft.
    let bin = std::env::temp_dir().join(format!("cairn-no-nat-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&bin).expect("bin");
    for tool in ["bwrap", "nsenter", "sleep", "unshare"] {
        let found = ["/usr/bin", "/bin", "/usr/sbin"]
            .iter()
            .map(|d| std::path::Path::new(d).join(tool))
            .find(|p| p.exists())
            .expect(tool);
        std::os::unix::fs::symlink(found, bin.join(tool)).expect("link");
    }
    cluster
        .worker_env
        .push(("PATH".into(), bin.to_string_lossy().into_owned()));
    cluster.add_worker();
    let mut offline = sh("offline", "echo fine");
    offline["network"] = json!(false);
    let (run_id, _) = cluster.submit(&run_spec(vec![offline, sh("online", "echo never")], 1));
    cluster.wait_for_state(&run_id, &["failed"], LONG);
    let fine = step_of(&cluster, &run_id, "offline");
    assert_eq!(fine["stdout_tail"], "fine\n", "{fine}");
    let view = cluster.run(&run_id);
    let reason = view["stop_reason"].as_str().unwrap_or_default().to_string();
    assert!(
        reason.contains("never runs on the host's network") && reason.contains("slirp4netns"),
        "{view}"
    );
    let _ = std::fs::remove_dir_all(bin);
}

/// A fork loop ends at the step's `pids` limit, with `pids_limit` in its receipt.
#[tokio::test]
async fn a_fork_loop_ends_at_its_pids_limit_with_a_clear_receipt() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-pids", 1, Settings::default()).await;
    let mut fork = sh("fork", "while :; do sleep 30 & done");
    fork["limits"] = json!({"pids": 32});
    let (run_id, request_id) = cluster.submit(&run_spec(vec![fork], 1));
    cluster.wait_for_state(&run_id, &["failed"], LONG);
    let step = step_of(&cluster, &run_id, "fork");
    assert_eq!(step["limit"], "pids_limit", "{step}");
    assert_eq!(step["sandbox"]["limits"]["pids"], 32);
    let (reason, _) = cluster.stop_reason(&request_id).await;
    assert!(reason.unwrap_or_default().contains("pids_limit"));
    // Out-of-bounds limits are refused at admission.
    let mut bad = sh("fork", "true");
    bad["limits"] = json!({"memory_mb": 1});
    let (status, body) = cluster.call("POST", "/api/v1/runs", Some(&run_spec(vec![bad], 1)));
    assert_eq!(status, 422, "{body}");
}

/// The worker's `/readyz` and metric report what this host allows, as the host is.
#[tokio::test]
async fn the_worker_reports_what_the_host_allows() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-report", 1, Settings::default()).await;
    let ready = cairn_e2e::http(cluster.workers[0].addr, "GET", "/readyz").expect("readyz");
    let body: Value = serde_json::from_str(&ready.body).expect("json");
    let sandbox = &body["details"]["sandbox"];
    let bwrap = std::process::Command::new("bwrap")
        .arg("--version")
        .output();
    let installed = bwrap.as_ref().is_ok_and(|o| o.status.success());
    let userns = std::process::Command::new("bwrap")
        .args([
            "--ro-bind",
            "/",
            "/",
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "true",
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert_eq!(sandbox["isolated"], installed && userns, "{body}");
    // A pause keeps processes in place; why there are no memory checkpoints, as the
    // host is: CRIU absent, failing its own check, or passing it.
    assert_eq!(sandbox["pause"]["keeps_processes"], "in_place", "{body}");
    let criu = std::process::Command::new("criu").arg("check").output();
    let why = sandbox["pause"]["memory_checkpoint"].as_str().unwrap_or("");
    let expected = match &criu {
        Err(_) => "criu is not installed",
        Ok(out) if out.status.success() => "criu check passes here",
        Ok(_) => "criu check fails on this kernel",
    };
    assert!(why.starts_with(expected), "{why}");
    if let Ok(out) = &bwrap {
        assert_eq!(
            sandbox["mechanism"],
            String::from_utf8_lossy(&out.stdout).trim(),
            "{body}"
        );
    }
    let cgroup = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "v2"
    } else if std::path::Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists() {
        "v1"
    } else {
        "none"
    };
    assert_eq!(sandbox["cgroup"], cgroup, "{body}");
    let isolated = cluster.metric(
        0,
        "cairn_worker_sandbox_capability{capability=\"isolated\"}",
    );
    assert_eq!(isolated, if installed && userns { 1.0 } else { 0.0 });
}

/// A worker that must isolate steps on a host that cannot (here: no bubblewrap) takes
/// no work and says why on `/readyz`, which answers 503; a run waits for a worker that
/// can isolate it, and one that can runs it.
#[tokio::test]
async fn a_worker_required_to_isolate_on_a_host_that_cannot_is_unready_and_runs_nothing() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-required", 0, Settings::default()).await;
    cluster.worker_env.extend([
        ("CAIRN_SANDBOX".into(), "required".into()),
        ("CAIRN_SANDBOX_BWRAP".into(), "/nonexistent/bwrap".into()),
    ]);
    let index = cluster.add_worker_unready("cannot-isolate");
    let addr = cluster.workers[index].addr;
    let deadline = Instant::now() + LONG;
    let body: Value = loop {
        if let Ok(ready) = cairn_e2e::http(addr, "GET", "/readyz") {
            assert_ne!(ready.status, 200, "{}", ready.body);
            if ready.status == 503 {
                break serde_json::from_str(&ready.body).expect("json");
            }
        }
        assert!(Instant::now() < deadline, "{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(body["checks"]["work"]["status"], "refused", "{body}");
    let reason = body["checks"]["work"]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("CAIRN_SANDBOX=required") && reason.contains("bwrap"),
        "{body}"
    );
    let (run_id, _) = cluster.submit(&run_spec(vec![sh("isolated", "echo ran")], 1));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let view = cluster.run(&run_id);
    assert_eq!(view["state"], "queued", "{view}");
    let healthy = cairn_e2e::http(addr, "GET", "/healthz").expect("healthz");
    assert_eq!(healthy.status, 200);
    cluster.worker_env.truncate(cluster.worker_env.len() - 2);
    cluster.add_worker();
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let step = step_of(&cluster, &run_id, "isolated");
    assert_eq!(step["sandbox"]["isolated"], true, "{step}");
}

/// A step that writes past its run's disk quota fails with "disk quota exceeded", in its
/// own output and in its receipt, and the host's disk holds no more of it than the quota.
#[tokio::test]
async fn a_step_writing_past_its_disk_quota_fails_and_the_host_keeps_its_disk() {
    let _services = ServiceLock::shared().await;
    let mut cluster = Cluster::start("sandbox-disk", 0, Settings::default()).await;
    cluster.worker_env.extend([
        ("CAIRN_DISK_QUOTA".into(), "required".into()),
        ("CAIRN_RUN_DISK_MB".into(), "64".into()),
    ]);
    cluster.add_worker();
    let ready = cairn_e2e::http(cluster.workers[0].addr, "GET", "/readyz").expect("readyz");
    let body: Value = serde_json::from_str(&ready.body).expect("json");
    assert_eq!(body["details"]["disk"]["quota"], true, "{body}");
    assert_eq!(body["details"]["disk"]["run_disk_mb"], 64, "{body}");
    let image = cluster.workspaces("w1").join(".cairn-disk.img");
    let allocated = || {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&image)
            .expect("the worker's volume")
            .blocks()
            * 512
    };
    let before = allocated();
    // 200 MiB into the tree, then into the home: each stops at 64.
    let fill = sh(
        "fill",
        "dd if=/dev/zero of=big bs=1M count=200 conv=fsync; echo tree=$?; \
         dd if=/dev/zero of=$HOME/big bs=1M count=200 conv=fsync; echo home=$?; exit 1",
    );
    let (run_id, request_id) = cluster.submit(&run_spec(vec![fill], 1));
    cluster.wait_for_state(&run_id, &["failed"], LONG);
    let step = step_of(&cluster, &run_id, "fill");
    assert_eq!(step["limit"], "disk_quota", "{step}");
    let said = format!("{}{}", step["stdout_tail"], step["stderr_tail"]);
    assert!(said.contains("Disk quota exceeded"), "{said}");
    assert!(said.contains("tree=1") && said.contains("home=1"), "{said}");
    let (reason, _) = cluster.stop_reason(&request_id).await;
    assert!(
        reason.unwrap_or_default().contains("disk quota exceeded"),
        "the stop reason names the quota"
    );
    // Two quotas of 64 MiB and the volume's own bookkeeping, not 400 MiB.
    let grown = allocated().saturating_sub(before);
    assert!(grown < 200 << 20, "the host's disk took {grown} bytes");

    // A step within its quota is untouched by it.
    let (run_id, _) = cluster.submit(&run_spec(
        vec![sh(
            "small",
            "dd if=/dev/zero of=small bs=1M count=16 && test -s small",
        )],
        1,
    ));
    cluster.wait_for_state(&run_id, &["completed"], LONG);
}

/// A sandbox created with `network: {"allow": [...]}` holds one namespace whose filter is
/// narrowed to that list: its execs reach exactly what both the list and the worker
/// allow, the view shows the policy, and what the filter refused is counted when the
/// sandbox stops.
#[tokio::test]
async fn a_sandboxs_allow_list_narrows_every_exec() {
    use cairn_e2e::sandboxes::{create, exec, wait_state};
    let _services = ServiceLock::shared().await;
    let topology = Topology::start();
    let mut cluster = Cluster::start("sandbox-allow", 0, Settings::default()).await;
    cluster.add_worker();
    let allow = json!([format!("{PUBLIC}:8080"), format!("{PRIVATE}:8080")]);
    let (status, refused) = cluster.call(
        "POST",
        "/api/v1/sandboxes",
        Some(&json!({"agent": "coder", "network": {"allow": []}})),
    );
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["error"]["field"], "network.allow", "{refused}");
    let id = create(
        &cluster,
        json!({"agent": "coder", "network": {"allow": allow}}),
    );
    let view = wait_state(&cluster, &id, "running");
    assert_eq!(view["network"]["allow"], allow, "{view}");
    let probe = format!(
        "python3 -c \"import socket\nfor name, host, port in [('public', '{PUBLIC}', 8080), \
         ('public-other-port', '{PUBLIC}', 8081), ('private', '{PRIVATE}', 8080), ('postgres', '127.0.0.1', 5432)]:\n\
         \x20 try:\n\
         \x20   s = socket.create_connection((host, port), timeout=3); print(name, 'reached')\n\
         \x20 except Exception as e:\n\
         \x20   print(name, 'refused')\""
    );
    let (status, seen) = exec(&cluster, &id, &probe);
    assert_eq!(status, 200, "{seen}");
    let out = seen["result"]["stdout"].as_str().unwrap_or("").to_string();
    for (name, reached) in [
        ("public", true),
        ("public-other-port", false),
        // Named by the sandbox, refused by the worker: a list only narrows.
        ("private", false),
        ("postgres", false),
    ] {
        let expected = format!("{name} {}", if reached { "reached" } else { "refused" });
        assert!(out.lines().any(|l| l == expected), "{expected}: {out}");
    }
    let before = cluster.metric(0, "cairn_worker_step_egress_refused_packets_total");
    let (status, stopped) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    assert_eq!(status, 200, "{stopped}");
    cluster.wait_until("the sandbox's refusals are counted", LONG, || {
        cluster.metric(0, "cairn_worker_step_egress_refused_packets_total") > before
    });
    drop(topology);
}

/// Sets the default tenant's network policy with `cairnctl tenant network default ARGS`.
fn tenant_network(cluster: &Cluster, args: &[&str]) -> Value {
    let out = cluster
        .cairnctl()
        .args(["--json", "tenant", "network", "default"])
        .args(args)
        .output()
        .expect("cairnctl");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("json")
}

/// The tenant's layer of the egress policy narrows what the operator allows, and a run's
/// or sandbox's own list narrows it further: a step reaches only what every layer lets
/// through. A tenant with `false` leaves its steps and sandboxes no network, and their
/// receipts and errors say who took it away.
#[tokio::test]
async fn a_tenants_network_policy_narrows_its_runs_and_sandboxes() {
    use cairn_e2e::sandboxes::{create, exec, wait_state};
    let _services = ServiceLock::shared().await;
    let topology = Topology::start();
    let mut cluster = Cluster::start("sandbox-tenant-egress", 0, Settings::default()).await;
    cluster
        .worker_env
        .push(("CAIRN_STEP_EGRESS_ALLOW".into(), PRIVATE.to_string()));
    cluster.add_worker();
    let targets = [
        ("public", PUBLIC.to_string(), 8080),
        ("public-other-port", PUBLIC.into(), 8081),
        ("private", PRIVATE.into(), 8080),
        ("private-other-port", PRIVATE.into(), 8081),
        ("postgres", "127.0.0.1".into(), 5432),
    ];
    let script = probe_script(&targets);
    let step = |key: &str, network: Value| {
        json!({"key": key, "argv": ["python3", "-c", script], "timeout_seconds": 120,
               "network": network})
    };
    let saved = tenant_network(
        &cluster,
        &[
            "--allow",
            &format!("{PUBLIC}:8080"),
            "--allow",
            &format!("{PRIVATE}:8080"),
        ],
    );
    assert_eq!(
        saved["network"]["allow"].as_array().map(Vec::len),
        Some(2),
        "{saved}"
    );
    // The tenant's list names the private server on one port (the operator allows both):
    // the other port is refused. The step's own list names the public server's other
    // port (the tenant refuses it) and its first.
    let own = json!({"allow": [format!("{PUBLIC}:8081"), format!("{PUBLIC}:8080")]});
    let (run_id, _) = cluster.submit(&run_spec(
        vec![step("tenant", json!(true)), step("own", own)],
        1,
    ));
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let view = cluster.run(&run_id);
    assert_eq!(view["tenant_network"], saved["network"], "{view}");
    for (key, reached) in [
        ("tenant", &["public", "private"][..]),
        ("own", &["public"][..]),
    ] {
        let receipt = step_of(&cluster, &run_id, key);
        let out = receipt["stdout_tail"].as_str().unwrap_or_default();
        for (name, _, _) in &targets {
            let got = probe_line(out, name);
            let verdict = if reached.contains(name) {
                " reached "
            } else {
                " refused "
            };
            assert!(
                got.contains(verdict),
                "{key}: {name} must be{verdict}: {out}"
            );
        }
        let layers = &receipt["sandbox"]["egress"]["narrowed_by"];
        assert_eq!(layers[0]["by"], "tenant", "{receipt}");
    }
    let own = step_of(&cluster, &run_id, "own");
    assert_eq!(
        own["sandbox"]["egress"]["narrowed_by"][1]["by"], "run",
        "{own}"
    );

    // A sandbox's held namespace is narrowed the same way.
    let id = create(&cluster, json!({"agent": "coder"}));
    wait_state(&cluster, &id, "running");
    let (status, seen) = exec(&cluster, &id, &format!("python3 -c \"{script}\""));
    assert_eq!(status, 200, "{seen}");
    let out = seen["result"]["stdout"].as_str().unwrap_or("").to_string();
    for (name, _, _) in &targets {
        let reached = ["public", "private"].contains(name);
        let verdict = if reached { " reached " } else { " refused " };
        assert!(
            probe_line(&out, name).contains(verdict),
            "sandbox {name}: {out}"
        );
    }
    let (status, _) = cluster.call("DELETE", &format!("/api/v1/sandboxes/{id}"), None);
    assert_eq!(status, 200);

    // `false` takes the network away from every later step and sandbox of the tenant.
    let off = tenant_network(&cluster, &["--off"]);
    assert_eq!(off["network"], false, "{off}");
    let (run_id, _) = cluster.submit(&run_spec(vec![step("closed", json!(true))], 1));
    cluster.wait_for_state(&run_id, &["completed"], LONG);
    let closed = step_of(&cluster, &run_id, "closed");
    let out = closed["stdout_tail"].as_str().unwrap_or_default();
    for (name, _, _) in &targets {
        assert!(
            probe_line(out, name).contains(" refused "),
            "closed {name}: {out}"
        );
    }
    assert_eq!(closed["sandbox"]["network"], false, "{closed}");
    assert_eq!(
        closed["sandbox"]["egress"]["disabled_by"], "tenant",
        "{closed}"
    );
    let id = create(&cluster, json!({"agent": "coder", "network": true}));
    wait_state(&cluster, &id, "running");
    let (status, refused) = cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(&json!({"argv": ["true"], "timeout_sec": 60, "network": true})),
    );
    assert!(
        refused
            .to_string()
            .contains("the tenant's network policy allows no network"),
        "{status} {refused}"
    );
    tenant_network(&cluster, &["--on"]);
    drop(topology);
}
