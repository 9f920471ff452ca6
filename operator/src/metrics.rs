//! Prometheus metrics (prometheus-client): reconciles, errors by kind, nodes by rollout phase,
//! evictions and evictions blocked by a PodDisruptionBudget, pass duration.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlanLabel {
    pub plan: String,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    reconciles: Counter,
    errors: Family<KindLabel, Counter>,
    nodes: Family<PhaseLabel, Gauge>,
    evictions: Counter,
    evictions_blocked: Counter,
    duration: Histogram,
    rollout: Histogram,
    fragmented: Family<PlanLabel, Gauge>,
    /// Every request the operator sends to the API server (watches count once, when opened).
    pub api_requests: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tessera_operator");
        let m = Self {
            reconciles: Counter::default(),
            errors: Family::default(),
            nodes: Family::default(),
            evictions: Counter::default(),
            evictions_blocked: Counter::default(),
            duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            api_requests: Counter::default(),
            rollout: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            fragmented: Family::default(),
            registry: Mutex::new(Registry::default()),
        };
        registry.register("reconciles", "Fleet reconcile passes", m.reconciles.clone());
        registry.register("reconcile_errors", "Failed passes by error kind", m.errors.clone());
        registry.register("nodes", "GPU nodes by rollout phase", m.nodes.clone());
        registry.register("evictions", "Pods evicted", m.evictions.clone());
        registry.register(
            "evictions_blocked",
            "Evictions refused (PodDisruptionBudget) or timed out",
            m.evictions_blocked.clone(),
        );
        registry.register("reconcile_duration_seconds", "Duration of one fleet pass", m.duration.clone());
        registry.register("api_requests", "Requests sent to the API server", m.api_requests.clone());
        registry.register(
            "node_rollout_duration_seconds",
            "From a node's drain start to its uncordon",
            m.rollout.clone(),
        );
        registry.register(
            "plan_fragmented_slices",
            "Free compute slices of a plan's GPUs that no profile the tenants' quotas ask for can use",
            m.fragmented.clone(),
        );
        *m.registry.lock().expect("fresh mutex") = registry;
        m
    }
}

impl Metrics {
    pub fn reconciled(&self, took: Duration) {
        self.reconciles.inc();
        self.duration.observe(took.as_secs_f64());
    }

    pub fn error(&self, kind: &str) {
        self.errors.get_or_create(&KindLabel { kind: kind.into() }).inc();
    }

    pub fn node_rolled_out(&self, seconds: f64) {
        self.rollout.observe(seconds);
    }

    pub fn evicted(&self) {
        self.evictions.inc();
    }

    pub fn eviction_blocked(&self) {
        self.evictions_blocked.inc();
    }

    pub fn set_phases(&self, phases: &std::collections::BTreeMap<String, i64>) {
        for phase in ["Idle", "Pending", "Draining", "Applying", "Uncordoning", "Failed"] {
            self.nodes.get_or_create(&PhaseLabel { phase: phase.into() }).set(phases.get(phase).copied().unwrap_or(0));
        }
    }

    /// One gauge per live plan; plans that are gone are dropped.
    pub fn set_fragmented(&self, per_plan: &std::collections::BTreeMap<String, i64>) {
        self.fragmented.clear();
        for (plan, n) in per_plan {
            self.fragmented.get_or_create(&PlanLabel { plan: plan.clone() }).set(*n);
        }
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric the shipped Grafana dashboard queries exists in what the operator exports.
    #[test]
    fn the_dashboard_queries_only_exported_metrics() {
        let m = Metrics::default();
        m.reconciled(Duration::from_millis(3));
        m.error("api");
        m.evicted();
        m.eviction_blocked();
        m.node_rolled_out(42.0);
        m.set_phases(&[("Draining".to_string(), 2)].into());
        m.set_fragmented(&[("gone".to_string(), 1)].into());
        m.set_fragmented(&[("p".to_string(), 3)].into());
        let text = m.render();
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/observability/grafana-dashboard.json");
        let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut checked = 0;
        for panel in dash["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                    if word.starts_with("tessera_operator_") {
                        assert!(text.contains(word), "dashboard queries {word}, which is not exported:\n{text}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked >= 8);
        assert!(text.contains("tessera_operator_nodes{phase=\"Draining\"} 2"), "{text}");
        assert!(text.contains("tessera_operator_plan_fragmented_slices{plan=\"p\"} 3"), "{text}");
        assert!(!text.contains("plan=\"gone\""), "a plan that is gone is dropped:\n{text}");
    }
}
