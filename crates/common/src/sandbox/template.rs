//! Templates: the one writer of `sandbox_templates`. A template version names a ready
//! named snapshot of its tenant; versions of a name count up from 1 and never change.

use sqlx::PgConnection;
use uuid::Uuid;

/// A template's name: 1 to 63 of `A-Za-z0-9._-`.
pub fn valid_name(name: &str) -> bool {
    crate::run::valid_name(name, 63)
}

/// Records the next version of `name` in `tenant`, on `snapshot_id`, in the caller's
/// transaction; versions of one name are numbered one after another (concurrent
/// publications of the same name wait for each other). Returns its id and version.
pub async fn publish(
    conn: &mut PgConnection,
    tenant: &str,
    name: &str,
    snapshot_id: Uuid,
    description: Option<&str>,
) -> Result<(Uuid, i32), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('sandbox_template:' || $1 || '/' || $2))")
        .bind(tenant)
        .bind(name)
        .execute(&mut *conn)
        .await?;
    let id = Uuid::new_v4();
    let version: i32 = sqlx::query_scalar(
        "INSERT INTO sandbox_templates (id, tenant_id, name, version, snapshot_id, description)
         SELECT $1, $2, $3, COALESCE(max(version), 0) + 1, $4, $5
           FROM sandbox_templates WHERE tenant_id = $2 AND name = $3
         RETURNING version",
    )
    .bind(id)
    .bind(tenant)
    .bind(name)
    .bind(snapshot_id)
    .bind(description)
    .fetch_one(conn)
    .await?;
    Ok((id, version))
}

/// The snapshot a template version names, and the tenant it belongs to.
pub async fn source(
    conn: &mut PgConnection,
    id: Uuid,
) -> Result<Option<(Uuid, String)>, sqlx::Error> {
    sqlx::query_as("SELECT snapshot_id, tenant_id FROM sandbox_templates WHERE id = $1")
        .bind(id)
        .fetch_optional(conn)
        .await
}

/// Whether a template version names the snapshot (then it cannot be deleted).
pub async fn names_snapshot(
    conn: &mut PgConnection,
    snapshot_id: Uuid,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sandbox_templates WHERE snapshot_id = $1)")
        .bind(snapshot_id)
        .fetch_one(conn)
        .await
}
