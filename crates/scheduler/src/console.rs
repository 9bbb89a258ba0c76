//! The operator console: a few static files compiled into the binary and served at `/`
//! and `/console/*`. The page is plain JavaScript modules over the JSON API, so there is
//! nothing to build and no Node toolchain; everything it shows, the API serves, and it
//! has no authority of its own (each call carries the signed-in token).

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// Scripts and styles only from here; no inline code, no other origin, no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const INDEX: &str = include_str!("../console/index.html");

/// Each asset: its name under `/console/`, its content type and its bytes.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/app.js"),
    ),
    (
        "core.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/core.js"),
    ),
    (
        "submit.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/submit.js"),
    ),
    (
        "runs.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/runs.js"),
    ),
    (
        "run.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/run.js"),
    ),
    (
        "plan.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/plan.js"),
    ),
    (
        "publish.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/publish.js"),
    ),
    (
        "questions.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/questions.js"),
    ),
    (
        "records.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/records.js"),
    ),
    (
        "reconcile.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/reconcile.js"),
    ),
    (
        "verification.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/verification.js"),
    ),
    (
        "overview.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/overview.js"),
    ),
    (
        "charts.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/charts.js"),
    ),
    (
        "charts.css",
        "text/css; charset=utf-8",
        include_str!("../console/charts.css"),
    ),
    (
        "operations.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/operations.js"),
    ),
    (
        "sandboxes.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/sandboxes.js"),
    ),
    (
        "connections.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/connections.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../console/style.css"),
    ),
];

/// `/` and `/console/{file}`.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/console/{file}", get(asset))
}

fn respond(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // A new binary serves new files; a browser must not keep the old ones.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

async fn index() -> Response {
    respond("text/html; charset=utf-8", INDEX)
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, content_type, body)) => respond(content_type, body),
        None => (StatusCode::NOT_FOUND, "no such console file").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every module a script imports is served: a missing one breaks the page.
    #[test]
    fn every_imported_module_is_served() {
        for (name, _, body) in ASSETS {
            for line in body.lines().filter(|l| l.starts_with("import ")) {
                let Some(from) = line.split("from \"./").nth(1) else {
                    continue;
                };
                let module = from.trim_end_matches("\";");
                assert!(
                    ASSETS.iter().any(|(n, _, _)| *n == module),
                    "{name} imports {module}, which is not served"
                );
            }
        }
        for script in ["/console/app.js", "/console/style.css"] {
            assert!(INDEX.contains(script), "index.html does not load {script}");
        }
    }
}
