//! What a step asks of the network: none, the worker's egress policy, or that policy
//! narrowed to named destinations. A lower layer only narrows: a destination the
//! operator's policy refuses stays refused whatever a step names.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// At most this many destinations in one step's list.
pub const MAX_ALLOW: usize = 64;

/// A step's `network`: `false` (its own loopback only), `true` (the worker's egress
/// policy) or `{"allow": [...]}` (that policy, narrowed to these destinations).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum NetworkSpec {
    On(bool),
    Allow(AllowList),
}

/// Destinations a step reaches, within what the worker's policy allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AllowList {
    /// 1 to 64 entries: `HOST:PORT`, `IP[/PREFIX][:PORT]` or `[IPV6[/PREFIX]]:PORT`
    /// (a host name is resolved when the step starts).
    #[schema(min_items = 1, max_items = 64)]
    pub allow: Vec<String>,
}

impl NetworkSpec {
    /// Whether the step has a NAT at all.
    pub fn enabled(&self) -> bool {
        !matches!(self, NetworkSpec::On(false))
    }

    /// The destinations it is narrowed to, if it is.
    pub fn narrowed_to(&self) -> Option<&[String]> {
        match self {
            NetworkSpec::Allow(list) => Some(&list.allow),
            NetworkSpec::On(_) => None,
        }
    }

    /// Why the list is not one a worker can apply, if it is not.
    pub fn problem(&self) -> Option<String> {
        let list = self.narrowed_to()?;
        if list.is_empty() || list.len() > MAX_ALLOW {
            return Some(format!(
                "allow lists 1 to {MAX_ALLOW} destinations (false: no network)"
            ));
        }
        list.iter()
            .find_map(|entry| {
                let (host, _) = split_port(entry)?;
                let ok = !host.is_empty()
                    && host.len() <= 253
                    && host.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'/')
                    });
                (!ok).then(|| {
                    format!("{entry:?} is not HOST:PORT, IP[/PREFIX][:PORT] or [IPV6]:PORT")
                })
            })
            .or_else(|| {
                list.iter()
                    .find(|entry| split_port(entry).is_none())
                    .map(|entry| format!("{entry:?} has a bad port"))
            })
    }
}

/// `(host, port)` of `HOST`, `HOST:PORT` or `[V6]:PORT`; `None` for a bad port.
pub fn split_port(text: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(port) => Some((host, Some(port.parse().ok()?))),
            None if after.is_empty() => Some((host, None)),
            None => None,
        };
    }
    if text.matches(':').count() > 1 {
        return Some((text, None));
    }
    match text.rsplit_once(':') {
        Some((host, port)) => Some((host, Some(port.parse().ok()?))),
        None => Some((text, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(value: serde_json::Value) -> NetworkSpec {
        serde_json::from_value(value).expect("spec")
    }

    #[test]
    fn a_step_network_is_a_flag_or_a_narrowing_list() {
        assert!(!spec(json!(false)).enabled());
        assert!(spec(json!(true)).enabled());
        let narrowed = spec(json!({"allow": ["pypi.org:443", "10.2.0.0/16:5432"]}));
        assert!(narrowed.enabled());
        assert_eq!(narrowed.narrowed_to().map(<[String]>::len), Some(2));
        assert_eq!(narrowed.problem(), None);
        assert!(serde_json::from_value::<NetworkSpec>(json!({"allow": [], "x": 1})).is_err());
        assert!(serde_json::from_value::<NetworkSpec>(json!("yes")).is_err());
        for bad in [
            json!({"allow": []}),
            json!({"allow": ["pypi.org:99999"]}),
            json!({"allow": ["host name:80"]}),
            json!({"allow": [""]}),
            json!({"allow": ["a\u{0}b:1"]}),
        ] {
            assert!(spec(bad.clone()).problem().is_some(), "{bad}");
        }
    }
}
