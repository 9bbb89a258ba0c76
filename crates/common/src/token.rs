//! API tokens, and the one writer of their table. Only a SHA-256 of each secret is
//! stored; the scheduler authenticates callers against it.

use crate::digest::sha256_hex;
use sqlx::PgPool;
use uuid::Uuid;

/// The stored form of a secret: its SHA-256.
pub fn hash(token: &str) -> Vec<u8> {
    hex::decode(sha256_hex(token.as_bytes())).unwrap_or_default()
}

/// Stores a token (its hash) with a role, in `tenant` (`None`: a platform token);
/// returns its id.
pub async fn insert(
    pool: &PgPool,
    name: &str,
    role: &str,
    tenant: Option<&str>,
    token: &str,
) -> Result<Uuid, sqlx::Error> {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO api_tokens (id, name, role, tenant_id, token_hash) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(name)
    .bind(role)
    .bind(tenant)
    .bind(hash(token))
    .execute(pool)
    .await?;
    Ok(id)
}

/// Makes the bootstrap admin token usable (a platform admin); a no-op when it already
/// exists.
pub async fn bootstrap_admin(pool: &PgPool, token: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO api_tokens (id, name, role, token_hash) VALUES ($1, 'bootstrap-admin', 'admin', $2)
         ON CONFLICT (token_hash) DO NOTHING",
    )
    .bind(Uuid::new_v4())
    .bind(hash(token))
    .execute(pool)
    .await?;
    Ok(())
}

/// Revokes a token (again is a no-op); `false` for an unknown id.
pub async fn revoke(pool: &PgPool, id: Uuid) -> Result<bool, sqlx::Error> {
    let updated =
        sqlx::query("UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, now()) WHERE id = $1")
            .bind(id)
            .execute(pool)
            .await?;
    Ok(updated.rows_affected() == 1)
}
