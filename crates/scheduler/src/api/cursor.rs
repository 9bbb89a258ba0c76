//! The keyset cursor of a listing, newest first: the last item's creation time (in
//! microseconds) and id, `MICROS_ID`. A page continues strictly after it, so an item
//! created meanwhile never shifts or repeats a page.

use super::error::ApiError;
use cairn_common::ids::Id;
use chrono::{DateTime, Datelike, Utc};
use uuid::Uuid;

/// The cursor of an item created at `at` with id `id`.
pub fn of(at: DateTime<Utc>, id: impl std::fmt::Display) -> String {
    format!("{}_{id}", at.timestamp_micros())
}

/// The position a cursor this API returned stands for, or `None`.
pub fn parse(cursor: &str) -> Option<(DateTime<Utc>, Uuid)> {
    let (micros, id) = cursor.split_once('_')?;
    let at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
    // PostgreSQL's range is narrower than chrono's: a cursor this API returned is a
    // creation time, so anything outside years 1–9999 is not one.
    if !(1..=9999).contains(&at.year()) {
        return None;
    }
    let id: Id = id.parse().ok()?;
    Some((at, id.uuid()))
}

/// A list's `cursor` parameter: absent, or the position it stands for; one this API did
/// not return is a 400 naming it.
pub fn from_query(cursor: Option<&str>) -> Result<Option<(DateTime<Utc>, Uuid)>, ApiError> {
    cursor
        .map(|c| {
            parse(c).ok_or_else(|| {
                ApiError::bad_request("invalid_query", "cursor is not one this API returned")
                    .with_field("cursor")
            })
        })
        .transpose()
}
