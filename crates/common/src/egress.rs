//! What a step asks of the network: none, the worker's egress policy, or that policy
//! narrowed to named destinations. The policy is layered: the operator's (the worker's
//! settings), then the tenant's (the `network_policy` module), then the run's or the
//! sandbox's. A lower layer only narrows: a destination a layer above refuses stays
//! refused whatever a lower one names, and a layer that says `false` leaves no network.

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

/// A layer that narrows the operator's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Layer {
    /// The tenant's network policy.
    Tenant,
    /// The run's step.
    Run,
    /// The sandbox's own.
    Sandbox,
}

/// One narrowing: the destinations a layer lets through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Narrowing {
    pub by: Layer,
    pub allow: Vec<String>,
}

/// What the layers below the operator leave a process: whether it has a NAT at all,
/// and, in order, the lists each of its packets must pass after the operator's policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Effective {
    pub enabled: bool,
    /// Who turned the network off, when a layer did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled_by: Option<Layer>,
    pub narrowed_by: Vec<Narrowing>,
}

impl Effective {
    /// The network or none, with no layer narrowing it (a check, the worker's probe).
    pub fn flag(enabled: bool) -> Effective {
        Effective {
            enabled,
            disabled_by: None,
            narrowed_by: Vec::new(),
        }
    }

    /// The tenant's layer (`None`: it narrows nothing) and then the process's own
    /// (`None`: `default`, the worker's setting), each only narrowing.
    pub fn of(
        tenant: Option<&NetworkSpec>,
        own: Option<&NetworkSpec>,
        own_layer: Layer,
        default: bool,
    ) -> Effective {
        let asked = own.map_or(default, NetworkSpec::enabled);
        let disabled_by = if !asked {
            Some(own_layer)
        } else if tenant.is_some_and(|t| !t.enabled()) {
            Some(Layer::Tenant)
        } else {
            None
        };
        if disabled_by.is_some() {
            return Effective {
                enabled: false,
                disabled_by,
                narrowed_by: Vec::new(),
            };
        }
        let narrowed_by = [(Layer::Tenant, tenant), (own_layer, own)]
            .into_iter()
            .filter_map(|(by, spec)| {
                Some(Narrowing {
                    by,
                    allow: spec?.narrowed_to()?.to_vec(),
                })
            })
            .collect();
        Effective {
            enabled: true,
            disabled_by: None,
            narrowed_by,
        }
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

    /// The tenant's layer narrows before the process's own, and either one's `false`
    /// leaves no network, whatever the other says.
    #[test]
    fn layers_only_narrow() {
        let list = |entries: &[&str]| spec(json!({"allow": entries}));
        let tenant = list(&["203.0.113.10:8080"]);
        let own = list(&["203.0.113.10:8081"]);
        let both = Effective::of(Some(&tenant), Some(&own), Layer::Run, true);
        assert!(both.enabled);
        assert_eq!(
            both.narrowed_by,
            [
                Narrowing {
                    by: Layer::Tenant,
                    allow: vec!["203.0.113.10:8080".into()]
                },
                Narrowing {
                    by: Layer::Run,
                    allow: vec!["203.0.113.10:8081".into()]
                },
            ]
        );
        let off = spec(json!(false));
        let on = spec(json!(true));
        let closed = Effective::of(Some(&off), Some(&own), Layer::Sandbox, true);
        assert_eq!(
            (closed.enabled, closed.disabled_by),
            (false, Some(Layer::Tenant))
        );
        assert!(closed.narrowed_by.is_empty());
        let own_off = Effective::of(Some(&tenant), Some(&off), Layer::Run, true);
        assert_eq!(own_off.disabled_by, Some(Layer::Run));
        // The worker's default decides a process that does not say.
        assert!(!Effective::of(Some(&on), None, Layer::Run, false).enabled);
        let open = Effective::of(None, None, Layer::Run, true);
        assert!(open.enabled && open.narrowed_by.is_empty());
    }
}
