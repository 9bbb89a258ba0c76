//! Path parameters: an id parsed, or a `400` naming the parameter.

use super::error::ApiError;
use cairn_common::ids::Id;
use uuid::Uuid;

/// Parses a path id, or a 400 naming it.
pub fn path_id(text: &str, field: &str) -> Result<Uuid, ApiError> {
    text.parse::<Id>()
        .map(Id::uuid)
        .map_err(|_| ApiError::invalid_id(field))
}
