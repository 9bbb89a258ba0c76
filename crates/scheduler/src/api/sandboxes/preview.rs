//! Previews: a request to one of a sandbox's exposed ports (`ports` on create), sent on
//! through the worker that hosts it, with the sandbox's own answer streamed back.
//!
//! A stopped or paused persistent sandbox is woken (resumed, as an exec would) and the
//! request held up to [`HOLD`] while it starts and until its port answers, then `503`
//! with `Retry-After`; a non-persistent one is never woken: `409`. The caller's token
//! never reaches the sandbox. Each request counts as activity.
//!
//! The sandbox's path goes to the worker in a header, never in the worker's URL: a URL
//! is normalised (`..` resolved), and a path could then name another sandbox or another
//! route of the worker. The sandbox's answer is served as an opaque origin
//! (`Content-Security-Policy: sandbox`) without cookies: it shares its host with the
//! API and the console.

use super::lifecycle::{lock, resume_in};
use super::operations::takes;
use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody, ErrorCode};
use crate::api::path_id;
use crate::api::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use cairn_common::sandbox::preview::{strip_hop, PATH_HEADER, REFUSED_HEADER};
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

/// How long the sandbox's server may take to answer (its headers; the body streams).
const ANSWER: Duration = Duration::from_secs(30);
/// The most of a worker's refusal read (a JSON error body).
const MAX_REFUSAL: usize = 4096;

/// Marks a response the sandbox gave (the rest are Cairn's, see [`mark_refusals`]).
#[derive(Debug, Clone, Copy)]
struct Forwarded;

/// Removes what never crosses a hop, and the caller's credentials and host, which are
/// Cairn's and never the sandbox's.
fn strip(headers: &mut HeaderMap) {
    strip_hop(headers);
    headers.remove(header::AUTHORIZATION);
    headers.remove(header::HOST);
}

/// Every answer on a preview route that the sandbox did not give (the tenancy guard's,
/// a token's refusal, the handler's) carries [`REFUSED_HEADER`] with its code, and a
/// `503` asks to come back after [`RETRY_AFTER`] seconds.
pub async fn mark_refusals(request: Request, next: axum::middleware::Next) -> Response {
    let preview = raw_segments(request.uri().path()).is_some();
    let mut response = next.run(request).await;
    if !preview
        || response.status().is_success()
        || response.extensions().get::<Forwarded>().is_some()
    {
        return response;
    }
    // An error of the API's names its code; another (a body the router refused) its
    // status's.
    let code = match response.extensions().get::<ErrorCode>() {
        Some(ErrorCode(code)) => code,
        None => response.status().canonical_reason().unwrap_or("refused"),
    };
    let code = HeaderValue::from_str(code).unwrap_or(HeaderValue::from_static("refused"));
    response.headers_mut().insert(REFUSED_HEADER, code);
    if response.status() == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER));
    }
    response
}

/// The client of every hop to a worker's probes listener (previews, an exec's calls).
pub(super) fn client() -> &'static reqwest::Client {
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
    Path((sandbox_id, _port, _path)): Path<(String, String, String)>,
    request: Request,
) -> Result<Response, ApiError> {
    forward(&state, &caller, &sandbox_id, request).await
}

/// The same, at the port's root (`…/preview/{port}`).
pub async fn preview_root(
    State(state): State<AppState>,
    caller: Caller,
    Path((sandbox_id, _port)): Path<(String, String)>,
    request: Request,
) -> Result<Response, ApiError> {
    forward(&state, &caller, &sandbox_id, request).await
}

async fn forward(
    state: &AppState,
    caller: &Caller,
    sandbox_id: &str,
    request: Request,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = path_id(sandbox_id, "sandbox_id")?;
    // The port and the sandbox's path as the caller wrote them (still encoded): the
    // router's parameters are decoded, and `%38%30` must not stand for `80`.
    let raw = request.uri().path().to_string();
    let (port, rest) = raw_segments(&raw).unwrap_or_default();
    // Digits only: `+80` would parse.
    let port: u16 = Some(port)
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|p| p.parse().ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| {
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
    let mut path = format!("/{rest}");
    if let Some(query) = parts.uri.query() {
        path.push('?');
        path.push_str(query);
    }
    let path = HeaderValue::from_bytes(path.as_bytes()).map_err(|_| {
        ApiError::bad_request("invalid_query", "the path is not a valid request target")
            .with_field("path")
    })?;
    let outgoing = Outgoing {
        method: parts.method,
        path,
        headers: parts.headers,
        body,
    };
    let deadline = Instant::now() + HOLD;
    let mut conn = state.pool.acquire().await?;
    cairn_common::sandbox::ask::touch(&mut conn, id).await?;
    drop(conn);
    let mut woken = false;
    let mut pause = POLL;
    loop {
        let waking = match locate(state, id, port, !woken).await? {
            Located::Running { url, key, starting } => {
                match send(&url, &key, id, port, &outgoing).await {
                    Sent::Answered(response) => return Ok(response),
                    // Nothing reached the sandbox's server yet: a sandbox woken by this
                    // request or lately started (its services starting) gets the hold;
                    // one running all along with nothing on the port says so at once.
                    Sent::NotYet { why, hosted: true } if !woken && !starting => {
                        return Err(unreachable(why))
                    }
                    Sent::NotYet { why, .. } => why,
                    // The request may have reached the server: it is never sent again.
                    Sent::Failed(why) => return Err(unreachable(why)),
                }
            }
            Located::Waking(why) => {
                woken = true;
                why
            }
        };
        if Instant::now() + pause >= deadline {
            return Err(retry_later(waking));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(400));
    }
}

fn unreachable(why: String) -> ApiError {
    ApiError::new(StatusCode::BAD_GATEWAY, "preview_unreachable", why)
}

/// The port and the rest of a preview route's raw path
/// (`/api/v1/sandboxes/{id}/preview/{port}[/{rest}]`), or `None` for another route.
fn raw_segments(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/api/v1/sandboxes/")?;
    let (_, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("preview/")?;
    Some(rest.split_once('/').unwrap_or((rest, "")))
}

/// A `503` asking the client to come back after [`RETRY_AFTER`] seconds.
fn retry_later(why: String) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "sandbox_waking",
        format!("{why}; retry after {RETRY_AFTER} s"),
    )
}

struct Outgoing {
    method: axum::http::Method,
    /// The sandbox's path and query, as the caller wrote them.
    path: HeaderValue,
    headers: HeaderMap,
    body: Bytes,
}

enum Located {
    /// Running, on a worker that takes previews at `url` with `key`; `starting` while its
    /// services are being started, or were within the hold.
    Running {
        url: String,
        key: String,
        starting: bool,
    },
    /// Starting or resuming (woken by this request or another).
    Waking(String),
}

type Found = (
    SandboxState,
    String,
    Vec<i32>,
    Option<String>,
    Option<String>,
    bool,
);

/// Where the sandbox's port is reached now; with `wake`, wakes it if it is stopped or
/// paused and persistent.
async fn locate(state: &AppState, id: Uuid, port: u16, wake: bool) -> Result<Located, ApiError> {
    let found: Option<Found> = sqlx::query_as(
        "SELECT s.state, s.desired, s.ports, h.preview_url, h.preview_key,
                EXISTS (SELECT 1 FROM sandbox_operations o
                         WHERE o.sandbox_id = s.id AND o.kind = 'service'
                           AND (o.state IN ('pending', 'running')
                                OR o.finished_at > now() - interval '10 seconds'))
           FROM sandboxes s LEFT JOIN worker_heartbeats h ON h.worker_id = s.worker_id
          WHERE s.id = $1",
    )
    .bind(id)
    .fetch_optional(&state.pool)
    .await?;
    let (sandbox_state, desired, ports, url, key, starting) =
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
    if sandbox_state == SandboxState::Running && desired == "running" {
        return match (url, key) {
            (Some(url), Some(key)) => Ok(Located::Running { url, key, starting }),
            _ => Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "preview_unreachable",
                "the sandbox's worker takes no previews (its CAIRN_PREVIEW_URL is not set)",
            )),
        };
    }
    if !wake {
        return Ok(Located::Waking(format!(
            "the sandbox is waking (it is {sandbox_state})"
        )));
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
    /// Nothing reached the sandbox's server: the worker does not hold it yet (`hosted`
    /// false), or nothing listens on the port yet.
    NotYet {
        why: String,
        hosted: bool,
    },
    /// The request may have reached the server, and got no answer.
    Failed(String),
}

/// Sends the request to the worker; the sandbox's answer, or why there is none yet.
async fn send(url: &str, key: &str, id: Uuid, port: u16, out: &Outgoing) -> Sent {
    let mut headers = out.headers.clone();
    strip(&mut headers);
    headers.insert(PATH_HEADER, out.path.clone());
    let sent = client()
        .request(
            out.method.clone(),
            format!("{url}/preview/{}/{port}", id.simple()),
        )
        .headers(headers)
        .bearer_auth(key)
        .body(out.body.clone())
        .send();
    let mut response = match tokio::time::timeout(ANSWER, sent).await {
        Ok(Ok(response)) => response,
        // The worker's address stays out of the message: it is the installation's.
        Ok(Err(e)) if e.is_connect() => {
            tracing::warn!(error = %e, "a preview's worker could not be reached");
            return Sent::NotYet {
                why: "the sandbox's worker could not be reached".into(),
                hosted: false,
            };
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "a preview's worker did not answer");
            return Sent::Failed("the sandbox's worker did not answer".into());
        }
        Err(_) => {
            return Sent::Failed(format!(
                "port {port} in the sandbox answered nothing within 30 s"
            ))
        }
    };
    if let Some(code) = response.headers().get(REFUSED_HEADER) {
        let code = code.as_bytes().to_vec();
        let hosted = code != b"not_hosted";
        // Before the sandbox's server: no host yet, nothing listening, no connection.
        let undelivered = matches!(
            &code[..],
            b"not_hosted" | b"nothing_listens" | b"unreachable"
        );
        let mut body = Vec::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            body.extend_from_slice(&chunk);
            if body.len() >= MAX_REFUSAL {
                break;
            }
        }
        let why = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| "the sandbox's worker refused the preview".into());
        return if undelivered {
            Sent::NotYet { why, hosted }
        } else {
            Sent::Failed(why)
        };
    }
    let status = response.status();
    if status.is_informational() {
        return Sent::Failed(format!("port {port} in the sandbox answered {status}"));
    }
    let mut headers = response.headers().clone();
    strip(&mut headers);
    // Served beside the API and the console: an opaque origin, and no cookies.
    headers.remove(header::SET_COOKIE);
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox"),
    );
    let mut answer = Response::new(Body::from_stream(response.bytes_stream()));
    *answer.status_mut() = status;
    *answer.headers_mut() = headers;
    answer.extensions_mut().insert(Forwarded);
    Sent::Answered(answer)
}

#[cfg(test)]
mod tests {
    use super::raw_segments;

    #[test]
    fn the_port_and_the_path_are_taken_as_written() {
        let base = "/api/v1/sandboxes/0123456789abcdef0123456789abcdef/preview";
        assert_eq!(raw_segments(&format!("{base}/8080")), Some(("8080", "")));
        assert_eq!(raw_segments(&format!("{base}/8080/")), Some(("8080", "")));
        assert_eq!(
            raw_segments(&format!("{base}/8080/a/b%20c")),
            Some(("8080", "a/b%20c"))
        );
        assert_eq!(
            raw_segments(&format!("{base}/8080//x")),
            Some(("8080", "/x"))
        );
        assert_eq!(
            raw_segments(&format!("{base}/%38%30/a")),
            Some(("%38%30", "a"))
        );
        assert_eq!(raw_segments("/api/v1/runs/0123/steps/preview/output"), None);
        assert_eq!(
            raw_segments("/api/v1/agents/preview/credentials/rotate"),
            None
        );
    }
}
