//! Agents' credential generations: a capture holds its agent's generation, and a
//! rotation retires every snapshot taken under an older one.

use sqlx::PgConnection;

/// A capture's two locks, in one round trip, for the caller's transaction:
/// - the agent's generation row (made at 0 the first time), locked shared and returned:
///   captures hold it shared, rotation takes it exclusively;
/// - then the store's capture lock, tried shared: the reaper takes it exclusively while
///   it deletes a batch of packs, so a chunk a capture found already stored cannot
///   vanish under it. This lock is never waited for: the caller holds its request row,
///   and waiting would block its lease renewals behind the reaper. (The generation row
///   may be waited for, behind a rotation.)
///
/// `None` while the reaper holds the store: the caller ends its transaction (which lets
/// the generation go) and tries again shortly.
pub async fn lock_for_capture(
    conn: &mut PgConnection,
    agent: &str,
    store_id: uuid::Uuid,
) -> Result<Option<i64>, sqlx::Error> {
    // `made` runs whether or not it is read; `held` only when `made` made nothing. A
    // row another transaction made after this statement's snapshot is seen by neither
    // part: the plain read then takes it.
    // The columns are evaluated in order: the generation first, so a capture waiting
    // behind a rotation does not hold the store's lock meanwhile.
    let (locked, free): (Option<i64>, bool) = sqlx::query_as(
        "WITH store AS (SELECT pg_try_advisory_xact_lock_shared(hashtext($2)) AS free),
              made AS (INSERT INTO credential_generations (agent) VALUES ($1)
                         ON CONFLICT DO NOTHING RETURNING generation),
              held AS (SELECT generation FROM credential_generations WHERE agent = $1 FOR SHARE)
         SELECT (SELECT generation FROM made UNION ALL SELECT generation FROM held LIMIT 1),
                (SELECT free FROM store)",
    )
    .bind(agent)
    .bind(super::store_key(store_id))
    .fetch_one(&mut *conn)
    .await?;
    if !free {
        return Ok(None);
    }
    match locked {
        Some(generation) => Ok(Some(generation)),
        None => held_generation(conn, agent).await.map(Some),
    }
}

/// The generation row another transaction made after the caller's statement began,
/// locked shared.
async fn held_generation(conn: &mut PgConnection, agent: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT generation FROM credential_generations WHERE agent = $1 FOR SHARE")
        .bind(agent)
        .fetch_one(conn)
        .await
}

/// Rotates an agent's credentials: every snapshot taken under an older generation is
/// retired from reuse. The row lock serializes this with captures of the agent.
pub async fn rotate_credentials(conn: &mut PgConnection, agent: &str) -> Result<i64, sqlx::Error> {
    let generation: i64 = sqlx::query_scalar(
        "INSERT INTO credential_generations (agent, generation, rotated_at) VALUES ($1, 1, now())
         ON CONFLICT (agent) DO UPDATE SET generation = credential_generations.generation + 1, rotated_at = now()
         RETURNING generation",
    )
    .bind(agent)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE project_snapshots SET retention = 'retired', retired_at = now(), retire_reason = 'credentials_rotated'
          WHERE agent = $1 AND credential_generation < $2 AND retention = 'current'",
    )
    .bind(agent)
    .bind(generation)
    .execute(&mut *conn)
    .await?;
    Ok(generation)
}
