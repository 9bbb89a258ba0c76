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

/// Decodes a JSON body, naming the offending field on failure. The body is exactly one
/// JSON object (anything after it is malformed), and no string in it holds a NUL: no
/// field Cairn stores can, so one is refused by name instead of by the database.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // Every body is an object: serde would also build a struct from an array of its
    // fields in order, which no client means.
    if bytes.trim_ascii_start().first() == Some(&b'[') {
        return Err(ApiError::bad_request(
            "invalid_body",
            "the body must be a JSON object",
        ));
    }
    let deserializer = &mut serde_json::Deserializer::from_slice(bytes);
    let value: T = match typed(deserializer) {
        Ok(value) => {
            deserializer.end().map_err(|e| {
                ApiError::bad_request(
                    "malformed_json",
                    format!("content after the JSON value: {e}"),
                )
            })?;
            value
        }
        // JSON does not tell `60.0` from `60`: an integral number is an integer wherever
        // one is expected (a fraction is still refused). `integral` reads the whole body.
        Err(e) if e.message.starts_with("invalid type: floating point") => {
            integral(bytes).ok_or(e)?
        }
        Err(e) => return Err(e),
    };
    // A NUL can only arrive escaped (`\u0000`); look for the field only then.
    if bytes.windows(6).any(|w| w.eq_ignore_ascii_case(b"\\u0000")) {
        if let Ok(tree) = serde_json::from_slice::<serde_json::Value>(bytes) {
            if let Some(field) = nul_at(&tree, "") {
                let message = "a string holds a NUL character (\\u0000)";
                return Err(ApiError::bad_request("invalid_body", message).with_field(field));
            }
        }
    }
    Ok(value)
}

/// The path (`a.b[2]`, or `.` for the top level) of the first string or key holding a NUL.
fn nul_at(value: &serde_json::Value, path: &str) -> Option<String> {
    let here = || {
        if path.is_empty() {
            ".".to_string()
        } else {
            path.to_string()
        }
    };
    match value {
        serde_json::Value::String(s) => s.contains('\0').then(here),
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| nul_at(item, &format!("{path}[{i}]"))),
        serde_json::Value::Object(map) => map.iter().find_map(|(key, item)| {
            let inner = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            if key.contains('\0') {
                return Some(inner);
            }
            nul_at(item, &inner)
        }),
        _ => None,
    }
}

/// `bytes` decoded with every integral number written as a float (`60.0`) read as the
/// integer it is; `None` if that does not decode either.
fn integral<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    fn normalize(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Number(n) => {
                if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15) {
                    // Exact: integral and within f64's exact integer range.
                    #[allow(clippy::cast_possible_truncation)]
                    let i = f as i64;
                    *value = serde_json::Value::from(i);
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(normalize),
            serde_json::Value::Object(map) => map.values_mut().for_each(normalize),
            _ => {}
        }
    }
    let mut value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    normalize(&mut value);
    serde_json::from_value(value).ok()
}

fn typed<'de, T: DeserializeOwned>(
    deserializer: &mut serde_json::Deserializer<serde_json::de::SliceRead<'de>>,
) -> Result<T, ApiError> {
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

    #[test]
    fn a_body_is_one_json_value() {
        let body = r#"{"flag": true, "inner": {"seconds": 1}}"#;
        for trailing in [
            " this is not json",
            r#"{"flag": false, "inner": {"seconds": 2}}"#,
            "]",
        ] {
            let err = decode::<Body>(format!("{body}{trailing}").as_bytes()).err();
            assert_eq!(err.map(|e| e.code), Some("malformed_json"), "{trailing}");
        }
        assert!(decode::<Body>(format!("{body} \n").as_bytes()).is_ok());
    }

    #[test]
    fn an_integral_float_is_an_integer_and_a_fraction_is_not() {
        let ok = decode::<Body>(br#"{"flag": true, "inner": {"seconds": 60.0}}"#);
        assert!(ok.is_ok_and(|b| b.inner.seconds == 60));
        let field = field_of(r#"{"flag": true, "inner": {"seconds": 60.5}}"#);
        assert_eq!(field.as_deref(), Some("inner.seconds"));
    }

    #[test]
    fn a_nul_in_any_string_is_refused_by_field() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Named {
            name: String,
            tags: Vec<String>,
            env: std::collections::BTreeMap<String, String>,
        }
        let field = |json: &str| decode::<Named>(json.as_bytes()).err().and_then(|e| e.field);
        let ok = r#"{"name": "a", "tags": ["x"], "env": {"K": "v"}}"#;
        assert!(decode::<Named>(ok.as_bytes()).is_ok());
        let nul = r#"{"name": "a\u0000b", "tags": [], "env": {}}"#;
        assert_eq!(field(nul).as_deref(), Some("name"));
        let nul = r#"{"name": "a", "tags": ["x", "\u0000"], "env": {}}"#;
        assert_eq!(field(nul).as_deref(), Some("tags[1]"));
        let nul = r#"{"name": "a", "tags": [], "env": {"K": "v\u0000"}}"#;
        assert_eq!(field(nul).as_deref(), Some("env.K"));
        let nul = r#"{"name": "a", "tags": [], "env": {"K\u0000": "v"}}"#;
        assert!(field(nul).is_some_and(|f| f.starts_with("env.K")));
    }
}
