//! How a sandbox is printed, and the `Idempotency-Key` header of a lifecycle call.

use crate::output;
use serde_json::Value;

pub const HEADER: [&str; 6] = [
    "sandbox",
    "state",
    "agent",
    "persistent",
    "stop_reason",
    "created",
];

pub fn row(sandbox: &Value) -> Vec<String> {
    let state = match sandbox["pending"].as_str() {
        Some(pending) => format!("{} (→ {pending})", output::text(&sandbox["state"])),
        None => output::text(&sandbox["state"]),
    };
    vec![
        output::text(&sandbox["sandbox_id"]),
        state,
        output::text(&sandbox["agent"]),
        output::text(&sandbox["persistent"]),
        output::text(&sandbox["stop_reason"]),
        output::text(&sandbox["created_at"]),
    ]
}

pub fn show(sandbox: &Value, json: bool) {
    if json {
        return output::json(sandbox);
    }
    output::fields(
        sandbox,
        &[
            "sandbox_id",
            "state",
            "pending",
            "agent",
            "persistent",
            "always_on",
            "timeout_sec",
            "idle_timeout_sec",
            "disk_mb",
            "repository",
            "ref",
            "source",
            "stop_reason",
            "error_reason",
            "durability",
            "stop_snapshot_id",
            "last_activity_at",
            "created_at",
            "stopped_at",
            "destroyed_at",
        ],
    );
    if sandbox["metadata"]
        .as_object()
        .is_some_and(|m| !m.is_empty())
    {
        println!("metadata         {}", sandbox["metadata"]);
    }
}

/// The `Idempotency-Key` header, when one is given.
pub fn keyed(key: &Option<String>) -> Vec<(&str, &str)> {
    key.as_deref()
        .map(|k| vec![("idempotency-key", k)])
        .unwrap_or_default()
}
