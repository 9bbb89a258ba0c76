//! A strict JSON body extractor: the media type must be JSON, and any decoding error
//! (malformed JSON, unknown field, wrong type such as `"60"` for a number or `1` for a
//! boolean) is a 400 naming the field, before anything is read from the database.

use super::error::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;

pub struct StrictJson<T>(pub T);

impl<S, T> FromRequest<S> for StrictJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(';')
                    .next()
                    .is_some_and(|t| t.trim() == "application/json")
            });
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be JSON (Content-Type: application/json)",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_unreadable",
                e.body_text(),
            )
        })?;
        decode(&bytes).map(StrictJson)
    }
}

/// Decodes a JSON body, naming the offending field on failure.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let deserializer = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        // The path already ends at an unknown field's name; at the top level it is ".".
        let field = if path != "." {
            Some(path)
        } else {
            unknown_field(&message)
        };
        let code = if inner.is_syntax() || inner.is_eof() {
            "malformed_json"
        } else {
            "invalid_body"
        };
        let error = ApiError::bad_request(code, message);
        match field {
            Some(field) => error.with_field(field),
            None => error,
        }
    })
}

fn unknown_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(rest.split('`').next()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        flag: bool,
        inner: Inner,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        seconds: u32,
    }

    fn field_of(json: &str) -> Option<String> {
        decode::<Body>(json.as_bytes()).err().and_then(|e| e.field)
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            field_of(r#"{"flag": 1, "inner": {"seconds": 1}}"#).as_deref(),
            Some("flag")
        );
        assert_eq!(
            field_of(r#"{"flag": "true", "inner": {"seconds": 1}}"#).as_deref(),
            Some("flag")
        );
        assert_eq!(
            field_of(r#"{"flag": true, "inner": {"seconds": "60"}}"#).as_deref(),
            Some("inner.seconds")
        );
        assert_eq!(
            field_of(r#"{"flag": true, "inner": {"seconds": 1, "x": 2}}"#).as_deref(),
            Some("inner.x")
        );
        assert_eq!(
            field_of(r#"{"flag": true, "extra": 0, "inner": {"seconds": 1}}"#).as_deref(),
            Some("extra")
        );
        assert!(decode::<Body>(br#"{"flag": true, "inner": {"seconds": 1}}"#).is_ok());
        let err = decode::<Body>(b"{").err().map(|e| e.code);
        assert_eq!(err, Some("malformed_json"));
    }
}
