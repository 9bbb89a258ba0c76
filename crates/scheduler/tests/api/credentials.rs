//! Credential rotation.

use axum::http::StatusCode;
use uuid::Uuid;

use super::harness::*;

#[tokio::test]
async fn rotating_an_agents_credentials_retires_its_snapshots() {
    let api = Api::new().await;
    for (agent, kind) in [
        ("coder", "checkpoint"),
        ("coder", "baseline"),
        ("other", "checkpoint"),
    ] {
        sqlx::query(
            "INSERT INTO project_snapshots (id, kind, status, agent, backend, store_url) VALUES ($1, $2, 'ready', $3, 'local', 'file:///x')",
        )
        .bind(Uuid::new_v4())
        .bind(kind)
        .bind(agent)
        .execute(api.pool())
        .await
        .expect("snapshot");
    }
    let rotate = "/api/v1/agents/coder/credentials/rotate";
    let (status, _) = api.post(rotate, &api.operator, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, rotation) = api.post(rotate, &api.admin, None).await;
    assert_eq!(status, StatusCode::OK, "{rotation}");
    assert_eq!(
        (
            rotation["generation"].as_i64(),
            rotation["snapshots_retired"].as_i64()
        ),
        (Some(1), Some(2))
    );
    let current: i64 =
        sqlx::query_scalar("SELECT count(*) FROM project_snapshots WHERE retention = 'current'")
            .fetch_one(api.pool())
            .await
            .expect("count");
    assert_eq!(current, 1, "another agent's snapshots are untouched");
    let (status, error) = api
        .post(
            "/api/v1/agents/bad%20name/credentials/rotate",
            &api.admin,
            None,
        )
        .await;
    assert_eq!(
        (status, error_field(&error)),
        (StatusCode::UNPROCESSABLE_ENTITY, "agent")
    );
}
