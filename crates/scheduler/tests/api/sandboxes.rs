//! Sandboxes through the API: the seed's diagram from every state (each move it does
//! not have is a 409 naming the current state), creation's checks and idempotency.

use axum::http::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use super::harness::*;

const STATES: [&str; 6] = [
    "creating",
    "running",
    "stopped",
    "paused",
    "error",
    "destroyed",
];

/// A sandbox sitting in `state`, held by no worker.
async fn sandbox_in(api: &Api, state: &str, persistent: bool) -> String {
    let id = Uuid::new_v4();
    let desired = match state {
        "stopped" | "paused" | "destroyed" => state,
        _ => "running",
    };
    sqlx::query(
        "INSERT INTO sandboxes (id, agent, state, desired, persistent, always_on, timeout_sec, idle_timeout_sec,
                                disk_mb, request_digest)
         VALUES ($1, 'coder', $2, $3, $4, FALSE, 3600, 1800, 10240, 'd')",
    )
    .bind(id)
    .bind(state)
    .bind(desired)
    .bind(persistent)
    .execute(api.pool())
    .await
    .expect("sandbox");
    id.simple().to_string()
}

fn refused(status: StatusCode, body: &Value, state: &str) {
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["field"], "state", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("is {state}")),
        "names the state {state}: {message}"
    );
}

#[tokio::test]
async fn every_move_the_diagram_lacks_is_a_409_naming_the_state() {
    let api = Api::new().await;
    let token = api.operator.clone();
    for state in STATES {
        // stop: running and paused only (the owner is asked; with none, 202).
        let id = sandbox_in(&api, state, true).await;
        let (status, body) = api
            .post(
                &format!("/api/v1/sandboxes/{id}/stop?wait_seconds=0"),
                &token,
                None,
            )
            .await;
        if matches!(state, "running" | "paused") {
            assert_eq!(status, StatusCode::ACCEPTED, "stop from {state}: {body}");
            assert_eq!(body["pending"], "stopped", "{body}");
        } else {
            refused(status, &body, state);
        }
        // pause: running only.
        let id = sandbox_in(&api, state, true).await;
        let (status, body) = api
            .post(
                &format!("/api/v1/sandboxes/{id}/pause?wait_seconds=0"),
                &token,
                None,
            )
            .await;
        if state == "running" {
            assert_eq!(status, StatusCode::ACCEPTED, "pause from {state}: {body}");
            assert_eq!(body["pending"], "paused", "{body}");
        } else {
            refused(status, &body, state);
        }
        // resume: stopped and paused only.
        let id = sandbox_in(&api, state, true).await;
        let (status, body) = api
            .post(
                &format!("/api/v1/sandboxes/{id}/resume?wait_seconds=0"),
                &token,
                None,
            )
            .await;
        if matches!(state, "stopped" | "paused") {
            assert_eq!(status, StatusCode::ACCEPTED, "resume from {state}: {body}");
        } else {
            refused(status, &body, state);
        }
        // destroy: running, stopped, paused; an error record is deleted.
        let id = sandbox_in(&api, state, true).await;
        let (status, body) = api
            .call(
                "DELETE",
                &format!("/api/v1/sandboxes/{id}?wait_seconds=0"),
                Some(&token),
                None,
            )
            .await;
        if matches!(state, "running" | "stopped" | "paused" | "error") {
            assert_eq!(status, StatusCode::OK, "destroy from {state}: {body}");
            assert_eq!(body["state"], "destroyed", "{body}");
            assert!(body["destroyed_at"].is_string(), "{body}");
        } else {
            refused(status, &body, state);
        }
        // extend: anything not ended.
        let id = sandbox_in(&api, state, true).await;
        let (status, body) = api
            .post(
                &format!("/api/v1/sandboxes/{id}/extend"),
                &token,
                Some(json!({"timeout_sec": 7200})),
            )
            .await;
        if matches!(state, "error" | "destroyed") {
            refused(status, &body, state);
        } else {
            assert_eq!(status, StatusCode::OK, "extend from {state}: {body}");
            assert_eq!(body["timeout_sec"], 7200);
        }
        // exec on a sandbox that can never run again.
        if matches!(state, "error" | "destroyed") {
            let id = sandbox_in(&api, state, true).await;
            let (status, body) = api
                .post(
                    &format!("/api/v1/sandboxes/{id}/exec"),
                    &token,
                    Some(json!({"argv": ["true"]})),
                )
                .await;
            refused(status, &body, state);
        }
    }
    // A stopped or paused sandbox that is not persistent is never resumed by an operation.
    for state in ["stopped", "paused"] {
        let id = sandbox_in(&api, state, false).await;
        let (status, body) = api
            .post(
                &format!("/api/v1/sandboxes/{id}/exec"),
                &token,
                Some(json!({"argv": ["true"]})),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"]["code"], "not_persistent", "{body}");
    }
}

#[tokio::test]
async fn extend_replaces_the_timeout_and_an_empty_body_keeps_it() {
    let api = Api::new().await;
    let id = sandbox_in(&api, "running", true).await;
    let path = format!("/api/v1/sandboxes/{id}/extend");
    let (status, body) = api
        .post(&path, &api.operator, Some(json!({"timeout_sec": 60})))
        .await;
    assert_eq!(
        (status, &body["timeout_sec"]),
        (StatusCode::OK, &json!(60)),
        "{body}"
    );
    let (status, body) = api.post(&path, &api.operator, None).await;
    assert_eq!(
        (status, &body["timeout_sec"]),
        (StatusCode::OK, &json!(60)),
        "kept: {body}"
    );
    let (status, body) = api
        .post(&path, &api.operator, Some(json!({"timeout_sec": 86401})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    // The disk grows through resume, never shrinks.
    let stopped = sandbox_in(&api, "stopped", true).await;
    let resume = format!("/api/v1/sandboxes/{stopped}/resume?wait_seconds=0");
    let (status, body) = api
        .post(&resume, &api.operator, Some(json!({"disk_mb": 1024})))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "disk_shrink", "{body}");
    let (status, body) = api
        .post(&resume, &api.operator, Some(json!({"disk_mb": 20480})))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["disk_mb"], 20480, "{body}");
}

#[tokio::test]
async fn create_checks_its_body_its_source_and_its_key() {
    let api = Api::new().await;
    let create = |body: Value, key: Option<&'static str>| {
        let api = &api;
        async move {
            let headers: Vec<(&str, &str)> = key
                .map(|k| vec![("idempotency-key", k)])
                .unwrap_or_default();
            api.call_with(
                "POST",
                "/api/v1/sandboxes",
                Some(&api.operator),
                Some(body.to_string()),
                &headers,
            )
            .await
        }
    };
    let (status, body) = create(json!({"agent": "coder", "timeout_sec": 0}), None).await;
    assert_eq!(
        (status, &body["error"]["field"]),
        (StatusCode::UNPROCESSABLE_ENTITY, &json!("timeout_sec"))
    );
    let (status, body) = create(json!({"agent": "coder", "disk_mb": "big"}), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = api
        .post(
            "/api/v1/sandboxes",
            &api.viewer,
            Some(json!({"agent": "coder"})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let missing = Uuid::new_v4().simple().to_string();
    let (status, body) = create(
        json!({"agent": "coder", "source": format!("snapshot:{missing}")}),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // A quarantined snapshot is never restored.
    let source = sandbox_in(&api, "stopped", true).await;
    let snapshot = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO project_snapshots (id, kind, status, agent, backend, store_url, sandbox_id)
         VALUES ($1, 'stop', 'quarantined', 'coder', 'local', 'file:///nowhere', $2)",
    )
    .bind(snapshot)
    .bind(Uuid::parse_str(&source).expect("id"))
    .execute(api.pool())
    .await
    .expect("snapshot");
    let from = json!({"agent": "coder", "source": format!("snapshot:{}", snapshot.simple())});
    let (status, body) = create(from, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "snapshot_quarantined", "{body}");

    // The same key and body: the same sandbox; another body: 409. Defaults are input.
    let (status, first) = create(json!({"agent": "coder"}), Some("k1")).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["state"], "creating");
    let (status, again) = create(json!({"agent": "coder", "timeout_sec": 3600}), Some("k1")).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["sandbox_id"], first["sandbox_id"]);
    let (status, other) = create(json!({"agent": "other"}), Some("k1")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{other}");
    let placements: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE routing_key = 'sandboxes'")
            .fetch_one(api.pool())
            .await
            .expect("outbox");
    assert_eq!(placements, 1, "one placement for one sandbox");
}

#[tokio::test]
async fn fork_and_snapshot_need_a_running_sandbox_and_a_valid_body() {
    let api = Api::new().await;
    let running = sandbox_in(&api, "running", true).await;
    for (body, field) in [
        (json!({"count": 0}), "count"),
        (json!({"count": 101}), "count"),
        (json!({"timeout_sec": 0}), "timeout_sec"),
        (json!({"template_id": "ubuntu"}), "template_id"),
    ] {
        let (status, error) = api
            .post(
                &format!("/api/v1/sandboxes/{running}/fork"),
                &api.operator,
                Some(body),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
        assert_eq!(error["error"]["field"], field, "{error}");
    }
    let (status, error) = api
        .post(
            &format!("/api/v1/sandboxes/{running}/fork"),
            &api.operator,
            Some(json!({"disk_mb": 10})),
        )
        .await;
    assert_eq!(
        (status, &error["error"]["code"]),
        (StatusCode::CONFLICT, &json!("disk_shrink"))
    );
    for state in ["creating", "stopped", "paused", "error", "destroyed"] {
        let id = sandbox_in(&api, state, true).await;
        for route in ["fork", "snapshots"] {
            let (status, body) = api
                .post(
                    &format!("/api/v1/sandboxes/{id}/{route}"),
                    &api.operator,
                    None,
                )
                .await;
            refused(status, &body, state);
        }
    }
    let (status, body) = api
        .post(
            &format!("/api/v1/sandboxes/{running}/snapshots"),
            &api.operator,
            Some(json!({"name": ""})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

/// Labels set at creation are shown with the sandbox and filter the list (every pair
/// given must match); the list pages by cursor without repeating or skipping one.
#[tokio::test]
async fn metadata_labels_sandboxes_and_filters_a_list_that_pages() {
    let api = Api::new().await;
    let mut made = Vec::new();
    for labels in [
        json!({"team": "search", "tier": "gold"}),
        json!({"team": "search"}),
        json!({"team": "ads"}),
    ] {
        let body = json!({"agent": "coder", "metadata": labels});
        let (status, sandbox) = api
            .post("/api/v1/sandboxes", &api.operator, Some(body))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{sandbox}");
        assert_eq!(sandbox["metadata"], labels);
        made.push(sandbox["sandbox_id"].as_str().expect("id").to_string());
    }
    let ids = |list: &Value| -> Vec<String> {
        let sandboxes = list["sandboxes"].as_array().cloned().unwrap_or_default();
        sandboxes
            .iter()
            .filter_map(|s| s["sandbox_id"].as_str().map(String::from))
            .collect()
    };
    for (query, expected) in [
        (
            "metadata.team=search",
            vec![made[1].clone(), made[0].clone()],
        ),
        (
            "metadata.team=search&metadata.tier=gold",
            vec![made[0].clone()],
        ),
        ("metadata.team=nobody", vec![]),
        ("agent=coder&metadata.team=ads", vec![made[2].clone()]),
    ] {
        let (status, list) = api
            .get(&format!("/api/v1/sandboxes?{query}"), &api.viewer)
            .await;
        assert_eq!(status, StatusCode::OK, "{query}: {list}");
        assert_eq!(ids(&list), expected, "{query}");
    }
    // Pages of one, newest first: each sandbox once, then no cursor.
    let (mut seen, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let after = cursor.map(|c| format!("&cursor={c}")).unwrap_or_default();
        let (status, page) = api
            .get(&format!("/api/v1/sandboxes?limit=1{after}"), &api.viewer)
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        seen.extend(ids(&page));
        cursor = page["next_cursor"].as_str().map(String::from);
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(seen, [made[2].clone(), made[1].clone(), made[0].clone()]);
}

/// Bad labels, and bad filters of a list, are refused naming the field.
#[tokio::test]
async fn bad_labels_and_bad_list_filters_are_refused() {
    let api = Api::new().await;
    let too_many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
    let long = "x".repeat(257);
    for (labels, status, field) in [
        (
            json!(too_many),
            StatusCode::UNPROCESSABLE_ENTITY,
            "metadata",
        ),
        (
            json!({"bad key": "v"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "metadata",
        ),
        (
            json!({"team": long}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "metadata.team",
        ),
        (json!({"team": 1}), StatusCode::BAD_REQUEST, "metadata.team"),
    ] {
        let body = json!({"agent": "coder", "metadata": labels});
        let (got, answer) = api
            .post("/api/v1/sandboxes", &api.operator, Some(body))
            .await;
        assert_eq!(
            (got, answer["error"]["field"].as_str()),
            (status, Some(field)),
            "{answer}"
        );
    }
    for query in [
        "metadata.bad%20key=x",
        "metadata.team=a&metadata.team=b",
        "owner=me",
        "cursor=nonsense",
    ] {
        let (status, answer) = api
            .get(&format!("/api/v1/sandboxes?{query}"), &api.viewer)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {answer}");
        assert_eq!(
            answer["error"]["code"], "invalid_query",
            "{query}: {answer}"
        );
    }
}

/// A snapshot row of `sandbox`, of `kind`, ready.
async fn ready_snapshot(api: &Api, sandbox: &str, kind: &str) -> String {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO project_snapshots (id, kind, status, agent, backend, store_url, sandbox_id)
         VALUES ($1, $2, 'ready', 'coder', 'local', 'file:///nowhere', $3)",
    )
    .bind(id)
    .bind(kind)
    .bind(Uuid::parse_str(sandbox).expect("id"))
    .execute(api.pool())
    .await
    .expect("snapshot");
    id.simple().to_string()
}

/// A template publishes a ready named snapshot as versions 1, 2, …; each version is its
/// own id and never changes; its snapshot cannot be deleted; a sandbox created with a
/// version's id starts from its snapshot and says so.
#[tokio::test]
async fn templates_publish_named_snapshots_as_immutable_versions() {
    let api = Api::new().await;
    let source = sandbox_in(&api, "stopped", true).await;
    let named = ready_snapshot(&api, &source, "named").await;
    let stop = ready_snapshot(&api, &source, "stop").await;
    let publish = |body: Value| api.post("/api/v1/templates", &api.operator, Some(body));
    let spec = json!({"name": "base", "source": format!("snapshot:{named}"), "description": "v"});
    let (status, first) = publish(spec.clone()).await;
    assert_eq!(
        (status, &first["version"]),
        (StatusCode::CREATED, &json!(1)),
        "{first}"
    );
    let (status, second) = publish(spec).await;
    assert_eq!(
        (status, &second["version"]),
        (StatusCode::CREATED, &json!(2)),
        "{second}"
    );
    assert_ne!(first["template_id"], second["template_id"]);
    let (status, _) = api.get("/api/v1/templates?name=", &api.viewer).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "an empty name is no name");
    let (_, list) = api.get("/api/v1/templates?name=base", &api.viewer).await;
    let versions: Vec<&Value> = list["templates"]
        .as_array()
        .expect("list")
        .iter()
        .map(|t| &t["version"])
        .collect();
    assert_eq!(versions, [&json!(2), &json!(1)], "{list}");
    let one = first["template_id"].as_str().expect("id");
    let (status, read) = api
        .get(&format!("/api/v1/templates/{one}"), &api.viewer)
        .await;
    assert_eq!(
        (status, &read["version"], &read["snapshot_status"]),
        (StatusCode::OK, &json!(1), &json!("ready"))
    );

    for (body, status, code) in [
        (
            json!({"name": "base", "source": format!("snapshot:{stop}")}),
            StatusCode::CONFLICT,
            "not_a_named_snapshot",
        ),
        (
            json!({"name": "bad name", "source": format!("snapshot:{named}")}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
        (
            json!({"name": "base", "source": format!("snapshot:{}", "0".repeat(32))}),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            json!({"name": "base", "source": format!("snapshot:{named}"), "extra": 1}),
            StatusCode::BAD_REQUEST,
            "invalid_body",
        ),
    ] {
        let (got, answer) = publish(body).await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{answer}"
        );
    }
    let (status, _) = api
        .post(
            "/api/v1/templates",
            &api.viewer,
            Some(json!({"name": "x", "source": format!("snapshot:{named}")})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, kept) = api
        .call(
            "DELETE",
            &format!("/api/v1/snapshots/{named}"),
            Some(&api.operator),
            None,
        )
        .await;
    assert_eq!(
        (status, kept["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("snapshot_in_template")),
        "{kept}"
    );

    let create = json!({"agent": "coder", "template_id": one});
    let (status, made) = api
        .post("/api/v1/sandboxes", &api.operator, Some(create))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(
        (&made["template_id"], &made["source"]),
        (&json!(one), &json!(format!("snapshot:{named}")))
    );
    let both = json!({"agent": "coder", "template_id": one, "source": format!("snapshot:{named}")});
    let (status, answer) = api
        .post("/api/v1/sandboxes", &api.operator, Some(both))
        .await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("template_id"))
    );
    let unknown = json!({"agent": "coder", "template_id": "0".repeat(32)});
    let (status, answer) = api
        .post("/api/v1/sandboxes", &api.operator, Some(unknown))
        .await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (StatusCode::NOT_FOUND, Some("template_id")),
        "{answer}"
    );
}
