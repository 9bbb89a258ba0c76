//! Labels: `key: value` pairs an operator puts on runs and sandboxes to find them again
//! (`team=search`), and the selectors lists and bulk actions filter by.

use std::collections::BTreeMap;

/// Which label is wrong, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

impl Invalid {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A resource's labels, in key order.
pub type Labels = BTreeMap<String, String>;

/// The most labels one resource carries.
pub const MAX_LABELS: usize = 32;
/// The longest key and the longest value.
pub const MAX_KEY: usize = 63;
pub const MAX_VALUE: usize = 63;

fn key_ok(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY
        && key.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-' | b'/')
        })
}

fn value_ok(value: &str) -> bool {
    value.len() <= MAX_VALUE
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Checks labels: at most [`MAX_LABELS`]; keys of 1 to 63 lowercase letters, digits,
/// `.`, `_`, `-`, `/`; values of 0 to 63 letters, digits, `.`, `_`, `-`. `field` names
/// the labels in an error.
pub fn check(labels: &Labels, field: &str) -> Result<(), Invalid> {
    if labels.len() > MAX_LABELS {
        return Err(Invalid::new(field, format!("at most {MAX_LABELS} labels")));
    }
    for (key, value) in labels {
        if !key_ok(key) {
            return Err(Invalid::new(
                format!("{field}.{key}"),
                "a label key is 1 to 63 of a-z 0-9 . _ - /",
            ));
        }
        if !value_ok(value) {
            return Err(Invalid::new(
                format!("{field}.{key}"),
                "a label value is 0 to 63 of A-Z a-z 0-9 . _ -",
            ));
        }
    }
    Ok(())
}

/// Parses a selector, `key=value[,key=value…]`: every pair must match. The error says
/// what is wrong with it.
pub fn selector(text: &str) -> Result<Labels, String> {
    let mut wanted = Labels::new();
    for pair in text.split(',') {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not key=value"))?;
        if wanted.insert(key.to_string(), value.to_string()).is_some() {
            return Err(format!("{key:?} is named twice"));
        }
    }
    check(&wanted, "label").map_err(|e| e.message)?;
    Ok(wanted)
}

#[cfg(test)]
mod tests {
    use super::{check, selector, Labels};

    #[test]
    fn a_selector_is_pairs_that_must_all_match() {
        let wanted = selector("team=search,env=prod").expect("valid");
        assert_eq!(wanted.get("team").map(String::as_str), Some("search"));
        assert_eq!(wanted.len(), 2);
        assert!(selector("team").is_err());
        assert!(selector("team=a,team=b").is_err());
        assert!(selector("Team=a").is_err(), "keys are lowercase");
        assert!(selector("team=a b").is_err());
        assert_eq!(
            selector("empty=")
                .expect("an empty value")
                .get("empty")
                .map(String::as_str),
            Some("")
        );
    }

    #[test]
    fn labels_are_bounded() {
        let many: Labels = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(check(&many, "labels").is_err());
        let long: Labels = [("k".to_string(), "v".repeat(64))].into();
        assert_eq!(
            check(&long, "labels").map_err(|e| e.field),
            Err("labels.k".to_string())
        );
        let nul: Labels = [("k".to_string(), "a\0".to_string())].into();
        assert!(check(&nul, "labels").is_err());
    }
}
