//! Helpers of the sandbox tests: the API calls they make, raw bytes included.

use crate::cluster::{Cluster, ADMIN};
use crate::exchange;
use serde_json::{json, Value};
use std::time::Duration;

pub const LONG: Duration = Duration::from_secs(60);

pub fn create(cluster: &Cluster, body: Value) -> String {
    let (status, view) = cluster.call("POST", "/api/v1/sandboxes", Some(&body));
    assert_eq!(status, 201, "{view}");
    assert_eq!(view["state"], "creating", "{view}");
    view["sandbox_id"].as_str().expect("id").to_string()
}

pub fn show(cluster: &Cluster, id: &str) -> Value {
    let (status, view) = cluster.call("GET", &format!("/api/v1/sandboxes/{id}"), None);
    assert_eq!(status, 200, "{view}");
    view
}

pub fn wait_state(cluster: &Cluster, id: &str, state: &str) -> Value {
    let mut last = Value::Null;
    cluster.wait_until(&format!("sandbox {id} {state}"), LONG, || {
        last = show(cluster, id);
        last["state"] == state && last.get("pending").is_none()
    });
    last
}

pub fn exec(cluster: &Cluster, id: &str, script: &str) -> (u16, Value) {
    cluster.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(&json!({"argv": ["sh", "-c", script], "timeout_sec": 60})),
    )
}

/// A raw request: its status and body bytes.
pub fn raw(cluster: &Cluster, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let response = exchange(
        cluster.api,
        method,
        path,
        &[format!("Authorization: Bearer {ADMIN}")],
        Some("application/octet-stream"),
        body,
    )
    .expect("request");
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("head");
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(
        !head.to_ascii_lowercase().contains("chunked"),
        "a chunked reply: {head}"
    );
    (status, response[split + 4..].to_vec())
}

pub fn file(cluster: &Cluster, id: &str, path: &str) -> (u16, Vec<u8>) {
    raw(
        cluster,
        "GET",
        &format!("/api/v1/sandboxes/{id}/files/content?path={path}"),
        b"",
    )
}

pub async fn worker_of(cluster: &Cluster, id: &str) -> Option<String> {
    let uuid = uuid::Uuid::parse_str(id).expect("uuid");
    sqlx::query_scalar("SELECT worker_id FROM sandboxes WHERE id = $1")
        .bind(uuid)
        .fetch_one(&cluster.pool)
        .await
        .expect("worker")
}

pub fn operations(cluster: &Cluster, id: &str) -> Vec<Value> {
    let (status, list) = cluster.call("GET", &format!("/api/v1/sandboxes/{id}/operations"), None);
    assert_eq!(status, 200, "{list}");
    list["operations"].as_array().expect("operations").clone()
}

pub fn post_keyed(cluster: &Cluster, path: &str, key: &str, body: &Value) -> (u16, Value, bool) {
    let response = exchange(
        cluster.api,
        "POST",
        path,
        &[
            format!("Authorization: Bearer {ADMIN}"),
            format!("Idempotency-Key: {key}"),
        ],
        Some("application/json"),
        body.to_string().as_bytes(),
    )
    .expect("request");
    let text = String::from_utf8_lossy(&response).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let replayed = head
        .to_ascii_lowercase()
        .contains("idempotent-replayed: true");
    (
        status,
        serde_json::from_str(body).unwrap_or(Value::Null),
        replayed,
    )
}
