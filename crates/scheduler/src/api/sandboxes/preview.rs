//! Previews: a request to one of a sandbox's exposed ports (`ports` on create), sent on
//! through the worker that hosts it, with the sandbox's own answer streamed back.
//!
//! A stopped or paused persistent sandbox is woken (resumed, as an exec would) and the
//! request held up to [`HOLD`] while it starts and until its port answers, then `503`
//! with `Retry-After`; a non-persistent one is never woken: `409`. The caller's token
//! never reaches the sandbox. Each request counts as activity.

use super::lifecycle::{lock, resume_in};
use super::operations::takes;
use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::path_id;
use crate::api::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use cairn_common::sandbox::SandboxState;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// How long a request waits for a sandbox that is waking, and for its port.
pub const HOLD: Duration = Duration::from_secs(10);
/// What `Retry-After` asks of a client the hold could not serve, in seconds.
const RETRY_AFTER: &str = "2";
/// The largest request body a preview takes (it is kept for the retries of the hold).
const MAX_BODY: usize = 16 * 1024 * 1024;
/// How often a held request looks again.
const POLL: Duration = Duration::from_millis(50);

/// The header a worker's own refusal carries, telling it from the sandbox's answer.
pub const REFUSED_HEADER: &str = "cairn-preview-refused";

/// Headers that belong to one connection, never forwarded (RFC 9110, 7.6.1), and the
/// caller's credentials, which are Cairn's and never the sandbox's.
const NOT_FORWARDED: &[&str] = &[
    "authorization",
    "connection",
    "host",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default()
    })
}

/// Send a request to an exposed port of the sandbox (`GET` shown; every method is
/// forwarded the same way). The answer is the sandbox's own, whatever its status.
#[utoipa::path(get, operation_id = "get_sandbox_preview", tag = "sandboxes",
    path = "/api/v1/sandboxes/{sandbox_id}/preview/{port}/{path}",
    params(("sandbox_id" = String, Path, description = "32 hex characters"),
        ("port" = u16, Path, description = "One of the sandbox's `ports`"),
        ("path" = String, Path, description = "The path in the sandbox's server (may be empty, may hold `/`)")),
    responses((status = 200, description = "The sandbox's own answer (any status it gives)"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No such sandbox, or the port is not one of its `ports`", body = ErrorBody),
        (status = 409, description = "Not persistent and not running, or being stopped or destroyed", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 502, description = "Running, and nothing answers on the port", body = ErrorBody),
        (status = 503, description = "Still waking after 10 s: retry after `Retry-After`", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn preview(
    State(state): State<AppState>,
    caller: Caller,
    Path((sandbox_id, port, _path)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    marked(forward(&state, &caller, &sandbox_id, &port, request).await)
}

/// The same, at the port's root (`…/preview/{port}`).
pub async fn preview_root(
    State(state): State<AppState>,
    caller: Caller,
    Path((sandbox_id, port)): Path<(String, String)>,
    request: Request,
) -> Response {
    marked(forward(&state, &caller, &sandbox_id, &port, request).await)
}

/// Cairn's own refusals carry [`REFUSED_HEADER`] with their code, so a client tells
/// them from the sandbox's answers (whose bodies and statuses are its own).
fn marked(result: Result<Response, ApiError>) -> Response {
    match result {
        Ok(response) => response,
        Err(error) => {
            let code = error.code;
            let mut response = error.into_response();
            let headers = response.headers_mut();
            headers.insert(REFUSED_HEADER, HeaderValue::from_static(code));
            if code == "sandbox_waking" {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER));
            }
            response
        }
    }
}

async fn forward(
    state: &AppState,
    caller: &Caller,
    sandbox_id: &str,
    port: &str,
    request: Request,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(sandbox_id, "sandbox_id")?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or_else(|| {
        ApiError::bad_request("invalid_port", "port must be a number from 1 to 65535")
            .with_field("port")
    })?;
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_unreadable",
            "a preview's body is at most 16 MiB",
        )
    })?;
    let outgoing = Outgoing {
        method: parts.method,
        path: sandbox_path(parts.uri.path(), port),
        query: parts.uri.query().map(str::to_string),
        headers: parts.headers,
        body,
    };
    let deadline = Instant::now() + HOLD;
    let mut woken = false;
    loop {
        let waking = match locate(state, id, port).await? {
            Located::Running { url, key } => match send(&url, &key, id, port, &outgoing).await {
                Sent::Answered(response) => return Ok(response),
                // A sandbox that was running all along and has nothing on the port says
                // so at once; one being woken gets the hold to start its server.
                Sent::NotYet { why, hosted: true } if !woken => {
                    return Err(ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        "preview_unreachable",
                        why,
                    ))
                }
                Sent::NotYet { why, .. } => why,
            },
            Located::Waking(why) => {
                woken = true;
                why
            }
        };
        if Instant::now() + POLL >= deadline {
            return Err(retry_later(waking));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A `503` asking the client to come back after [`RETRY_AFTER`] seconds.
fn retry_later(why: String) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "sandbox_waking",
        format!("{why}; retry after {RETRY_AFTER} s"),
    )
}

/// What follows `/preview/{port}` in the request's own (still encoded) path.
fn sandbox_path(path: &str, port: u16) -> String {
    let marker = format!("/preview/{port}");
    match path.find(&marker) {
        Some(at) => {
            let rest = &path[at + marker.len()..];
            rest.strip_prefix('/').unwrap_or(rest).to_string()
        }
        None => String::new(),
    }
}

struct Outgoing {
    method: axum::http::Method,
    path: String,
    query: Option<String>,
    headers: HeaderMap,
    body: Bytes,
}

enum Located {
    /// Running, on a worker that takes previews at `url` with `key`.
    Running { url: String, key: String },
    /// Starting or resuming (woken by this request or another).
    Waking(String),
}

type Found = (
    SandboxState,
    String,
    Vec<i32>,
    Option<String>,
    Option<String>,
);

/// Where the sandbox's port is reached now; wakes it if it is stopped or paused and
/// persistent. Counts as activity.
async fn locate(state: &AppState, id: Uuid, port: u16) -> Result<Located, ApiError> {
    let found: Option<Found> = sqlx::query_as(
        "SELECT s.state, s.desired, s.ports, h.preview_url, h.preview_key
           FROM sandboxes s LEFT JOIN worker_heartbeats h ON h.worker_id = s.worker_id
          WHERE s.id = $1",
    )
    .bind(id)
    .fetch_optional(&state.pool)
    .await?;
    let (sandbox_state, desired, ports, url, key) =
        found.ok_or_else(|| ApiError::not_found("sandbox"))?;
    if !ports.contains(&i32::from(port)) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "port_not_exposed",
            format!(
                "port {port} is not one of the sandbox's ports ({ports:?}); set `ports` on create"
            ),
        )
        .with_field("port"));
    }
    let mut conn = state.pool.acquire().await?;
    cairn_common::sandbox::ask::touch(&mut conn, id).await?;
    drop(conn);
    if sandbox_state == SandboxState::Running && desired == "running" {
        return match (url, key) {
            (Some(url), Some(key)) => Ok(Located::Running { url, key }),
            _ => Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "preview_unreachable",
                "the sandbox's worker takes no previews (its CAIRN_PREVIEW_URL is not set)",
            )),
        };
    }
    let mut tx = state.pool.begin().await?;
    let row = lock(&mut tx, id).await?;
    if takes(&row)? {
        resume_in(&mut tx, id, &row).await?;
    }
    tx.commit().await?;
    Ok(Located::Waking(format!(
        "the sandbox is waking (it is {})",
        row.state
    )))
}

enum Sent {
    Answered(Response),
    /// The worker does not hold it yet (`hosted` false), or nothing listens on the
    /// port yet.
    NotYet {
        why: String,
        hosted: bool,
    },
}

/// Sends the request to the worker; the sandbox's answer, or why there is none yet.
async fn send(url: &str, key: &str, id: Uuid, port: u16, out: &Outgoing) -> Sent {
    let mut target = format!("{url}/preview/{}/{port}/{}", id.simple(), out.path);
    if let Some(query) = &out.query {
        target.push('?');
        target.push_str(query);
    }
    let mut headers = out.headers.clone();
    for name in NOT_FORWARDED {
        headers.remove(*name);
    }
    let sent = client()
        .request(out.method.clone(), target)
        .headers(headers)
        .bearer_auth(key)
        .body(out.body.clone())
        .send()
        .await;
    let response = match sent {
        Ok(response) => response,
        Err(e) => {
            return Sent::NotYet {
                why: format!("the sandbox's worker did not answer: {e}"),
                hosted: false,
            }
        }
    };
    if let Some(code) = response.headers().get(REFUSED_HEADER) {
        let hosted = code.as_bytes() != b"not_hosted";
        let why = response
            .json::<serde_json::Value>()
            .await
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| "the sandbox's worker refused the preview".into());
        return Sent::NotYet { why, hosted };
    }
    let status = response.status();
    let mut headers = response.headers().clone();
    for name in NOT_FORWARDED {
        headers.remove(*name);
    }
    let mut answer = Response::new(Body::from_stream(response.bytes_stream()));
    *answer.status_mut() = status;
    *answer.headers_mut() = headers;
    Sent::Answered(answer)
}

#[cfg(test)]
mod tests {
    use super::sandbox_path;

    #[test]
    fn the_sandbox_path_is_what_follows_the_port() {
        let base = "/api/v1/sandboxes/0123456789abcdef0123456789abcdef/preview/8080";
        assert_eq!(sandbox_path(base, 8080), "");
        assert_eq!(sandbox_path(&format!("{base}/"), 8080), "");
        assert_eq!(sandbox_path(&format!("{base}/a/b%20c"), 8080), "a/b%20c");
        assert_eq!(sandbox_path(&format!("{base}//x"), 8080), "/x");
    }
}
