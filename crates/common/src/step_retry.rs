//! A step's retry policy: which failures run it again, how many times, and how long
//! its run waits in between (without holding a worker slot: the scheduler's gate holds
//! it until then).

use serde::{Deserialize, Serialize};
use std::time::Duration;
use utoipa::ToSchema;

/// When a failed step runs again. A step without one (the default, whether or not it is
/// idempotent) fails its run at its first failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Executions of the step in all, the first one included: 2 to 20.
    #[schema(minimum = 2, maximum = 20)]
    pub max_attempts: u32,
    #[serde(default)]
    pub backoff: Backoff,
    /// The failures that run it again: exit codes (1 to 255), `"timeout"` (it passed its
    /// `timeout_seconds`), `"oom"` (it passed its memory limit). Absent or empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 16)]
    pub on: Vec<RetryOn>,
}

/// How long a run waits before its step runs again: `initial_seconds`, times
/// `multiplier` after each failure, at most `max_seconds`, then up to `jitter_percent`
/// of it added or taken away at random.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    /// 1 to 3600 (default 1).
    #[serde(default = "default_initial")]
    #[schema(minimum = 1, maximum = 3600)]
    pub initial_seconds: u32,
    /// `initial_seconds` to 86400 (default 300).
    #[serde(default = "default_max")]
    #[schema(minimum = 1, maximum = 86400)]
    pub max_seconds: u32,
    /// 1 to 10 (default 2).
    #[serde(default = "default_multiplier")]
    #[schema(minimum = 1, maximum = 10)]
    pub multiplier: u32,
    /// 0 to 100 (default 20).
    #[serde(default = "default_jitter")]
    #[schema(minimum = 0, maximum = 100)]
    pub jitter_percent: u32,
}

fn default_initial() -> u32 {
    1
}
fn default_max() -> u32 {
    300
}
fn default_multiplier() -> u32 {
    2
}
fn default_jitter() -> u32 {
    20
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial_seconds: default_initial(),
            max_seconds: default_max(),
            multiplier: default_multiplier(),
            jitter_percent: default_jitter(),
        }
    }
}

/// A failure a policy retries: an exit code, or `"timeout"` or `"oom"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum RetryOn {
    Exit(i32),
    Named(Failure),
}

/// An exit code is any JSON number with no fraction (`75` or `75.0`); one out of every
/// exit code's range reads as 0, which the policy's check refuses by its field.
impl<'de> Deserialize<'de> for RetryOn {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Whole(i64),
            Number(f64),
            Named(Failure),
        }
        match Raw::deserialize(deserializer) {
            Ok(Raw::Whole(n)) => Ok(RetryOn::Exit(i32::try_from(n).unwrap_or(0))),
            Ok(Raw::Number(n)) if n.fract() == 0.0 => {
                // A whole number: exact as i32 when in its range, else 0.
                let code = if n.abs() <= f64::from(i32::MAX) {
                    n as i32
                } else {
                    0
                };
                Ok(RetryOn::Exit(code))
            }
            Ok(Raw::Number(_)) => Err(serde::de::Error::custom("an exit code is a whole number")),
            Ok(Raw::Named(failure)) => Ok(RetryOn::Named(failure)),
            Err(_) => Err(serde::de::Error::custom(
                "each of `on` is an exit code, \"timeout\" or \"oom\"",
            )),
        }
    }
}

/// A failure that is not an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    Timeout,
    Oom,
}

/// How a failed step ended, as far as a policy asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Exit(i32),
    Timeout,
    Oom,
    /// Killed by a signal, another limit, or it could not start: never retried.
    Other,
}

impl RetryPolicy {
    /// What is wrong with it, as `(field, message)`.
    pub fn problem(&self) -> Option<(&'static str, &'static str)> {
        let b = &self.backoff;
        if !(2..=20).contains(&self.max_attempts) {
            return Some(("max_attempts", "2 to 20"));
        }
        if !(1..=3600).contains(&b.initial_seconds) {
            return Some(("backoff.initial_seconds", "1 to 3600"));
        }
        if b.max_seconds < b.initial_seconds || b.max_seconds > 86_400 {
            return Some(("backoff.max_seconds", "initial_seconds to 86400"));
        }
        if !(1..=10).contains(&b.multiplier) {
            return Some(("backoff.multiplier", "1 to 10"));
        }
        if b.jitter_percent > 100 {
            return Some(("backoff.jitter_percent", "0 to 100"));
        }
        let bad_code = self
            .on
            .iter()
            .any(|o| matches!(o, RetryOn::Exit(c) if !(1..=255).contains(c)));
        if self.on.len() > 16 || bad_code {
            return Some((
                "on",
                "at most 16: exit codes 1 to 255, \"timeout\", \"oom\"",
            ));
        }
        None
    }

    /// Whether this failure runs the step again (given the policy's list).
    pub fn retries(&self, ended: Ended) -> bool {
        if ended == Ended::Other {
            return false;
        }
        self.on.is_empty()
            || self.on.iter().any(|o| {
                matches!(
                    (o, ended),
                    (RetryOn::Exit(a), Ended::Exit(b)) if *a == b
                ) || matches!(
                    (o, ended),
                    (RetryOn::Named(Failure::Timeout), Ended::Timeout)
                        | (RetryOn::Named(Failure::Oom), Ended::Oom)
                )
            })
    }

    /// The wait before the run after `failures` failures (1 for the first), with
    /// `random` in 0..1 choosing the jitter.
    pub fn delay(&self, failures: u32, random: f64) -> Duration {
        let b = &self.backoff;
        let grown = f64::from(b.initial_seconds)
            * f64::from(b.multiplier)
                .powi(i32::try_from(failures.saturating_sub(1)).unwrap_or(i32::MAX));
        let capped = grown.min(f64::from(b.max_seconds));
        let spread = capped * f64::from(b.jitter_percent) / 100.0;
        let jittered = capped - spread + 2.0 * spread * random.clamp(0.0, 1.0);
        Duration::from_secs_f64(jittered.max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::{Backoff, Ended, Failure, RetryOn, RetryPolicy};
    use std::time::Duration;

    fn policy(on: Vec<RetryOn>) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            backoff: Backoff {
                initial_seconds: 2,
                max_seconds: 10,
                multiplier: 3,
                jitter_percent: 0,
            },
            on,
        }
    }

    #[test]
    fn a_policy_retries_only_the_failures_it_names() {
        let any = policy(vec![]);
        assert!(
            any.retries(Ended::Exit(1)) && any.retries(Ended::Timeout) && any.retries(Ended::Oom)
        );
        assert!(
            !any.retries(Ended::Other),
            "a signal or another limit is never retried"
        );
        let named = policy(vec![RetryOn::Exit(75), RetryOn::Named(Failure::Timeout)]);
        assert!(named.retries(Ended::Exit(75)) && named.retries(Ended::Timeout));
        assert!(!named.retries(Ended::Exit(1)) && !named.retries(Ended::Oom));
    }

    #[test]
    fn the_wait_grows_by_its_multiplier_up_to_its_cap_with_jitter_around_it() {
        let p = policy(vec![]);
        assert_eq!(p.delay(1, 0.5), Duration::from_secs(2));
        assert_eq!(p.delay(2, 0.5), Duration::from_secs(6));
        assert_eq!(p.delay(3, 0.5), Duration::from_secs(10), "capped");
        let mut jittered = p.clone();
        jittered.backoff.jitter_percent = 50;
        assert_eq!(jittered.delay(1, 0.0), Duration::from_secs(1));
        assert_eq!(jittered.delay(1, 1.0), Duration::from_secs(3));
    }

    #[test]
    fn a_policy_is_parsed_from_its_documented_form_and_checked() {
        let p: RetryPolicy = serde_json::from_value(serde_json::json!({
            "max_attempts": 4, "backoff": {"initial_seconds": 1, "multiplier": 2}, "on": [1, 75, "timeout", "oom"]
        }))
        .expect("the documented form");
        assert_eq!(p.on.len(), 4);
        assert_eq!(p.backoff.max_seconds, 300, "a default");
        assert_eq!(p.problem(), None);
        assert!(serde_json::from_value::<RetryPolicy>(
            serde_json::json!({"max_attempts": 2, "on": ["later"]})
        )
        .is_err());
        let whole: RetryPolicy =
            serde_json::from_value(serde_json::json!({"max_attempts": 2, "on": [75.0, -13, 1e12]}))
                .expect("whole numbers");
        assert_eq!(
            whole.on,
            [RetryOn::Exit(75), RetryOn::Exit(-13), RetryOn::Exit(0)]
        );
        assert_eq!(
            whole.problem().map(|p| p.0),
            Some("on"),
            "out of range: refused by its field"
        );
        assert!(serde_json::from_value::<RetryPolicy>(
            serde_json::json!({"max_attempts": 2, "on": [7.5]})
        )
        .is_err());
        let one = RetryPolicy {
            max_attempts: 1,
            ..p.clone()
        };
        assert_eq!(one.problem().map(|p| p.0), Some("max_attempts"));
        let zero = RetryPolicy {
            on: vec![RetryOn::Exit(0)],
            ..p
        };
        assert_eq!(zero.problem().map(|p| p.0), Some("on"));
    }
}
