//! What the live console reads: the run change feed (server-sent events resumed by
//! `Last-Event-ID`, each tenant seeing its own runs, a late commit never skipped), the
//! runs list's id search, and the fleet overview's samples.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::time::Duration;
use tower::ServiceExt;

use super::harness::*;
use super::tenants::beta_admin;

/// An open run change feed.
struct Feed {
    body: Body,
    buffer: String,
}

#[derive(Debug)]
struct Event {
    kind: String,
    id: String,
    data: Value,
}

impl Feed {
    async fn open(api: &Api, token: &str, query: &str, last: Option<&str>) -> (StatusCode, Feed) {
        let mut request = Request::builder()
            .uri(format!("/api/v1/runs/events{query}"))
            .header("authorization", format!("Bearer {token}"));
        if let Some(last) = last {
            request = request.header("last-event-id", last);
        }
        let response = api
            .app
            .clone()
            .oneshot(request.body(Body::empty()).expect("request"))
            .await
            .expect("response");
        let status = response.status();
        let feed = Feed {
            body: response.into_body(),
            buffer: String::new(),
        };
        (status, feed)
    }

    /// The next event within `wait`, or `None`.
    async fn next(&mut self, wait: Duration) -> Option<Event> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = Event {
                    kind: String::new(),
                    id: String::new(),
                    data: Value::Null,
                };
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ").or(line.strip_prefix("event:")) {
                        event.kind = v.to_string();
                    } else if let Some(v) = line.strip_prefix("id: ").or(line.strip_prefix("id:")) {
                        event.id = v.to_string();
                    } else if let Some(v) =
                        line.strip_prefix("data: ").or(line.strip_prefix("data:"))
                    {
                        event.data = serde_json::from_str(v).unwrap_or(Value::Null);
                    }
                }
                // A comment (keep-alive) is no event.
                if event.kind.is_empty() {
                    continue;
                }
                return Some(event);
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .ok()??
                .expect("a frame");
            if let Ok(data) = frame.into_data() {
                self.buffer.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }

    /// Every event until `ready`, that one included (a stream that repeats itself
    /// without end fails here rather than hang).
    async fn until_ready(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        loop {
            assert!(events.len() < 2000, "no ready after 2000 events");
            let event = self.next(Duration::from_secs(10)).await.expect("ready");
            let ready = event.kind == "ready";
            events.push(event);
            if ready {
                return events;
            }
        }
    }

    /// Events until one shows `run_id` in `state`; that one is the last.
    async fn until_run(&mut self, run_id: &str, state: &str) -> Vec<Event> {
        let mut events = Vec::new();
        loop {
            let event = self
                .next(Duration::from_secs(10))
                .await
                .unwrap_or_else(|| panic!("{run_id} never {state}: {events:?}"));
            let found = event.data["run_id"] == run_id && event.data["state"] == state;
            events.push(event);
            if found {
                return events;
            }
        }
    }
}

fn runs_in(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e.kind == "run")
        .map(|e| {
            (
                e.data["run_id"].as_str().unwrap_or_default().to_string(),
                e.data["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_run_feed_goes_on_after_the_last_event_id_and_shows_a_tenant_its_own_runs() {
    let api = Api::new().await;
    let (status, mut feed) = Feed::open(&api, &api.admin, "", None).await;
    assert_eq!(status, StatusCode::OK);
    let origin = feed.until_ready().await.pop().expect("ready").id;

    let a = api.submit(&api.operator).await;
    feed.until_run(&a, "queued").await;
    let (status, _) = api
        .post(&format!("/api/v1/runs/{a}/cancel"), &api.operator, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let seen = feed.until_run(&a, "cancelled").await;
    let last = seen.last().expect("an event").id.clone();
    drop(feed);

    // Missed while away: only what changed after the last event had.
    let b = api.submit(&api.operator).await;
    let (_, mut again) = Feed::open(&api, &api.viewer, "", Some(&last)).await;
    let replay = runs_in(&again.until_run(&b, "queued").await);
    assert!(replay.iter().all(|(run, _)| *run == b), "{replay:?}");

    // One run, from the start: its state as it is now, once.
    let (_, mut one) = Feed::open(&api, &api.admin, &format!("?run_id={a}"), Some(&origin)).await;
    let replay = runs_in(&one.until_run(&a, "cancelled").await);
    assert_eq!(replay, vec![(a.clone(), "cancelled".to_string())]);
    if let Some(more) = one.next(Duration::from_millis(600)).await {
        assert_eq!(more.kind, "ready", "{more:?}");
    }

    // Another tenant sees none of the default tenant's runs, and its own.
    let beta = beta_admin(&api).await;
    let (_, mut theirs) = Feed::open(&api, &beta, "", Some(&origin)).await;
    let own = api.submit(&beta).await;
    let seen = runs_in(&theirs.until_run(&own, "queued").await);
    assert!(seen.iter().all(|(run, _)| *run == own), "{seen:?}");

    for bad in ["nope", "12_xyz", "-3", "1:2: 3"] {
        let (status, _) = Feed::open(&api, &api.admin, "", Some(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    // An empty one is none: the stream starts now.
    let (status, mut fresh) = Feed::open(&api, &api.admin, "", Some("")).await;
    assert_eq!(status, StatusCode::OK);
    fresh.until_ready().await;
    // Made of what a position is made of, and not one.
    for unordered in ["9:5:", "5:9:7,6", "5:9:;5:9:;6;1234", "a"] {
        let (status, _) = Feed::open(&api, &api.admin, "", Some(unordered)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{unordered}");
    }
    // One from a server ahead of this one (a restore), caught up or part way to a
    // target: the stream starts again now.
    let far = "999999999999:999999999999:";
    for ahead in [far.to_string(), format!("5:9:;{far};6;{a}")] {
        let (status, mut feed) = Feed::open(&api, &api.admin, "", Some(&ahead)).await;
        assert_eq!(status, StatusCode::OK);
        let first = feed.next(Duration::from_secs(10)).await.expect("an event");
        assert_eq!(first.kind, "reset", "{ahead}: {first:?}");
    }
    let (status, _) = Feed::open(&api, &api.admin, "?run_id=123", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// A transaction that wrote a run first and commits after a later one is still sent
/// when it commits, and, open, it holds back nothing else: the later write is sent at
/// once.
#[tokio::test]
async fn a_change_that_commits_after_a_later_one_is_never_skipped() {
    let api = Api::new().await;
    let early = api.submit(&api.operator).await;
    let late = api.submit(&api.operator).await;
    let (_, mut feed) = Feed::open(&api, &api.admin, "", None).await;
    feed.until_ready().await;

    let mut slow = api.pool().begin().await.expect("begin");
    sqlx::query("UPDATE runs SET labels = '{\"slow\": \"yes\"}' WHERE id = $1::uuid")
        .bind(&early)
        .execute(&mut *slow)
        .await
        .expect("the slow write");
    sqlx::query("UPDATE runs SET labels = '{\"fast\": \"yes\"}' WHERE id = $1::uuid")
        .bind(&late)
        .execute(api.pool())
        .await
        .expect("the fast write");
    // The fast write has committed and the feed polls meanwhile; the slow one is open.
    let mut labelled = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while let Some(event) = feed.next(deadline - tokio::time::Instant::now()).await {
        labelled.push(event.data["labels"].clone());
    }
    assert_eq!(
        labelled,
        vec![json!({"fast": "yes"})],
        "the committed write, at once"
    );
    slow.commit().await.expect("commit");
    while !labelled.contains(&json!({"slow": "yes"})) || !labelled.contains(&json!({"fast": "yes"}))
    {
        let event = feed
            .next(Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("the feed skipped a write; it sent {labelled:?}"));
        labelled.push(event.data["labels"].clone());
    }
}

#[tokio::test]
async fn runs_are_found_by_the_start_of_their_id() {
    let api = Api::new().await;
    let a = api.submit(&api.operator).await;
    let b = api.submit(&api.operator).await;
    let (status, page) = api
        .get(&format!("/api/v1/runs?run_id={}", &a[..8]), &api.viewer)
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let found: Vec<&str> = page["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|r| r["run_id"].as_str())
        .collect();
    assert!(found.contains(&a.as_str()), "{page}");
    assert!(
        !found.contains(&b.as_str()) || b.starts_with(&a[..8]),
        "{page}"
    );
    let (_, whole) = api
        .get(&format!("/api/v1/runs?run_id={a}"), &api.viewer)
        .await;
    assert_eq!(whole["runs"].as_array().map(Vec::len), Some(1), "{whole}");
    for bad in ["abc", "ABCD", "zzzz", &format!("{a}0")] {
        let (status, body) = api
            .get(&format!("/api/v1/runs?run_id={bad}"), &api.viewer)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(error_field(&body), "run_id", "{body}");
    }
}

#[tokio::test]
async fn the_overview_counts_what_ended_in_each_interval_for_a_platform_token() {
    let api = Api::new().await;
    let cancelled = api.submit(&api.operator).await;
    api.submit(&api.operator).await;
    let (status, _) = api
        .post(
            &format!("/api/v1/runs/{cancelled}/cancel"),
            &api.operator,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    // The sample of the second the cancel happened in is taken after that second ends.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock");
    tokio::time::sleep(Duration::from_millis(1200 - u64::from(now.subsec_millis()))).await;
    assert!(cairn_common::overview::record(api.pool(), 1)
        .await
        .expect("a sample"));
    assert!(
        !cairn_common::overview::record(api.pool(), 1)
            .await
            .expect("again"),
        "an interval is sampled once"
    );

    let (status, overview) = api.get("/api/v1/overview?minutes=5", &api.admin).await;
    assert_eq!(status, StatusCode::OK, "{overview}");
    let samples = overview["samples"].as_array().expect("samples");
    assert_eq!(samples.len(), 1, "{overview}");
    let sample = &samples[0];
    assert_eq!(sample["runs_per_second"], json!(1.0), "{sample}");
    assert_eq!(sample["completed_per_second"], json!(0.0), "{sample}");
    assert_eq!(sample["queued"], 1, "{sample}");
    assert_eq!(sample["running"], 0, "{sample}");
    assert_eq!(sample["workers"], 0, "{sample}");
    assert_eq!(overview["interval_seconds"], 1, "{overview}");

    let (status, _) = api.get("/api/v1/overview", &api.viewer).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a tenant's token");
    for bad in ["0", "1441", "x"] {
        let (status, _) = api
            .get(&format!("/api/v1/overview?minutes={bad}"), &api.admin)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

/// More changes than one poll reads (200): every run once, in order, across the batch's
/// end; a reconnect from an event part way through goes on with the next one.
#[tokio::test]
async fn a_burst_larger_than_a_batch_is_sent_once_and_resumed_from_within() {
    let api = Api::new().await;
    let (_, mut feed) = Feed::open(&api, &api.admin, "", None).await;
    let origin = feed.until_ready().await.pop().expect("ready").id;
    let mut submitted = Vec::new();
    for _ in 0..250 {
        submitted.push(api.submit(&api.operator).await);
    }
    let (_, mut replay) = Feed::open(&api, &api.admin, "", Some(&origin)).await;
    let events: Vec<Event> = replay
        .until_ready()
        .await
        .into_iter()
        .filter(|e| e.kind == "run")
        .collect();
    let ids: Vec<String> = runs_in(&events).into_iter().map(|(run, _)| run).collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "a run sent twice");
    submitted.sort();
    assert_eq!(unique, submitted);

    // From the 100th event: the 101st on, exactly.
    let (_, mut resumed) = Feed::open(&api, &api.admin, "", Some(&events[99].id)).await;
    let rest: Vec<String> = runs_in(&resumed.until_ready().await)
        .into_iter()
        .map(|(run, _)| run)
        .collect();
    assert_eq!(rest, ids[100..].to_vec());
}
