//! Tenants: a token reaches only its tenant's runs, sandboxes, snapshots, tokens and
//! policy. Another tenant's id answers as an unknown id does, on every route the OpenAPI
//! document lists, and no list shows it.

use axum::http::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use super::continuation::stop_at_checkpoint;
use super::harness::*;

/// What the default tenant owns, by path parameter.
struct Owned {
    run_id: String,
    request_id: String,
    sandbox_id: String,
    snapshot_id: String,
    token_id: String,
    template_id: String,
    operation_id: String,
}

impl Owned {
    async fn new(api: &Api) -> Owned {
        let stopped = stop_at_checkpoint(api, &api.operator).await;
        let (status, sandbox) = api
            .post(
                "/api/v1/sandboxes",
                &api.operator,
                Some(json!({"agent": "coder"})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{sandbox}");
        let sandbox_id = sandbox["sandbox_id"].as_str().expect("id").to_string();
        let snapshot = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO project_snapshots (id, kind, status, agent, backend, store_url, sandbox_id)
             VALUES ($1, 'named', 'ready', 'coder', 'local', 'file:///nowhere', $2)",
        )
        .bind(snapshot)
        .bind(Uuid::parse_str(&sandbox_id).expect("id"))
        .execute(api.pool())
        .await
        .expect("snapshot");
        let source = json!({"name": "base", "source": format!("snapshot:{}", snapshot.simple())});
        let (status, template) = api
            .post("/api/v1/templates", &api.operator, Some(source))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{template}");
        let mut conn = api.pool().acquire().await.expect("connection");
        let exec = json!({"kind": "exec", "argv": ["true"], "env": {}, "timeout_sec": 60});
        let sandbox_uuid = Uuid::parse_str(&sandbox_id).expect("id");
        let operation =
            cairn_common::sandbox::operations::record(&mut conn, sandbox_uuid, "exec", &exec)
                .await
                .expect("operation");
        let token: Uuid = sqlx::query_scalar("SELECT id FROM api_tokens WHERE name = 'operator'")
            .fetch_one(api.pool())
            .await
            .expect("token");
        Owned {
            run_id: stopped.run_id.simple().to_string(),
            request_id: stopped.request_id.simple().to_string(),
            sandbox_id,
            snapshot_id: snapshot.simple().to_string(),
            token_id: token.simple().to_string(),
            template_id: template["template_id"].as_str().expect("id").to_string(),
            operation_id: operation.simple().to_string(),
        }
    }

    /// The route with its parameters filled in: owned ids, or fresh ones.
    fn fill(&self, route: &str, fresh: bool) -> String {
        let id = |owned: &str| {
            if fresh {
                Uuid::new_v4().simple().to_string()
            } else {
                owned.to_string()
            }
        };
        route
            .replace("{run_id}", &id(&self.run_id))
            .replace("{request_id}", &id(&self.request_id))
            .replace("{sandbox_id}", &id(&self.sandbox_id))
            .replace("{snapshot_id}", &id(&self.snapshot_id))
            .replace("{token_id}", &id(&self.token_id))
            .replace("{template_id}", &id(&self.template_id))
            .replace("{operation_id}", &id(&self.operation_id))
            .replace(
                "{tenant_id}",
                if fresh { "no-such-tenant" } else { "default" },
            )
            .replace("{action_id}", &Uuid::new_v4().simple().to_string())
            .replace("{step_key}", "build")
            .replace("{agent}", "coder")
    }
}

/// Makes tenant `beta` and an admin token of it.
pub(super) async fn beta_admin(api: &Api) -> String {
    let (status, tenant) = api
        .post(
            "/api/v1/tenants",
            &api.admin,
            Some(json!({"tenant_id": "beta"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{tenant}");
    let (status, token) = api
        .post(
            "/api/v1/tokens",
            &api.admin,
            Some(json!({"name": "beta-admin", "role": "admin", "tenant": "beta"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    assert_eq!(token["tenant"], "beta", "{token}");
    token["token"].as_str().expect("secret").to_string()
}

/// Every route of the document with an owned id in its path.
async fn owned_routes(api: &Api) -> Vec<(String, String)> {
    let (_, doc) = api.call("GET", "/api/v1/openapi.json", None, None).await;
    let mut routes = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let owned = [
            "{run_id}",
            "{sandbox_id}",
            "{snapshot_id}",
            "{token_id}",
            "{tenant_id}",
            "{template_id}",
        ]
        .iter()
        .any(|p| path.contains(p));
        if !owned {
            continue;
        }
        for method in item.as_object().expect("methods").keys() {
            routes.push((method.to_uppercase(), path.clone()));
        }
    }
    routes
}

#[tokio::test]
async fn another_tenants_ids_answer_as_unknown_ones_on_every_route() {
    let api = Api::new().await;
    let owned = Owned::new(&api).await;
    let beta = beta_admin(&api).await;
    let routes = owned_routes(&api).await;
    assert!(routes.len() >= 30, "{routes:?}");
    let before = api.footprint().await;
    for (method, route) in &routes {
        let body = (method != "GET").then(|| json!({}));
        let path = owned.fill(route, false);
        let (status, answer) = api.call(method, &path, Some(&beta), body.clone()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {answer}");
        assert_eq!(
            error_code(&answer),
            "not_found",
            "{method} {path}: {answer}"
        );
        // The same answer, word for word, as to ids no tenant has.
        let unknown = owned.fill(route, true);
        let (status, none) = api.call(method, &unknown, Some(&beta), body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {unknown}: {none}");
        assert_eq!(answer, none, "{method} {route}");
    }
    // Another tenant's template starts nothing, as an unknown one.
    let from = json!({"agent": "coder", "template_id": owned.template_id});
    let (status, answer) = api.post("/api/v1/sandboxes", &beta, Some(from)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_eq!(
        api.footprint().await,
        before,
        "a refused call changed something"
    );

    // The owning tenant still reaches all of it.
    for path in [
        format!("/api/v1/runs/{}", owned.run_id),
        format!("/api/v1/sandboxes/{}", owned.sandbox_id),
        format!("/api/v1/snapshots/{}", owned.snapshot_id),
        format!("/api/v1/templates/{}", owned.template_id),
        format!(
            "/api/v1/sandboxes/{}/operations/{}",
            owned.sandbox_id, owned.operation_id
        ),
    ] {
        let (status, body) = api.get(&path, &api.viewer).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
    let (status, run) = api
        .get(&format!("/api/v1/runs/{}", owned.run_id), &api.viewer)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(run["tenant"], "default", "{run}");
}

#[tokio::test]
async fn a_tenant_cannot_reach_another_tenants_request_through_its_own_run() {
    let api = Api::new().await;
    let owned = Owned::new(&api).await;
    let beta = beta_admin(&api).await;
    let own_run = api.submit(&beta).await;
    for kind in ["checkpoint-continuations", "final-outcome-continuations"] {
        let path = format!(
            "/api/v1/runs/{own_run}/{kind}/requests/{}/candidate",
            owned.request_id
        );
        let (status, body) = api.get(&path, &beta).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    let path = format!(
        "/api/v1/runs/{own_run}/verification-handoffs/adoptions/{}",
        owned.request_id
    );
    let (status, body) = api.get(&path, &beta).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
}

fn mentions(body: &Value, ids: &[&str]) -> Option<String> {
    let text = body.to_string();
    ids.iter()
        .find(|id| text.contains(*id))
        .map(|id| id.to_string())
}

#[tokio::test]
async fn lists_show_only_the_callers_tenant() {
    let api = Api::new().await;
    let owned = Owned::new(&api).await;
    let beta = beta_admin(&api).await;
    let ids = [
        owned.run_id.as_str(),
        owned.sandbox_id.as_str(),
        owned.snapshot_id.as_str(),
        owned.token_id.as_str(),
    ];
    for path in [
        "/api/v1/runs",
        "/api/v1/runs?state=stopped_at_checkpoint",
        "/api/v1/sandboxes",
        "/api/v1/snapshots",
        "/api/v1/tokens",
        "/api/v1/workers",
        "/api/v1/tenants",
    ] {
        let (status, body) = api.get(path, &beta).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert_eq!(
            mentions(&body, &ids),
            None,
            "{path} shows another tenant's: {body}"
        );
        assert!(!body.to_string().contains("\"default\""), "{path}: {body}");
    }
    let (_, counts) = api.get("/api/v1/runs/counts", &beta).await;
    let total: i64 = counts["counts"]
        .as_object()
        .expect("counts")
        .values()
        .filter_map(Value::as_i64)
        .sum();
    assert_eq!(total, 0, "{counts}");

    // Its own run is listed, and its announcement names its tenant.
    let own = api.submit(&beta).await;
    let (_, runs) = api.get("/api/v1/runs", &beta).await;
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(1), "{runs}");
    assert_eq!(runs["runs"][0]["run_id"], own.as_str());
    let tenant: String =
        sqlx::query_scalar("SELECT payload->>'tenant' FROM outbox WHERE payload->>'run_id' = $1")
            .bind(Uuid::parse_str(&own).expect("id").to_string())
            .fetch_one(api.pool())
            .await
            .expect("announcement");
    assert_eq!(tenant, "beta");

    // A platform token lists every tenant's.
    let (_, all) = api.get("/api/v1/runs", &api.admin).await;
    assert_eq!(all["runs"].as_array().map(Vec::len), Some(2), "{all}");
}

#[tokio::test]
async fn tenant_admins_manage_only_their_tenant() {
    let api = Api::new().await;
    let beta = beta_admin(&api).await;
    let (status, body) = api
        .post(
            "/api/v1/tenants",
            &beta,
            Some(json!({"tenant_id": "gamma"})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    for tenant in ["default", "nonexistent"] {
        let (status, body) = api
            .post(
                "/api/v1/tokens",
                &beta,
                Some(json!({"name": "x", "role": "viewer", "tenant": tenant})),
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{tenant}: {body}");
    }
    // A malformed tenant id is a field error, not an unknown tenant.
    let (status, body) = api
        .post(
            "/api/v1/tokens",
            &api.admin,
            Some(json!({"name": "x", "role": "viewer", "tenant": ""})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "tenant", "{body}");
    let (status, made) = api
        .post(
            "/api/v1/tokens",
            &beta,
            Some(json!({"name": "v", "role": "viewer"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(made["tenant"], "beta", "{made}");
    // Each tenant's recovery policy is its own.
    let (status, changed) = api.put_policy(&beta, json!({"enabled": true})).await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    let (_, default) = api.get(POLICY, &api.viewer).await;
    assert_eq!(default["enabled"], false, "{default}");
    // A platform-wide route is refused to a tenant's token.
    let (status, _) = api.get("/api/v1/reaper", &beta).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = api
        .post("/api/v1/agents/coder/credentials/rotate", &beta, None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = api
        .post(
            "/api/v1/tenants",
            &api.admin,
            Some(json!({"tenant_id": "Bad_Id"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, body) = api
        .post(
            "/api/v1/tenants",
            &api.admin,
            Some(json!({"tenant_id": "beta"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

/// A tenant's network policy: its tokens read it, only a platform admin sets it (a
/// tenant cannot widen what the platform gave it), a bad list is a field error that
/// changes nothing, and the runs' and sandboxes' views show it.
#[tokio::test]
async fn a_platform_admin_sets_a_tenants_network_policy() {
    let api = Api::new().await;
    let beta = beta_admin(&api).await;
    let path = "/api/v1/tenants/beta/network-policy";
    let (status, fresh) = api.get(path, &beta).await;
    assert_eq!(status, StatusCode::OK, "{fresh}");
    assert_eq!(
        (&fresh["network"], &fresh["revision"]),
        (&json!(true), &json!(0)),
        "{fresh}"
    );
    let narrowed = json!({"network": {"allow": ["203.0.113.10:8080", "pypi.org:443"]}});
    let (status, body) = api
        .call("PUT", path, Some(&beta), Some(narrowed.clone()))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    for (bad, code) in [
        (
            json!({"network": {"allow": []}}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"network": {"allow": ["a b:1"]}}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (json!({"network": null}), StatusCode::BAD_REQUEST),
        (json!({"network": true, "x": 1}), StatusCode::BAD_REQUEST),
    ] {
        let (status, body) = api
            .call("PUT", path, Some(&api.admin), Some(bad.clone()))
            .await;
        assert_eq!(status, code, "{bad}: {body}");
    }
    let (_, unchanged) = api.get(path, &beta).await;
    assert_eq!(unchanged, fresh, "a refused change changed it");
    let (status, saved) = api
        .call("PUT", path, Some(&api.admin), Some(narrowed.clone()))
        .await;
    assert_eq!(status, StatusCode::OK, "{saved}");
    assert_eq!(saved["network"], narrowed["network"], "{saved}");
    assert_eq!(saved["revision"], 1, "{saved}");
    let (status, unknown) = api
        .call(
            "PUT",
            "/api/v1/tenants/no-such-tenant/network-policy",
            Some(&api.admin),
            Some(json!({"network": false})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{unknown}");
    // The tenant's runs and sandboxes show the layer; the default tenant's do not.
    let run = api.submit(&beta).await;
    let (_, view) = api.get(&format!("/api/v1/runs/{run}"), &beta).await;
    assert_eq!(view["tenant_network"], narrowed["network"], "{view}");
    let (status, sandbox) = api
        .post("/api/v1/sandboxes", &beta, Some(json!({"agent": "coder"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{sandbox}");
    let (_, view) = api
        .get(
            &format!(
                "/api/v1/sandboxes/{}",
                sandbox["sandbox_id"].as_str().expect("id")
            ),
            &beta,
        )
        .await;
    assert_eq!(view["tenant_network"], narrowed["network"], "{view}");
    let own = api.submit(&api.operator).await;
    let (_, view) = api.get(&format!("/api/v1/runs/{own}"), &api.viewer).await;
    assert!(view.get("tenant_network").is_none(), "{view}");
    let (status, off) = api
        .call(
            "PUT",
            path,
            Some(&api.admin),
            Some(json!({"network": false})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{off}");
    assert_eq!(
        (&off["network"], &off["revision"]),
        (&json!(false), &json!(2))
    );
}
