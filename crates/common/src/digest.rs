//! Digests: SHA-256 in lowercase hex (64 characters) over canonical JSON, so the same
//! facts always give the same digest (object keys are sorted by `serde_json::Value`).

use sha2::{Digest, Sha256};

/// SHA-256 of bytes, as 64 lowercase hex characters.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// SHA-256 of a value's canonical JSON.
pub fn of_json(value: &serde_json::Value) -> String {
    // Value's maps are ordered by key, so serialization is canonical.
    sha256_hex(value.to_string().as_bytes())
}

/// SHA-256 of any serializable value's canonical JSON.
pub fn of<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(v) => of_json(&v),
        Err(_) => sha256_hex(b""),
    }
}

/// Whether a string is a 64-lowercase-hex digest.
pub fn is_digest(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_change_a_digest() {
        let a = json!({"b": 1, "a": [1, 2]});
        let b: serde_json::Value = serde_json::from_str(r#"{"a":[1,2],"b":1}"#).expect("json");
        assert_eq!(of_json(&a), of_json(&b));
        assert!(is_digest(&of_json(&a)));
        assert_ne!(of_json(&a), of_json(&json!({"a": [2, 1], "b": 1})));
    }
}
