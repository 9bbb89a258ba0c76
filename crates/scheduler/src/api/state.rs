//! What every handler shares: the database pool and the API's counters.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use sqlx::PgPool;

/// The API's counters.
#[derive(Clone, Default)]
pub struct ApiMetrics {
    pub runs_admitted: Counter,
    pub continuations_admitted: Counter,
    pub verifications_adopted: Counter,
}

impl ApiMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        cairn_common::register_metrics!(registry;
            "runs_admitted", "Runs admitted (each with its ticket and outbox message)" => metrics.runs_admitted;
            "continuations_admitted", "Reviewed continuation actions admitted" => metrics.continuations_admitted;
            "verifications_adopted", "Verification handoffs adopted (each queued on the same ticket)" => metrics.verifications_adopted;
        );
        metrics
    }
}

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub metrics: ApiMetrics,
}
