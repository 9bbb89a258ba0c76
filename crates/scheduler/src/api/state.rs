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
    pub sandboxes_created: Counter,
    pub sandbox_operations: Counter,
}

impl ApiMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        cairn_common::register_metrics!(registry;
            "runs_admitted", "Runs admitted (each with its ticket and outbox message)" => metrics.runs_admitted;
            "continuations_admitted", "Reviewed continuation actions admitted" => metrics.continuations_admitted;
            "verifications_adopted", "Verification handoffs adopted (each queued on the same ticket)" => metrics.verifications_adopted;
            "sandboxes_created", "Sandboxes recorded and queued for placement (created, restored or forked through the API)" => metrics.sandboxes_created;
            "sandbox_operations", "Sandbox operations (exec, files, snapshots, forks) recorded for their worker" => metrics.sandbox_operations;
        );
        metrics
    }
}

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub metrics: ApiMetrics,
}
