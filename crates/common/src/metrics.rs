//! The Prometheus registry of a process, rendered in the text exposition format.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// Builds a registry with Cairn's prefix; components register their own metrics.
pub fn registry() -> Registry {
    Registry::with_prefix("cairn")
}

/// Renders a registry as Prometheus text.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if encode(&mut out, registry).is_err() {
        out.clear();
    }
    out
}

/// Registers each `name, help => metric` in `registry`; the registry keeps a clone,
/// which shares the metric's value.
#[macro_export]
macro_rules! register_metrics {
    ($registry:expr; $($name:literal, $help:literal => $metric:expr;)+) => {
        $( $registry.register($name, $help, $metric.clone()); )+
    };
}

/// The outbox relay's counters.
#[derive(Clone, Default)]
pub struct OutboxMetrics {
    pub published: Counter,
    pub publish_failures: Counter,
    pub batches: Counter,
}

impl OutboxMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        crate::register_metrics!(registry;
            "outbox_published", "Outbox messages confirmed by the broker and marked published" => metrics.published;
            "outbox_publish_failures", "Outbox publishes that were nacked, returned or lost with their channel" => metrics.publish_failures;
            "outbox_batches", "Outbox batches the relay published" => metrics.batches;
        );
        metrics
    }
}

/// A registry frozen after registration, shared with the `/metrics` handler.
pub type SharedRegistry = Arc<Registry>;
