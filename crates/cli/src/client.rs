//! The scheduler's HTTP API as the CLI sees it: every failure becomes an exit code a
//! script can branch on.

use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::fmt;
use std::time::Duration;

/// Exit codes of `cairnctl`.
pub mod exit {
    pub const OK: u8 = 0;
    pub const ERROR: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    pub const CONFLICT: u8 = 4;
    pub const REJECTED: u8 = 5;
    pub const DENIED: u8 = 6;
    /// The watched run failed; or what was waited for did not finish in time.
    pub const NOT_COMPLETED: u8 = 8;
    /// The watched run was cancelled.
    pub const CANCELLED: u8 = 9;
    /// The watched run needs a person: `needs_reconciliation`,
    /// `stopped_at_checkpoint` or `awaiting_verification`.
    pub const NEEDS_PERSON: u8 = 10;
    /// The request may or may not have taken effect: read its status.
    pub const UNCERTAIN: u8 = 75;
}

/// A failed call, with the exit code it maps to.
#[derive(Debug)]
pub struct CallError {
    pub code: u8,
    pub message: String,
    /// The scheduler could not be reached or failed (a 5xx): trying again may work.
    pub transient: bool,
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CallError {}

impl CallError {
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        CallError {
            code,
            message: message.into(),
            transient: false,
        }
    }

    fn transient(mut self) -> Self {
        self.transient = true;
        self
    }
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    server: String,
    token: Option<String>,
}

/// What an answered call returned.
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
}

impl Client {
    pub fn new(
        server: &str,
        token: Option<String>,
        timeout: Duration,
    ) -> Result<Client, CallError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| {
                CallError::new(exit::ERROR, format!("cannot build an HTTP client: {e}"))
            })?;
        Ok(Client {
            http,
            server: server.trim_end_matches('/').to_string(),
            token,
        })
    }

    /// One request. A refused connection is `ERROR` (nothing was sent). A lost answer or
    /// a 5xx is `UNCERTAIN` for a write, whose outcome is then unknown, and `ERROR` for
    /// a read.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Answer, CallError> {
        let body = body.map(|b| (b.to_string().into_bytes(), "application/json"));
        let (status, bytes) = self.exchange(method, path, body, headers).await?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Answer { status, body })
    }

    /// One request with a raw body (bytes and their media type); the answer's bytes.
    pub async fn call_bytes(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Vec<u8>), CallError> {
        let body = body.map(|b| (b, "application/octet-stream"));
        self.exchange(method, path, body, &[]).await
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<(Vec<u8>, &str)>,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, Vec<u8>), CallError> {
        let unknown = outcome_unknown(&method);
        let response = self.send(method, path, body, headers, None).await?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| {
            CallError::new(unknown, format!("the answer was cut off: {}", cause(&e))).transient()
        })?;
        Ok((status, bytes.to_vec()))
    }

    /// A GET whose answer is read as it arrives (server-sent events): no time limit
    /// but the connection's own.
    pub async fn open_stream(&self, path: &str) -> Result<reqwest::Response, CallError> {
        let forever = Duration::from_secs(7 * 86_400);
        let headers = [("accept", "text/event-stream")];
        self.send(Method::GET, path, None, &headers, Some(forever))
            .await
    }

    /// Sends a request; a successful answer is returned unread, another becomes the
    /// error its status and body say.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(Vec<u8>, &str)>,
        headers: &[(&str, &str)],
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, CallError> {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.server));
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some((bytes, media_type)) = body {
            request = request.header("content-type", media_type).body(bytes);
        }
        let unknown = outcome_unknown(&method);
        let response = request.send().await.map_err(|e| {
            if e.is_connect() {
                // Nothing was sent: whatever it was, it did not happen.
                return CallError::new(
                    exit::ERROR,
                    format!(
                        "cannot reach the scheduler at {}: {}",
                        self.server,
                        cause(&e)
                    ),
                )
                .transient();
            }
            let what = if unknown == exit::UNCERTAIN {
                "; the request may or may not have taken effect: read its status"
            } else {
                ""
            };
            CallError::new(
                unknown,
                format!("no answer from {}: {}{what}", self.server, cause(&e)),
            )
            .transient()
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        Err(refusal(response, unknown).await)
    }

    pub async fn get(&self, path: &str) -> Result<Value, CallError> {
        Ok(self.call(Method::GET, path, None, &[]).await?.body)
    }
}

/// The error a non-success answer stands for: its documented body's code, message
/// and field, and the exit code of its status (`unknown` where the outcome is).
async fn refusal(response: reqwest::Response, unknown: u8) -> CallError {
    let status = response.status();
    let bytes = match response.bytes().await {
        Ok(bytes) => bytes,
        Err(e) => {
            let cut = format!("the answer was cut off: {}", cause(&e));
            return CallError::new(unknown, cut).transient();
        }
    };
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    let (code, message, field) = match &body["error"] {
        Value::Object(e) => (
            e.get("code")
                .and_then(Value::as_str)
                .unwrap_or("error")
                .to_string(),
            e.get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            e.get("field").and_then(Value::as_str).map(String::from),
        ),
        _ => ("error".into(), body.to_string(), None),
    };
    let exit_code = match status {
        StatusCode::NOT_FOUND => exit::NOT_FOUND,
        StatusCode::CONFLICT => exit::CONFLICT,
        StatusCode::BAD_REQUEST
        | StatusCode::UNPROCESSABLE_ENTITY
        | StatusCode::UNSUPPORTED_MEDIA_TYPE => exit::REJECTED,
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => exit::DENIED,
        s if s.is_server_error() => unknown,
        _ => exit::ERROR,
    };
    let field = field.map(|f| format!(" (field {f})")).unwrap_or_default();
    let error = CallError::new(
        exit_code,
        format!("{} {code}: {message}{field}", status.as_u16()),
    );
    if status.is_server_error() {
        error.transient()
    } else {
        error
    }
}

/// The exit code of a call that got no answer: only a write can leave an outcome
/// unknown; a read that failed did nothing.
fn outcome_unknown(method: &Method) -> u8 {
    if method == Method::GET || method == Method::HEAD {
        exit::ERROR
    } else {
        exit::UNCERTAIN
    }
}

/// The innermost cause of a failed call, in plain words ("connection refused").
fn cause(error: &reqwest::Error) -> String {
    let mut innermost: &dyn std::error::Error = error;
    while let Some(source) = innermost.source() {
        innermost = source;
    }
    if let Some(io) = innermost.downcast_ref::<std::io::Error>() {
        match io.kind() {
            std::io::ErrorKind::ConnectionRefused => return "connection refused".into(),
            std::io::ErrorKind::ConnectionReset => return "connection reset".into(),
            std::io::ErrorKind::TimedOut => return "timed out".into(),
            _ => {}
        }
    }
    if error.is_timeout() {
        return "timed out".into();
    }
    innermost.to_string()
}
