//! `cairnctl runs logs RUN [STEP] [--follow]`: a step's output (every started step's,
//! in plan order, without STEP) as the step printed it: stdout to stdout, stderr to
//! stderr, bytes as they were. With `--follow`, it waits for each step to start and
//! prints its output as it arrives, like `kubectl logs -f`, until the run ends.

use crate::client::{exit, CallError, Client};
use crate::id;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::Value;
use std::io::Write;
use std::time::Duration;

/// The run states after which no step starts.
pub const ENDED: [&str; 6] = [
    "completed",
    "failed",
    "cancelled",
    "stopped_at_checkpoint",
    "needs_reconciliation",
    "awaiting_verification",
];

/// How often a follower checks whether the next step started.
const WAIT: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    /// Writes bytes to this process's stream of the same name, at once.
    fn write(self, bytes: &[u8]) {
        // A closed reader (`| head`) ends nothing here: the bytes have nowhere to go.
        let _ = match self {
            Stream::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes).and_then(|()| out.flush())
            }
            Stream::Stderr => {
                let mut err = std::io::stderr().lock();
                err.write_all(bytes).and_then(|()| err.flush())
            }
        };
    }
}

pub async fn logs(
    client: &Client,
    run: &str,
    step: Option<String>,
    follow: bool,
    stream: Option<Stream>,
) -> Result<u8, CallError> {
    let run = id(run, "RUN")?;
    let streams = match stream {
        Some(one) => vec![one],
        None => vec![Stream::Stdout, Stream::Stderr],
    };
    let view = client.get(&format!("/api/v1/runs/{run}")).await?;
    let keys: Vec<String> = match step {
        Some(key) => {
            let planned = view["steps"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["key"] == key.as_str()));
            if !planned {
                return Err(CallError::new(
                    exit::NOT_FOUND,
                    format!("run {run} has no step {key}"),
                ));
            }
            vec![key]
        }
        None => view["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["key"].as_str().map(String::from))
            .collect(),
    };
    for key in &keys {
        let printed = if follow {
            follow_step(client, &run, key, &streams).await?
        } else {
            print_step(client, &run, key, &streams).await?
        };
        // Steps start in plan order: after one that never started, none did.
        if !printed {
            break;
        }
    }
    Ok(exit::OK)
}

fn output_path(run: &str, key: &str, stream: Stream) -> String {
    format!(
        "/api/v1/runs/{run}/steps/{key}/output?stream={}",
        stream.name()
    )
}

/// Prints a step's output so far; whether it has started.
async fn print_step(
    client: &Client,
    run: &str,
    key: &str,
    streams: &[Stream],
) -> Result<bool, CallError> {
    for &stream in streams {
        let path = output_path(run, key, stream);
        match client.call_bytes(reqwest::Method::GET, &path, None).await {
            Ok((_, bytes)) => stream.write(&bytes),
            Err(e) if e.code == exit::NOT_FOUND => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Waits for a step to start and prints its streams until it ends, attempt after
/// attempt (a step a later attempt runs again is followed again), until it has a
/// receipt or the run ended; whether it started (it never does when the run ends first).
async fn follow_step(
    client: &Client,
    run: &str,
    key: &str,
    streams: &[Stream],
) -> Result<bool, CallError> {
    let mut followed: Option<i64> = None;
    loop {
        let Some(attempt) = next_attempt(client, run, key, followed).await? else {
            return match followed {
                Some(_) => Ok(true),
                // One last look: the step may have started and ended meanwhile.
                None => print_step(client, run, key, streams).await,
            };
        };
        let mut printing = Vec::new();
        for &stream in streams {
            let path = format!("{}&follow=true", output_path(run, key, stream));
            let response = client.open_stream(&path).await?;
            printing.push(print_events(response, stream));
        }
        for ended in futures::future::join_all(printing).await {
            ended?;
        }
        followed = Some(attempt);
        let (receipted, _) = step_state(client, run, key).await?;
        if receipted {
            return Ok(true);
        }
    }
}

/// The lease epoch of the step's latest attempt once it is newer than `followed`, or
/// `None` when the run ended first.
async fn next_attempt(
    client: &Client,
    run: &str,
    key: &str,
    followed: Option<i64>,
) -> Result<Option<i64>, CallError> {
    loop {
        let (_, epoch) = step_state(client, run, key).await?;
        if let Some(epoch) = epoch.filter(|e| followed.is_none_or(|f| *e > f)) {
            return Ok(Some(epoch));
        }
        let view = client.get(&format!("/api/v1/runs/{run}")).await?;
        if ENDED.contains(&view["state"].as_str().unwrap_or_default()) {
            return Ok(None);
        }
        tokio::time::sleep(WAIT).await;
    }
}

/// Whether the run's step has a receipt, and the lease epoch of its latest intent.
async fn step_state(
    client: &Client,
    run: &str,
    key: &str,
) -> Result<(bool, Option<i64>), CallError> {
    let view = client.get(&format!("/api/v1/runs/{run}")).await?;
    let journal = client.get(&format!("/api/v1/runs/{run}/journal")).await?;
    let step = journal["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["step_key"] == key && s["request_id"] == view["request_id"]);
    Ok(step.map_or((false, None), |s| {
        (s["status"] != "unknown_outcome", s["intent_epoch"].as_i64())
    }))
}

/// Prints each `output` event's bytes until the `end` event (of a step or an exec).
pub async fn print_events(response: reqwest::Response, stream: Stream) -> Result<(), CallError> {
    let mut events = response.bytes_stream().eventsource();
    while let Some(event) = events.next().await {
        let event = event
            .map_err(|e| CallError::new(exit::ERROR, format!("the output stream broke: {e}")))?;
        match event.event.as_str() {
            "output" => {
                let chunk: Value = serde_json::from_str(&event.data).unwrap_or_default();
                let text = chunk["text"].as_str().unwrap_or_default();
                let bytes = cairn_common::output::unescape(text)
                    .unwrap_or_else(|| text.as_bytes().to_vec());
                stream.write(&bytes);
            }
            "end" => return Ok(()),
            _ => {}
        }
    }
    Err(CallError::new(
        exit::ERROR,
        "the output stream ended before the step did",
    ))
}
