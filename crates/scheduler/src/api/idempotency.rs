//! The `Idempotency-Key` header every lifecycle POST that honours it reads.

use super::error::ApiError;
use axum::http::HeaderMap;

/// The header's key, if sent; a malformed one is a 400.
pub fn key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    // As the document says: 1 to 255 visible ASCII characters, inner spaces allowed.
    let key = value
        .to_str()
        .ok()
        .filter(|k| {
            (1..=255).contains(&k.len())
                && k.bytes().all(|b| (b' '..=b'~').contains(&b))
                && !k.starts_with(' ')
                && !k.ends_with(' ')
        })
        .ok_or_else(|| {
            ApiError::bad_request(
                "invalid_idempotency_key",
                "Idempotency-Key must be 1 to 255 visible characters",
            )
            .with_field("Idempotency-Key")
        })?;
    Ok(Some(key.to_string()))
}
