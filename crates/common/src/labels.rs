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

/// Why a selector was refused: it is malformed, or well formed but asks one key for two
/// values, which no labels can match.
#[derive(Debug, PartialEq, Eq)]
pub enum SelectorError {
    Malformed(String),
    Contradictory(String),
}

impl std::fmt::Display for SelectorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SelectorError::Malformed(why) | SelectorError::Contradictory(why) => f.write_str(why),
        }
    }
}

/// Parses a selector, `key=value[,key=value…]`: every pair must match, so a pair given
/// twice is asked once. The error says what is wrong with it.
pub fn selector(text: &str) -> Result<Labels, SelectorError> {
    let mut wanted = Labels::new();
    for pair in text.split(',') {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| SelectorError::Malformed(format!("{pair:?} is not key=value")))?;
        match wanted.insert(key.to_string(), value.to_string()) {
            Some(earlier) if earlier != value => {
                return Err(SelectorError::Contradictory(format!(
                    "{key:?} is asked to be both {earlier:?} and {value:?}: no run can match"
                )))
            }
            _ => {}
        }
    }
    check(&wanted, "label").map_err(|e| SelectorError::Malformed(e.message))?;
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
        assert!(matches!(
            selector("team=a,team=b"),
            Err(super::SelectorError::Contradictory(_))
        ));
        assert_eq!(
            selector("team=a,team=a")
                .expect("one pair, asked twice")
                .len(),
            1
        );
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
