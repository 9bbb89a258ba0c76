//! Source profiles: which implementations a continuation may run on, and the one
//! writer of `source_profiles`.
//!
//! A continuation resumes work another process left: its receipts, its snapshot, its
//! retained report. It is sound only on an implementation whose formats and protocol
//! were qualified for that, so each one has a *profile*: the digest of what a
//! continuation depends on ([`current`]). A checkpoint records the profile it was taken
//! under. A candidate is held with `incompatible_qualification` unless the current
//! profile is registered as qualified, and so is the checkpoint's. The first scheduler of
//! an install registers the profile of the release it runs ([`register_first`]); after an
//! upgrade that changes the profile, an admin qualifies the new one.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};
use utoipa::ToSchema;
use uuid::Uuid;

/// The version of the journal's format: intents, receipts and entries as a continuation
/// reads them. Raised when their meaning changes.
pub const JOURNAL_FORMAT: u32 = 3;

/// The version of the continuation protocol: checkpoint and final-outcome
/// continuations, verification handoffs and the finishing round.
pub const CONTINUATION_PROTOCOL: u32 = 2;

crate::text_enum! {
    /// Where a registered profile stands.
    pub enum ProfileStatus {
        Qualified => "qualified",
        Revoked => "revoked",
    }
}

/// The profile of this build: what a continuation's correctness depends on.
pub fn profile() -> Value {
    json!({
        "cairn": env!("CARGO_PKG_VERSION"),
        "snapshot_manifest": cairn_snapshot::manifest::VERSION,
        "journal": JOURNAL_FORMAT,
        "continuation_protocol": CONTINUATION_PROTOCOL,
    })
}

/// The digest of this build's profile.
pub fn current() -> String {
    crate::digest::of_json(&profile())
}

/// A registered profile, as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema, sqlx::FromRow)]
pub struct Registered {
    pub profile_digest: String,
    #[schema(value_type = Object)]
    pub profile: Value,
    /// `qualified` or `revoked`.
    pub status: String,
    pub note: String,
    /// Grows with every change.
    pub revision: i64,
    pub registered_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Every registered profile, the newest first.
pub async fn list(pool: &PgPool) -> Result<Vec<Registered>, sqlx::Error> {
    sqlx::query_as(
        "SELECT profile_digest, profile, status, note, revision, registered_at, updated_at
           FROM source_profiles ORDER BY registered_at DESC, profile_digest",
    )
    .fetch_all(pool)
    .await
}

/// Whether `digest` is registered as qualified.
pub async fn is_qualified(conn: &mut PgConnection, digest: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM source_profiles WHERE profile_digest = $1 AND status = $2)",
    )
    .bind(digest)
    .bind(ProfileStatus::Qualified)
    .fetch_one(conn)
    .await
}

/// Registers this build's profile as qualified if no profile is registered at all (the
/// first start of an install); whether it did. Concurrent first starts register it once.
pub async fn register_first(pool: &PgPool) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO source_profiles (profile_digest, profile, status, note)
         SELECT $1, $2, $3, 'registered by the first scheduler of this install, for the release it runs'
          WHERE NOT EXISTS (SELECT 1 FROM source_profiles)
         ON CONFLICT (profile_digest) DO NOTHING",
    )
    .bind(current())
    .bind(profile())
    .bind(ProfileStatus::Qualified)
    .execute(pool)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// How a change of a profile's qualification went.
#[derive(Debug)]
pub enum Change {
    Saved(Registered),
    /// Neither registered nor this build's: nothing knows what it describes.
    Unknown,
}

/// Qualifies or revokes `digest`. Only a registered profile or this build's own can be
/// changed; this build's is registered on its first change.
pub async fn set(
    pool: &PgPool,
    digest: &str,
    status: ProfileStatus,
    note: &str,
    by: Uuid,
) -> Result<Change, sqlx::Error> {
    let profile = (digest == current()).then(profile);
    let saved: Option<Registered> = sqlx::query_as(
        "WITH updated AS (
              UPDATE source_profiles SET status = $2, note = $3, updated_by = $4,
                     revision = revision + 1, updated_at = now()
               WHERE profile_digest = $1
           RETURNING profile_digest, profile, status, note, revision, registered_at, updated_at),
              inserted AS (
              INSERT INTO source_profiles (profile_digest, profile, status, note, updated_by)
              SELECT $1, $5, $2, $3, $4 WHERE $5::jsonb IS NOT NULL AND NOT EXISTS (SELECT 1 FROM updated)
              ON CONFLICT (profile_digest) DO NOTHING
           RETURNING profile_digest, profile, status, note, revision, registered_at, updated_at)
         SELECT * FROM updated UNION ALL SELECT * FROM inserted",
    )
    .bind(digest)
    .bind(status)
    .bind(note)
    .bind(by)
    .bind(profile)
    .fetch_optional(pool)
    .await?;
    Ok(saved.map_or(Change::Unknown, Change::Saved))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_names_what_a_continuation_depends_on_and_its_digest_is_stable() {
        let profile = profile();
        for part in [
            "cairn",
            "snapshot_manifest",
            "journal",
            "continuation_protocol",
        ] {
            assert!(profile.get(part).is_some(), "{part} in {profile}");
        }
        assert_eq!(current(), current());
        assert!(crate::digest::is_digest(&current()));
    }
}
