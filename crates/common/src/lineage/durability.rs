//! Off-host durability of snapshots: a reaper on another node than a snapshot's writer
//! read it back from its store, or could not.

use sqlx::PgConnection;
use uuid::Uuid;

/// A process on `node` read the snapshot back from its store (its manifest, decoded,
/// and every pack it names, there).
pub async fn verified(conn: &mut PgConnection, id: Uuid, node: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE project_snapshots SET verified_node = $2, verified_at = now() WHERE id = $1",
    )
    .bind(id)
    .bind(node)
    .execute(conn)
    .await?;
    Ok(())
}

/// The snapshot could not be read back (an object missing, a store that did not
/// answer): tried again an hour later, not at every sweep.
pub async fn verify_failed(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE project_snapshots SET verify_failed_at = now() WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}
