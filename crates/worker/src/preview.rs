//! Previews: the scheduler's requests to a port of a sandbox this worker hosts,
//! forwarded into the sandbox's own network namespace.
//!
//! They arrive on the probes' listener at `/preview/{sandbox}/{port}` with this
//! process's key (random at start, advertised with its address in its heartbeat row, so
//! only a holder of the database can send one) and the sandbox's path and query in a
//! header (never in this URL, which a path could otherwise lead elsewhere in). The
//! connection to the port is made from a thread that has entered the sandbox's network
//! namespace: a socket keeps the namespace it was made in, so the worker's own
//! namespace is never opened to the sandbox, and the sandbox's loopback is reached as
//! the sandbox sees it. Entering it takes `CAP_SYS_ADMIN` (a root worker), as loading a
//! step's egress filter does.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::{Json, Router};
use cairn_common::sandbox::preview::{strip_hop, PATH_HEADER, REFUSED_HEADER};
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uuid::Uuid;

/// How long the sandbox's server may take to send its answer's head.
const ANSWER: Duration = Duration::from_secs(30);

/// How long a connection to the sandbox's port may take.
const CONNECT: Duration = Duration::from_secs(3);

/// Where a hosted sandbox's ports are reached.
#[derive(Debug, Clone)]
pub enum Target {
    /// From inside these network namespaces, tried in order (each opened while the
    /// sandbox's process in it was known to be its, so a reused pid leads nowhere).
    Namespaces(Vec<Arc<std::fs::File>>),
    /// None: the sandbox runs without namespaces here, and its port would be the host's
    /// own loopback (this worker's listener, other tenants' servers), so previews are
    /// refused.
    Host,
}

/// The sandboxes whose ports this worker forwards to, and the key requests must carry.
#[derive(Debug)]
pub struct Previews {
    key: String,
    /// By sandbox: the lease epoch of the hosting that opened it, and where.
    targets: Mutex<HashMap<Uuid, (i64, Target)>>,
}

impl Default for Previews {
    fn default() -> Self {
        Previews {
            key: format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple()),
            targets: Mutex::new(HashMap::new()),
        }
    }
}

impl Previews {
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The sandbox runs here, hosted under lease `epoch`: its ports are reached through
    /// `target`.
    pub fn open(&self, id: Uuid, epoch: i64, target: Target) {
        self.lock().insert(id, (epoch, target));
    }

    /// The hosting under lease `epoch` paused, stopped or left; a later hosting of the
    /// same sandbox here (resumed before this one finished leaving) keeps its own.
    pub fn close(&self, id: Uuid, epoch: i64) {
        let mut targets = self.lock();
        if targets.get(&id).is_some_and(|(opened, _)| *opened == epoch) {
            targets.remove(&id);
        }
    }

    fn target(&self, id: Uuid) -> Option<Target> {
        self.lock().get(&id).map(|(_, target)| target.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, (i64, Target)>> {
        // A panic while holding it leaves the map whole (each change is one call).
        self.targets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `headers` carry this worker's key, compared in constant time.
    pub fn authorized(&self, headers: &HeaderMap) -> bool {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        given.len() == self.key.len()
            && given
                .bytes()
                .zip(self.key.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// The routes the probes' listener adds for previews.
pub fn router(previews: Arc<Previews>) -> Router {
    Router::new()
        .route("/preview/{sandbox}/{port}", any(forward))
        .with_state(previews)
}

/// Why a preview was not forwarded, in the body the scheduler reads.
fn refusal(status: StatusCode, code: &str, message: String) -> Response {
    let body = serde_json::json!({"error": code, "message": message});
    let mut response = (status, Json(body)).into_response();
    if let Ok(code) = HeaderValue::from_str(code) {
        response.headers_mut().insert(REFUSED_HEADER, code);
    }
    response
}

async fn forward(
    State(previews): State<Arc<Previews>>,
    Path((sandbox, port)): Path<(Uuid, u16)>,
    request: Request,
) -> Response {
    relay(&previews, sandbox, port, request).await
}

async fn relay(previews: &Previews, sandbox: Uuid, port: u16, request: Request) -> Response {
    if !previews.authorized(request.headers()) {
        return refusal(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "not this worker's key".into(),
        );
    }
    let Some(target) = previews.target(sandbox) else {
        return refusal(
            StatusCode::NOT_FOUND,
            "not_hosted",
            "the sandbox is not running on this worker".into(),
        );
    };
    let Some(path) = request
        .headers()
        .get(PATH_HEADER)
        .and_then(|p| p.to_str().ok())
        .filter(|p| p.starts_with('/'))
        .and_then(|p| p.parse::<axum::http::uri::PathAndQuery>().ok())
    else {
        return refusal(
            StatusCode::BAD_REQUEST,
            "invalid_path",
            "no sandbox path in the request".into(),
        );
    };
    if matches!(target, Target::Host) {
        return refusal(
            StatusCode::BAD_GATEWAY,
            "no_isolation",
            "this worker runs sandboxes without namespaces: a preview would reach the host's \
             own loopback, so it is refused"
                .into(),
        );
    }
    let stream = match tokio::task::spawn_blocking(move || connect(&target, port)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
            return refusal(
                StatusCode::BAD_GATEWAY,
                "nothing_listens",
                format!("nothing listens on port {port} in the sandbox"),
            )
        }
        Ok(Err(e)) if e.kind() == io::ErrorKind::PermissionDenied => {
            return refusal(
                StatusCode::BAD_GATEWAY,
                "unreachable",
                "this worker may not enter the sandbox's network namespace: previews need a \
                 root worker (CAP_SYS_ADMIN), as a step's network does"
                    .into(),
            )
        }
        Ok(Err(e)) => {
            return refusal(
                StatusCode::BAD_GATEWAY,
                "unreachable",
                format!("port {port} in the sandbox: {e}"),
            )
        }
        Err(e) => return refusal(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
    };
    match send(stream, port, path, request).await {
        Ok(response) => response,
        Err(e) => refusal(
            StatusCode::BAD_GATEWAY,
            "upstream_failed",
            format!("port {port} in the sandbox answered no HTTP response: {e}"),
        ),
    }
}

/// A connection to `port` on the sandbox's loopback: from each of its namespaces in
/// turn until one has a listener.
fn connect(target: &Target, port: u16) -> io::Result<TcpStream> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    match target {
        Target::Host => Err(io::Error::from(io::ErrorKind::PermissionDenied)),
        Target::Namespaces(namespaces) => {
            let mut last = io::Error::from(io::ErrorKind::ConnectionRefused);
            for namespace in namespaces {
                match connect_in(namespace, address) {
                    Ok(stream) => return Ok(stream),
                    Err(e) => last = e,
                }
            }
            Err(last)
        }
    }
}

/// Connects from a thread of its own that enters the network namespace first (the
/// change is that thread's alone, and it ends with the connection made).
fn connect_in(namespace: &std::fs::File, address: SocketAddr) -> io::Result<TcpStream> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::setns(namespace, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(io::Error::from)?;
                TcpStream::connect_timeout(&address, CONNECT)
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the connecting thread panicked")))
    })
}

/// Sends the request, at `path`, over `stream` and answers with the sandbox's response,
/// streamed.
async fn send(
    stream: TcpStream,
    port: u16,
    path: axum::http::uri::PathAndQuery,
    request: Request,
) -> Result<Response, String> {
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    let stream = tokio::net::TcpStream::from_std(stream).map_err(|e| e.to_string())?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let (mut parts, body) = request.into_parts();
    parts.uri = path.into();
    strip_hop(&mut parts.headers);
    parts.headers.remove(header::AUTHORIZATION);
    let host = HeaderValue::from_str(&format!("localhost:{port}")).map_err(|e| e.to_string())?;
    parts.headers.insert(header::HOST, host);
    let sent = sender.send_request(Request::from_parts(parts, body));
    let response = tokio::time::timeout(ANSWER, sent)
        .await
        .map_err(|_| "no answer within 30 s".to_string())?
        .map_err(|e| e.to_string())?;
    // A switch of protocols (or any 1xx) is not relayed: no upgrade was forwarded.
    if response.status().is_informational() {
        return Err(format!("it answered {}", response.status()));
    }
    let (mut parts, body) = response.into_parts();
    strip_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosting_closes_only_what_it_opened() {
        let previews = Previews::default();
        let id = Uuid::new_v4();
        previews.open(id, 1, Target::Host);
        // Resumed here under a new lease before the first hosting finished leaving.
        let namespace = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
        previews.open(id, 2, Target::Namespaces(vec![Arc::new(namespace)]));
        previews.close(id, 1);
        assert!(matches!(previews.target(id), Some(Target::Namespaces(_))));
        previews.close(id, 2);
        assert!(previews.target(id).is_none());
    }

    #[test]
    fn only_the_key_is_authorized() {
        let previews = Previews::default();
        let mut headers = HeaderMap::new();
        assert!(!previews.authorized(&headers));
        let wrong = format!("Bearer {}", "0".repeat(previews.key().len()));
        headers.insert(header::AUTHORIZATION, wrong.parse().expect("header"));
        assert!(!previews.authorized(&headers));
        let right = format!("Bearer {}", previews.key());
        headers.insert(header::AUTHORIZATION, right.parse().expect("header"));
        assert!(previews.authorized(&headers));
    }
}
