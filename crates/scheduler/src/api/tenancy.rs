//! The tenancy guard: before any handler runs, each id in the path must name something
//! of the caller's tenant. Another tenant's id answers exactly as an unknown one does
//! (`404`, the same body), so no route tells one from the other, and a route added later
//! is guarded by naming its ids as every route does.

use super::auth::{authenticate, Caller};
use super::error::ApiError;
use super::AppState;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::RequestPartsExt;
use cairn_common::ids::Id;
use sqlx::PgPool;
use uuid::Uuid;

/// A path parameter that names something owned by a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owned {
    Run,
    Sandbox,
    Snapshot,
    Template,
    Token,
    Volume,
}

impl Owned {
    fn of(parameter: &str) -> Option<Owned> {
        match parameter {
            "run_id" => Some(Owned::Run),
            "sandbox_id" => Some(Owned::Sandbox),
            "snapshot_id" => Some(Owned::Snapshot),
            "template_id" => Some(Owned::Template),
            "token_id" => Some(Owned::Token),
            "volume_id" => Some(Owned::Volume),
            _ => None,
        }
    }

    /// The word the route's own `404` uses, so that both bodies are the same.
    fn noun(self) -> &'static str {
        match self {
            Owned::Run => "run",
            Owned::Sandbox => "sandbox",
            Owned::Snapshot => "snapshot",
            Owned::Template => "template",
            Owned::Token => "token",
            Owned::Volume => "volume",
        }
    }

    /// The tenant of the row, if there is one. A snapshot is its sandbox's; a token with
    /// no tenant (a platform token) is no tenant's.
    async fn tenant(self, pool: &PgPool, id: Uuid) -> Result<Option<String>, sqlx::Error> {
        let sql = match self {
            Owned::Run => "SELECT tenant_id FROM runs WHERE id = $1",
            Owned::Sandbox => "SELECT tenant_id FROM sandboxes WHERE id = $1",
            Owned::Snapshot => {
                "SELECT s.tenant_id FROM project_snapshots p JOIN sandboxes s ON s.id = p.sandbox_id
                  WHERE p.id = $1"
            }
            Owned::Template => "SELECT tenant_id FROM sandbox_templates WHERE id = $1",
            Owned::Token => "SELECT tenant_id FROM api_tokens WHERE id = $1",
            Owned::Volume => "SELECT tenant_id FROM volumes WHERE id = $1",
        };
        let row: Option<Option<String>> = sqlx::query_scalar(sql)
            .bind(id)
            .fetch_optional(pool)
            .await?;
        Ok(row.flatten())
    }
}

/// Authenticates the caller (once: the handler reads it back) and refuses, as unknown,
/// every id in the path that belongs to another tenant. A platform token reaches all.
/// An id that does not parse is left to the handler, which answers `400` naming it.
pub async fn guard(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let (mut parts, body) = request.into_parts();
    let caller = authenticate(&parts, &state.pool).await?;
    if let Some(own) = caller.tenant.as_deref() {
        let params = parts
            .extract::<axum::extract::RawPathParams>()
            .await
            .map_err(|_| ApiError::not_found("route"))?;
        for (name, value) in params.iter() {
            // A tenant is named by its id: only the caller's own is known to it.
            if name == "tenant_id" && value != own {
                return Err(ApiError::not_found("tenant"));
            }
            let Some(owned) = Owned::of(name) else {
                continue;
            };
            let Ok(id) = value.parse::<Id>() else {
                continue;
            };
            let tenant = owned.tenant(&state.pool, id.uuid()).await?;
            if tenant.as_deref() != Some(own) {
                return Err(ApiError::not_found(owned.noun()));
            }
        }
    }
    parts.extensions.insert::<Caller>(caller);
    Ok(next.run(Request::from_parts(parts, body)).await)
}
