//! Agents' credential generations: a capture holds its agent's generation, and a
//! rotation retires every snapshot taken under an older one.

use sqlx::PgConnection;

/// Locks the agent's generation row for the caller's transaction (creating it at 0)
/// and returns the generation: captures hold it shared, rotation takes it exclusively.
pub async fn lock_generation(conn: &mut PgConnection, agent: &str) -> Result<i64, sqlx::Error> {
    // One round trip: the row this statement makes (held by this transaction until it
    // ends), or the existing one, locked shared. A row another transaction made after
    // this statement's snapshot is seen by neither part; the plain read then takes it.
    let locked: Option<i64> = sqlx::query_scalar(
        "WITH made AS (INSERT INTO credential_generations (agent) VALUES ($1)
                         ON CONFLICT DO NOTHING RETURNING generation),
              held AS (SELECT generation FROM credential_generations WHERE agent = $1 FOR SHARE)
         SELECT generation FROM made UNION ALL SELECT generation FROM held",
    )
    .bind(agent)
    .fetch_optional(&mut *conn)
    .await?;
    match locked {
        Some(generation) => Ok(generation),
        None => {
            sqlx::query_scalar(
                "SELECT generation FROM credential_generations WHERE agent = $1 FOR SHARE",
            )
            .bind(agent)
            .fetch_one(conn)
            .await
        }
    }
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
