//! Tenants (projects), and the one writer of their table. Everything a tenant owns hangs
//! off its runs and sandboxes; each token belongs to one tenant or to none (a platform
//! token).

use sqlx::PgConnection;
use uuid::Uuid;

/// Creates tenant `id`, made by the token `by`; `false` if it exists already. The caller
/// has checked the id ([`crate::ids::valid_tenant_id`]).
pub async fn create(conn: &mut PgConnection, id: &str, by: Uuid) -> Result<bool, sqlx::Error> {
    let made = sqlx::query(
        "INSERT INTO tenants (id, created_by) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
    )
    .bind(id)
    .bind(by)
    .execute(conn)
    .await?;
    Ok(made.rows_affected() == 1)
}
