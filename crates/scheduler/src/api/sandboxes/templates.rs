//! Templates: a ready named snapshot published under a name, as immutable versions
//! (1, 2, …) that new sandboxes start from (`template_id` on create).

use super::create::restorable;
use crate::api::auth::{Caller, Role};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::json::StrictJson;
use crate::api::path_id;
use crate::api::query::StrictQuery;
use crate::api::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use cairn_common::ids::Id;
use cairn_common::sandbox::template;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// `POST /api/v1/templates`: publish a named snapshot as the next version of `name`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"name": "python-base", "source": "snapshot:0f1e2d3c4b5a69788796a5b4c3d2e1f0", "description": "Python 3.12 and the team's tools"})))]
pub struct TemplateSpec {
    /// 1 to 63 of `A-Za-z0-9._-`.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,63}$")]
    pub name: String,
    /// `snapshot:<id>`: a ready named snapshot of the caller's tenant.
    #[schema(pattern = "^snapshot:[0-9a-f]{32}$")]
    pub source: String,
    /// At most 500 characters.
    #[serde(default)]
    #[schema(max_length = 500)]
    pub description: Option<String>,
}

/// One version of a template.
#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateView {
    /// The version's id: what `template_id` names.
    #[schema(value_type = String)]
    pub template_id: Id,
    pub name: String,
    /// 1 for the first version of a name, then one more for each.
    pub version: i32,
    /// `snapshot:<id>`, the snapshot new sandboxes start from.
    pub source: String,
    /// The snapshot's status: a version whose snapshot is no longer `ready` (`deleted`
    /// once retired, as when its agent's credentials rotated) starts nothing.
    pub snapshot_status: String,
    pub description: Option<String>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateList {
    pub templates: Vec<TemplateView>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TemplateQuery {
    /// Only this name's versions.
    #[param(pattern = "^[A-Za-z0-9._-]{1,63}$")]
    pub name: Option<String>,
}

type Row = (
    Uuid,
    String,
    i32,
    Uuid,
    String,
    Option<String>,
    DateTime<Utc>,
);

// A retired snapshot (deleted, or its agent's credentials rotated) is `deleted` here
// whatever its bytes' status, as in the snapshots' own view.
const SELECT: &str = "SELECT t.id, t.name, t.version, t.snapshot_id,
        CASE WHEN p.retention = 'current' THEN p.status ELSE 'deleted' END, t.description, t.created_at
   FROM sandbox_templates t JOIN project_snapshots p ON p.id = t.snapshot_id";

fn view((id, name, version, snapshot, status, description, created_at): Row) -> TemplateView {
    TemplateView {
        template_id: id.into(),
        name,
        version,
        source: format!("snapshot:{}", snapshot.simple()),
        snapshot_status: status,
        description,
        created_at,
    }
}

async fn load(conn: &mut PgConnection, id: Uuid) -> Result<TemplateView, ApiError> {
    let row: Option<Row> = sqlx::query_as(&format!("{SELECT} WHERE t.id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await?;
    row.map(view).ok_or_else(|| ApiError::not_found("template"))
}

/// Publish a ready named snapshot as the next version of a template. A version never
/// changes, and its snapshot cannot be deleted while it names it.
#[utoipa::path(post, operation_id = "create_template", tag = "sandboxes", path = "/api/v1/templates",
    request_body = TemplateSpec,
    responses((status = 201, description = "The new version", body = TemplateView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No such snapshot in the caller's tenant", body = ErrorBody),
        (status = 409, description = "The snapshot is not ready, or not a named snapshot", body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    StrictJson(spec): StrictJson<TemplateSpec>,
) -> Result<(StatusCode, Json<TemplateView>), ApiError> {
    caller.require(Role::Operator)?;
    if !template::valid_name(&spec.name) {
        let message = "a name is 1 to 63 letters, digits, '.', '_' or '-'";
        return Err(ApiError::unprocessable("name", message));
    }
    if spec
        .description
        .as_ref()
        .is_some_and(|d| d.chars().count() > 500)
    {
        return Err(ApiError::unprocessable(
            "description",
            "at most 500 characters",
        ));
    }
    let snapshot = spec
        .source
        .strip_prefix("snapshot:")
        .and_then(|id| id.parse::<Id>().ok())
        .ok_or_else(|| ApiError::unprocessable("source", "`snapshot:` and a 32-hex snapshot id"))?
        .uuid();
    let tenant = caller.home();
    let mut tx = state.pool.begin().await?;
    // Shared with other publications, exclusive of a delete (which takes it for update):
    // a version never names a snapshot deleted meanwhile.
    sqlx::query("SELECT 1 FROM project_snapshots WHERE id = $1 FOR SHARE")
        .bind(snapshot)
        .execute(&mut *tx)
        .await?;
    restorable(&mut tx, snapshot, tenant).await?;
    let kind: Option<String> =
        sqlx::query_scalar("SELECT kind FROM project_snapshots WHERE id = $1")
            .bind(snapshot)
            .fetch_optional(&mut *tx)
            .await?;
    if kind.as_deref() != Some("named") {
        return Err(ApiError::conflict(
            "not_a_named_snapshot",
            "a template publishes a named snapshot (POST /api/v1/sandboxes/{id}/snapshots), kept until deleted",
        )
        .with_field("source"));
    }
    let (id, _) = template::publish(
        &mut tx,
        tenant,
        &spec.name,
        snapshot,
        spec.description.as_deref(),
    )
    .await?;
    let made = load(&mut tx, id).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(made)))
}

/// List templates' versions, by name, each name's newest version first (of one name
/// with `name`); at most 500.
#[utoipa::path(get, operation_id = "list_templates", tag = "sandboxes", path = "/api/v1/templates",
    params(TemplateQuery),
    responses((status = 200, body = TemplateList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    StrictQuery(query): StrictQuery<TemplateQuery>,
) -> Result<Json<TemplateList>, ApiError> {
    caller.require(Role::Viewer)?;
    if query
        .name
        .as_deref()
        .is_some_and(|n| !template::valid_name(n))
    {
        let message = "name is 1 to 63 letters, digits, '.', '_' or '-'";
        return Err(ApiError::bad_request("invalid_query", message).with_field("name"));
    }
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "{SELECT} WHERE ($1::text IS NULL OR t.name = $1) AND ($2::text IS NULL OR t.tenant_id = $2)
          ORDER BY t.name, t.version DESC LIMIT 500"
    ))
    .bind(&query.name)
    .bind(caller.scope())
    .fetch_all(&state.pool)
    .await?;
    Ok(Json(TemplateList {
        templates: rows.into_iter().map(view).collect(),
    }))
}

/// Read one template version.
#[utoipa::path(get, operation_id = "get_template", tag = "sandboxes", path = "/api/v1/templates/{template_id}",
    params(("template_id" = String, Path, description = "32 hex characters")),
    responses((status = 200, body = TemplateView), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(template_id): Path<String>,
) -> Result<Json<TemplateView>, ApiError> {
    caller.require(Role::Viewer)?;
    let id = path_id(&template_id, "template_id")?;
    let mut conn = state.pool.acquire().await?;
    Ok(Json(load(&mut conn, id).await?))
}
