//! The load of a chaos run: runs of three steps, the middle one not idempotent. Every
//! step appends its name to `trace.txt` in the run's tree (so the tree can be checked
//! against the journal) and a line to the run's effects log outside it (so what ran can
//! be counted from the steps' own side). Each run is submitted with an
//! `Idempotency-Key`, retried through faults, and some are sent twice on purpose.

use crate::fleet::TOKEN;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

pub const STEPS: [&str; 3] = ["s1", "s2", "s3"];

/// The spec of run `key`: its steps sleep a little so that faults find them running.
pub fn spec(key: &str, effects: &Path, rng: &mut StdRng) -> Value {
    let effects = effects.display();
    let step = |name: &str, sleep: f64, idempotent: bool, extra: &str| {
        json!({
            "key": name,
            "argv": ["sh", "-c", format!(
                "sleep {sleep:.2}; echo {name} >> trace.txt; echo '{key} {name}' >> {effects}{extra}"
            )],
            "idempotent": idempotent,
            "timeout_seconds": 120
        })
    };
    json!({
        "agent": "chaos",
        "steps": [
            step("s1", rng.random_range(0.2..1.2), true, ""),
            step("s2", rng.random_range(0.2..1.2), false, ""),
            step("s3", 0.0, true, "; cat trace.txt"),
        ],
        "budgets": {"max_commands": 50, "max_wall_seconds": 3600},
        "max_attempts": 5
    })
}

/// What the submitter saw: the run id each key was answered with (every answer).
#[derive(Default)]
pub struct Admissions {
    pub answers: BTreeMap<String, Vec<String>>,
    /// Submissions that never got an answer within their retry budget.
    pub unanswered: Vec<String>,
}

/// Submits `spec` under `key` until the scheduler answers 201 or 200 (a replay), retrying
/// through lost connections and 5xx for up to `limit`.
pub async fn submit(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    spec: &Value,
    limit: Duration,
) -> Option<String> {
    let deadline = Instant::now() + limit;
    loop {
        let response = http
            .post(format!("{base}/api/v1/runs"))
            .bearer_auth(TOKEN)
            .header("Idempotency-Key", key)
            .timeout(Duration::from_secs(10))
            .json(spec)
            .send()
            .await;
        if let Ok(response) = response {
            let status = response.status().as_u16();
            if status == 201 || status == 200 {
                if let Ok(body) = response.json::<Value>().await {
                    if let Some(id) = body["run_id"].as_str() {
                        return Some(id.to_string());
                    }
                }
            } else if status < 500 && status != 429 {
                eprintln!("submission {key} refused with {status}");
                return None;
            }
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
