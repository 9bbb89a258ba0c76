//! The worker's metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone)]
pub struct WorkerMetrics {
    pub jobs_claimed: Counter,
    pub jobs_completed: Counter,
    pub jobs_failed: Counter,
    pub jobs_handed_back: Counter,
    pub deliveries_dropped: Counter,
    pub tenant_mismatches: Counter,
    pub steps_run: Counter,
    pub pauses: Counter,
    pub steps_reused: Counter,
    pub leases_renewed: Counter,
    pub leases_lost: Counter,
    pub self_fenced: Counter,
    pub stale_writes_rejected: Counter,
    pub checks_run: Counter,
    pub checks_reused: Counter,
    pub checks_unconfined: Counter,
    pub captures_failed: Counter,
    pub trees_behind_journal: Counter,
    pub claim_latency_seconds: Histogram,
    /// Sandboxes this worker holds now (each holds a slot).
    pub sandboxes_hosted: Gauge,
    pub sandbox_operations: Family<KindLabel, Counter>,
    pub sandbox_stops: Family<ReasonLabel, Counter>,
    /// Forks whose tree was a snapshot of their source's, staged here (no restore).
    pub forks_staged: Counter,
}

/// The kind of a sandbox operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

/// Why a sandbox left this worker.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        let buckets = [
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ];
        WorkerMetrics {
            jobs_claimed: Counter::default(),
            jobs_completed: Counter::default(),
            jobs_failed: Counter::default(),
            jobs_handed_back: Counter::default(),
            deliveries_dropped: Counter::default(),
            tenant_mismatches: Counter::default(),
            steps_run: Counter::default(),
            pauses: Counter::default(),
            steps_reused: Counter::default(),
            leases_renewed: Counter::default(),
            leases_lost: Counter::default(),
            self_fenced: Counter::default(),
            stale_writes_rejected: Counter::default(),
            checks_run: Counter::default(),
            checks_reused: Counter::default(),
            checks_unconfined: Counter::default(),
            captures_failed: Counter::default(),
            trees_behind_journal: Counter::default(),
            claim_latency_seconds: Histogram::new(buckets),
            sandboxes_hosted: Gauge::default(),
            sandbox_operations: Family::default(),
            sandbox_stops: Family::default(),
            forks_staged: Counter::default(),
        }
    }
}

impl WorkerMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        cairn_common::register_metrics!(registry;
            "worker_jobs_claimed", "Deliveries whose request this worker claimed" => m.jobs_claimed;
            "worker_jobs_completed", "Jobs this worker completed" => m.jobs_completed;
            "worker_jobs_failed", "Jobs that ended failed, cancelled or needing reconciliation" => m.jobs_failed;
            "worker_jobs_handed_back", "Jobs handed back to the queue on drain" => m.jobs_handed_back;
            "worker_deliveries_dropped", "Duplicate or stale deliveries acked and dropped" => m.deliveries_dropped;
            "worker_tenant_mismatches", "Announcements naming another tenant than their run's or sandbox's, dropped unclaimed" => m.tenant_mismatches;
            "worker_steps_run", "Steps executed" => m.steps_run;
            "worker_pauses", "Pauses recorded (after their checkpoint capture)" => m.pauses;
            "worker_steps_reused", "Steps skipped because their receipt stands on a snapshot the tree holds" => m.steps_reused;
            "worker_captures_failed", "Steps whose checkpoint kept failing: no receipt, the attempt ended" => m.captures_failed;
            "worker_trees_behind_journal", "Non-idempotent steps whose receipt the acquired tree does not hold (sent to a person)" => m.trees_behind_journal;
            "worker_leases_renewed", "Lease renewals" => m.leases_renewed;
            "worker_leases_lost", "Leases lost (expired or taken over)" => m.leases_lost;
            "worker_self_fenced", "Jobs stopped because their lease was lost" => m.self_fenced;
            "worker_stale_writes_rejected", "Durable writes refused because a newer owner exists" => m.stale_writes_rejected;
            "worker_verification_checks_run", "Verification checks executed" => m.checks_run;
            "worker_verification_checks_reused", "Verification checks answered by an earlier passed, confined result" => m.checks_reused;
            "worker_verification_checks_unconfined", "Verification checks that ran outside the namespace sandbox (never reusable)" => m.checks_unconfined;
            "worker_claim_latency_seconds", "Time from a request being queued to this worker claiming it" => m.claim_latency_seconds;
            "worker_sandboxes_hosted", "Sandboxes this worker holds now, running or paused (each holds a slot)" => m.sandboxes_hosted;
            "worker_sandbox_operations", "Sandbox operations carried out, by kind (exec, read, write, list, snapshot, fork)" => m.sandbox_operations;
            "worker_sandbox_stops", "Sandboxes that left this worker, by how (stopped, destroyed, pause_expired, worker_drained, failed, lease_lost)" => m.sandbox_stops;
            "worker_forks_staged", "Forks that started from their source's tree staged on this worker's disk, without a restore" => m.forks_staged;
        );
        m
    }
}

/// `cairn_worker_sandbox_capability{capability}`: 1 where the host allows that part of
/// the step sandbox (and `isolated`: whether steps run in it), as probed at start; and
/// the packets the steps' egress filters refused.
pub fn register_isolation(registry: &mut Registry, isolation: &crate::isolation::Isolation) {
    registry.register(
        "worker_step_egress_refused_packets",
        "Packets the steps' egress filters refused (a connection attempt is one or more)",
        isolation.refused(),
    );
    let report = isolation.report();
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    let family = Family::<Vec<(String, String)>, Gauge>::default();
    for (capability, present) in report.capabilities() {
        family
            .get_or_create(&vec![("capability".to_string(), capability.to_string())])
            .set(i64::from(present));
    }
    registry.register(
        "worker_sandbox_capability",
        "What this host allows of the step sandbox (1) or not (0), probed at start",
        family,
    );
}
