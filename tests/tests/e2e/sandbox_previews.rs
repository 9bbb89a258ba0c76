//! Previews end to end: a request to a sandbox's exposed port reaches the server its
//! exec started, through the worker, with the sandbox's own answer; a paused sandbox is
//! woken and the request held until it answers; a stopped one whose server is gone is
//! held, then `503` with `Retry-After`; a non-persistent one is never woken.

use cairn_e2e::cluster::{Cluster, Settings, ADMIN};
use cairn_e2e::sandboxes::*;
use cairn_e2e::ServiceLock;
use serde_json::json;
use std::time::{Duration, Instant};

/// A server that answers every request with its own line, headers and body (201).
const ECHO: &str = r#"
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def handle_one(self):
        n = int(self.headers.get('Content-Length') or 0)
        body = self.rfile.read(n)
        head = ''.join(f'{k.lower()}: {v}\n' for k, v in self.headers.items())
        out = f'{self.command} {self.path}\n{head}\n'.encode() + body
        self.send_response(201)
        self.send_header('Content-Length', str(len(out)))
        self.send_header('X-App', 'echo')
        if 'forge' in self.path:
            self.send_header('cairn-preview-refused', 'not_hosted')
            self.send_header('Set-Cookie', 'session=stolen')
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = do_PUT = handle_one
    def log_message(self, *args):
        pass
http.server.HTTPServer(('127.0.0.1', 8080), H).serve_forever()
"#;

struct Previewer {
    client: reqwest::Client,
    base: String,
}

impl Previewer {
    fn new(cluster: &Cluster) -> Previewer {
        Previewer {
            client: reqwest::Client::new(),
            base: format!("http://{}", cluster.api),
        }
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &'static str,
    ) -> (u16, reqwest::header::HeaderMap, String) {
        let response = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(ADMIN)
            .body(body)
            .send()
            .await
            .expect("the API answers");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        (status, headers, response.text().await.expect("body"))
    }

    async fn get(&self, path: &str) -> (u16, reqwest::header::HeaderMap, String) {
        self.send(reqwest::Method::GET, path, "").await
    }
}

fn start_echo(cluster: &Cluster, id: &str) {
    let (status, written) = raw(
        cluster,
        "PUT",
        &format!("/api/v1/sandboxes/{id}/files/content?path=echo.py"),
        ECHO.as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&written));
    let (status, started) = exec(cluster, id, "nohup python3 echo.py >/dev/null 2>&1 &");
    assert_eq!(status, 200, "{started}");
}

#[tokio::test]
async fn a_preview_reaches_the_sandboxs_port_and_wakes_it() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-preview", 1, Settings::default()).await;
    let previews = Previewer::new(&cluster);
    let id = create(&cluster, json!({"agent": "coder", "ports": [8080, 8081]}));
    let view = wait_state(&cluster, &id, "running");
    assert_eq!(view["ports"], json!([8080, 8081]), "{view}");
    // The sandbox's view names no host, worker, store or lease of the installation's.
    for key in view.as_object().expect("an object").keys() {
        assert!(
            !["worker", "host", "store", "lease", "node", "provider", "identity"]
                .iter()
                .any(|internal| key.contains(internal)),
            "an internal field in the view: {key}"
        );
    }
    let root = format!("/api/v1/sandboxes/{id}/preview");

    // Nothing listens yet on a running sandbox: said at once, not held.
    let (status, _, body) = previews.get(&format!("{root}/8081/")).await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("preview_unreachable"), "{body}");
    let (status, headers, body) = previews.get(&format!("{root}/9999/")).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(headers["cairn-preview-refused"], "port_not_exposed");
    assert!(body.contains("port_not_exposed"), "{body}");
    let (status, _, body) = previews.get(&format!("{root}/http/")).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid_port"), "{body}");

    start_echo(&cluster, &id);
    let mut answered = (0, Default::default(), String::new());
    for _ in 0..100 {
        answered = previews
            .send(
                reqwest::Method::POST,
                &format!("{root}/8080/a/b%20c?x=1&y=2"),
                "payload",
            )
            .await;
        if answered.0 != 502 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, headers, body) = answered;
    assert_eq!(status, 201, "the sandbox's own status: {body}");
    assert_eq!(headers["x-app"], "echo");
    assert!(!headers.contains_key("cairn-preview-refused"));
    assert!(body.starts_with("POST /a/b%20c?x=1&y=2\n"), "{body}");
    assert!(body.contains("host: localhost:8080\n"), "{body}");
    assert!(body.ends_with("\n\npayload"), "{body}");
    assert!(
        !body.contains("authorization") && !body.contains(ADMIN),
        "the caller's token never reaches the sandbox: {body}"
    );

    // A path never leaves the sandbox's own server: dot segments reach it as written.
    let other = uuid::Uuid::new_v4().simple().to_string();
    // (Sent as raw bytes: an HTTP client would resolve the segments itself.)
    let sneaky = format!("{root}/8080/%2e%2e/%2e%2e/{other}/22/metrics");
    let answer = cairn_e2e::exchange(
        cluster.api,
        "GET",
        &sneaky,
        &[format!("Authorization: Bearer {ADMIN}")],
        None,
        b"",
    )
    .expect("the API answers");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(
        answer.contains(&format!("GET /%2e%2e/%2e%2e/{other}/22/metrics\n")),
        "{answer}"
    );
    // The sandbox cannot forge Cairn's refusal nor set a cookie on the API's origin,
    // and its answer is an opaque origin.
    let (status, headers, body) = previews.get(&format!("{root}/8080/forge")).await;
    assert_eq!(status, 201, "{body}");
    assert!(
        !headers.contains_key("cairn-preview-refused"),
        "{headers:?}"
    );
    assert!(!headers.contains_key("set-cookie"), "{headers:?}");
    assert_eq!(headers["content-security-policy"], "sandbox");
    // Cairn's refusals before the handler (no token) are marked too.
    let anonymous = reqwest::get(format!("{}{root}/8080/", previews.base))
        .await
        .expect("the API answers");
    assert_eq!(anonymous.status().as_u16(), 401);
    assert_eq!(anonymous.headers()["cairn-preview-refused"], "unauthorized");

    // `cairnctl sandbox preview` prints the sandbox's answer.
    let printed = std::process::Command::new(cairn_e2e::binary("cairnctl"))
        .args(["sandbox", "preview", &id, "8080", "/cli?z=1"])
        .env("CAIRN_SERVER", format!("http://{}", cluster.api))
        .env("CAIRN_TOKEN", ADMIN)
        .output()
        .expect("cairnctl");
    let stdout = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.status.success(), "{printed:?}");
    assert!(stdout.starts_with("GET /cli?z=1\n"), "{stdout}");

    // Paused: its processes wait, frozen; a preview wakes it and is served.
    let (status, paused) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/pause"), None);
    assert_eq!(status, 200, "{paused}");
    wait_state(&cluster, &id, "paused");
    let (status, _, body) = previews.get(&format!("{root}/8080/woken")).await;
    assert_eq!(status, 201, "{body}");
    assert!(body.starts_with("GET /woken\n"), "{body}");
    assert_eq!(show(&cluster, &id)["state"], "running");

    // Stopped: its server is gone with its processes; the preview wakes it, is held,
    // then told to come back.
    let (status, stopped) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    assert_eq!(status, 200, "{stopped}");
    let started = Instant::now();
    let (status, headers, body) = previews.get(&format!("{root}/8080/")).await;
    let held = started.elapsed();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("sandbox_waking"), "{body}");
    assert_eq!(headers["retry-after"], "2");
    assert!(held >= Duration::from_secs(5), "held for {held:?}");
    wait_state(&cluster, &id, "running");
    start_echo(&cluster, &id);
    let mut status = 0;
    for _ in 0..100 {
        status = previews.get(&format!("{root}/8080/again")).await.0;
        if status != 502 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 201);

    // Not persistent: never woken by a preview.
    let once = create(
        &cluster,
        json!({"agent": "coder", "ports": [8080], "persistent": false}),
    );
    wait_state(&cluster, &once, "running");
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{once}/pause"), None);
    assert_eq!(status, 200);
    wait_state(&cluster, &once, "paused");
    let (status, _, body) = previews
        .get(&format!("/api/v1/sandboxes/{once}/preview/8080/"))
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("not_persistent"), "{body}");
    assert_eq!(show(&cluster, &once)["state"], "paused");
}

/// Polls a preview until it answers other than `502` (a server starting), at most 10 s.
async fn answered(previews: &Previewer, path: &str) -> (u16, String) {
    let mut last = (0, String::new());
    for _ in 0..100 {
        let (status, _, body) = previews.get(path).await;
        last = (status, body);
        if status != 502 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

/// A service starts with the sandbox and again on every resume, so a preview wakes a
/// stopped sandbox into an answer; setting it again restarts it, deleting it ends it.
#[tokio::test]
async fn services_start_on_every_resume_and_a_preview_wakes_a_stopped_sandbox() {
    let _services = ServiceLock::shared().await;
    let cluster = Cluster::start("sandbox-services", 1, Settings::default()).await;
    let previews = Previewer::new(&cluster);
    let serve = |dir: &str| {
        json!({"argv": ["python3", "-m", "http.server", "8080", "--bind", "127.0.0.1",
                        "--directory", dir]})
    };
    let id = create(
        &cluster,
        json!({"agent": "coder", "ports": [8080], "services": {"web": serve("/workspace")}}),
    );
    let view = wait_state(&cluster, &id, "running");
    assert_eq!(view["services"]["web"]["argv"][0], "python3", "{view}");
    let (status, _) = exec(
        &cluster,
        &id,
        "echo root > hello.txt; mkdir sub; echo sub > sub/hello.txt",
    );
    assert_eq!(status, 200);
    let page = format!("/api/v1/sandboxes/{id}/preview/8080/hello.txt");
    assert_eq!(
        answered(&previews, &page).await,
        (200, "root\n".to_string())
    );
    let (_, journal) = cluster.call("GET", &format!("/api/v1/sandboxes/{id}/operations"), None);
    let started: Vec<&serde_json::Value> = journal["operations"]
        .as_array()
        .expect("operations")
        .iter()
        .filter(|o| o["kind"] == "service")
        .collect();
    assert_eq!(started.len(), 1, "{journal}");
    assert_eq!(started[0]["result"]["started"], true, "{journal}");

    // Stopped: every process ends; the preview wakes it, its service starts again, and
    // the held request is answered.
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    assert_eq!(status, 200);
    wait_state(&cluster, &id, "stopped");
    let (status, _, body) = previews.get(&page).await;
    assert_eq!((status, body.as_str()), (200, "root\n"), "woken and served");

    // Set again (with cairnctl): restarted with the new command.
    let path = format!("/api/v1/sandboxes/{id}/services/web");
    let set = std::process::Command::new(cairn_e2e::binary("cairnctl"))
        .args([
            "sandbox", "service", "set", &id, "web", "--", "python3", "-m",
        ])
        .args(["http.server", "8080", "--bind", "127.0.0.1", "--directory"])
        .arg("/workspace/sub")
        .env("CAIRN_SERVER", format!("http://{}", cluster.api))
        .env("CAIRN_TOKEN", ADMIN)
        .output()
        .expect("cairnctl");
    let said = String::from_utf8_lossy(&set.stdout);
    assert!(set.status.success(), "{set:?}");
    assert!(said.starts_with("service web started"), "{said}");
    let mut body = String::new();
    for _ in 0..100 {
        body = answered(&previews, &page).await.1;
        if body == "sub\n" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(body, "sub\n", "the service runs its new command");

    // Deleted: it ends and is gone from the sandbox.
    let (status, deleted) = cluster.call("DELETE", &path, None);
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["result"]["started"], false, "{deleted}");
    let mut status = 0;
    for _ in 0..100 {
        status = previews.get(&page).await.0;
        if status == 502 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 502, "nothing listens once it is deleted");
    assert_eq!(show(&cluster, &id)["services"], json!({}));
    let (status, missing) = cluster.call("DELETE", &path, None);
    assert_eq!(status, 404, "{missing}");
    // A program that is not there does not start, and the receipt says so.
    let (status, failed) = cluster.call("PUT", &path, Some(&json!({"argv": ["no-such-program"]})));
    assert_eq!(status, 200, "{failed}");
    assert_eq!(failed["result"]["started"], false, "{failed}");
    assert!(
        failed["result"]["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("no-such-program: not found"),
        "{failed}"
    );
    // Deleted from a stopped sandbox: only its record changes; it is not resumed.
    let (status, _) = cluster.call("POST", &format!("/api/v1/sandboxes/{id}/stop"), None);
    assert_eq!(status, 200);
    wait_state(&cluster, &id, "stopped");
    let (status, _) = cluster.call("DELETE", &path, None);
    assert_eq!(status, 204);
    let view = show(&cluster, &id);
    assert_eq!(
        (view["state"].as_str(), &view["services"]),
        (Some("stopped"), &json!({}))
    );
    let (status, refused) = cluster.call(
        "PUT",
        &format!("/api/v1/sandboxes/{id}/services/a%20b"),
        Some(&serve("/workspace")),
    );
    assert_eq!(status, 422, "{refused}");
}
