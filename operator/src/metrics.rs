//! Prometheus metrics (prometheus-client): reconciles, errors by kind, nodes by rollout phase,
//! evictions and evictions blocked by a PodDisruptionBudget, pass duration; and, for the alerts in
//! `config/observability/alerts.yaml`, stalled plans, Tessera's cordons and quota shortfalls.

use std::collections::{BTreeMap, BTreeSet};
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

/// A plan whose `Stalled` condition is true, and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct StalledPlan {
    pub plan: String,
    pub reason: String,
}

/// A node Tessera cordoned, and the plan rolling it out (empty when no rollout record names one).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct CordonedNode {
    pub node: String,
    pub plan: String,
}

/// A tenant's devices in one state: `allocated`, `active`, `idle` or `unmeasured`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct TenantState {
    pub tenant: String,
    pub state: String,
}

/// A tenant's idle holders, `certain="true"` (an exact holder, or a guessed one whose every
/// possible device is idle: `IdleHolder::certain_since`) or `"false"` (the placement's guess alone:
/// the alert leaves these out, as the guessed pod may not be the idle one).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct TenantIdle {
    pub tenant: String,
    pub certain: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ResourceLabel {
    pub resource: String,
}

/// Gauges for a set of objects that is replaced whole on every pass: series of objects that are
/// gone are removed, and a series present before and after is never removed in between (a scrape
/// in the middle of a pass sees no gap that would restart an alert's `for`).
struct GaugeSet<L> {
    family: Family<L, Gauge>,
    present: Mutex<BTreeSet<L>>,
}

impl<L: Clone + Ord + std::hash::Hash + Eq> GaugeSet<L> {
    fn new() -> Self {
        Self { family: Family::default(), present: Mutex::new(BTreeSet::new()) }
    }

    fn replace(&self, values: &BTreeMap<L, i64>) {
        let mut present = crate::locked(&self.present);
        for gone in present.iter().filter(|l| !values.contains_key(l)) {
            self.family.remove(gone);
        }
        for (labels, v) in values {
            self.family.get_or_create(labels).set(*v);
        }
        *present = values.keys().cloned().collect();
    }
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
    /// The requests of [`Self::api_requests`] that may change an object (every method but GET).
    pub api_writes: Counter,
    /// Nodes a pass left alone because the caches did not show the operator's last write yet.
    cache_behind: Counter,
    /// Nodes a pass planned in full, and nodes whose verdict of the pass before it reused.
    nodes_planned: Counter,
    nodes_reused: Counter,
    plan_stalled_since: GaugeSet<StalledPlan>,
    node_cordoned_since: GaugeSet<CordonedNode>,
    node_cordon_limit: GaugeSet<CordonedNode>,
    quota_shortfall: GaugeSet<ResourceLabel>,
    tenant_slices: GaugeSet<TenantState>,
    tenant_idle_since: GaugeSet<TenantIdle>,
    /// When the idle report was last computed from a pod list (0: never, or not the leader).
    idle_report_at: Gauge,
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
            api_writes: Counter::default(),
            cache_behind: Counter::default(),
            nodes_planned: Counter::default(),
            nodes_reused: Counter::default(),
            rollout: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            fragmented: Family::default(),
            registry: Mutex::new(Registry::default()),
            plan_stalled_since: GaugeSet::new(),
            node_cordoned_since: GaugeSet::new(),
            node_cordon_limit: GaugeSet::new(),
            quota_shortfall: GaugeSet::new(),
            tenant_slices: GaugeSet::new(),
            tenant_idle_since: GaugeSet::new(),
            idle_report_at: Gauge::default(),
        };
        for kind in crate::Error::KINDS {
            let _ = m.errors.get_or_create(&KindLabel { kind: kind.into() });
        }
        // Registered in this order, the order `/metrics` lists them in.
        m.register_passes(&mut registry);
        m.register_api(&mut registry);
        m.register_rollout(&mut registry);
        m.register_quota(&mut registry);
        m.register_activity(&mut registry);
        *m.registry.lock().expect("fresh mutex") = registry;
        m
    }
}

impl Metrics {
    /// The passes: how many, how long, how they failed, and what they did to nodes and pods.
    fn register_passes(&self, registry: &mut Registry) {
        registry.register("reconciles", "Fleet reconcile passes", self.reconciles.clone());
        registry.register("reconcile_errors", "Failed passes by error kind", self.errors.clone());
        registry.register("nodes", "GPU nodes by rollout phase", self.nodes.clone());
        registry.register("evictions", "Pods evicted", self.evictions.clone());
        registry.register(
            "evictions_blocked",
            "Evictions refused (PodDisruptionBudget) or timed out",
            self.evictions_blocked.clone(),
        );
        registry.register("reconcile_duration_seconds", "Duration of one fleet pass", self.duration.clone());
    }

    /// What the passes cost: requests to the API server, and nodes planned or skipped.
    fn register_api(&self, registry: &mut Registry) {
        registry.register("api_requests", "Requests sent to the API server", self.api_requests.clone());
        registry.register(
            "api_writes",
            "Requests sent to the API server that may change an object (every method but GET)",
            self.api_writes.clone(),
        );
        registry.register(
            "nodes_cache_behind",
            "Nodes left for a pass because the caches did not show the operator's last write to them yet",
            self.cache_behind.clone(),
        );
        registry.register("nodes_planned", "Nodes a pass planned in full", self.nodes_planned.clone());
        registry.register(
            "nodes_reused",
            "Nodes a pass did not plan again: their objects, agent and plans were as the pass before saw them",
            self.nodes_reused.clone(),
        );
    }

    /// The rollout as the alerts watch it: nodes' rollout time and cordons, plans' fragmentation
    /// and stalls.
    fn register_rollout(&self, registry: &mut Registry) {
        registry.register(
            "node_rollout_duration_seconds",
            "From a node's drain start to its uncordon",
            self.rollout.clone(),
        );
        registry.register(
            "plan_fragmented_slices",
            "Free compute slices of a plan's GPUs that no profile the tenants' quotas ask for can use",
            self.fragmented.clone(),
        );
        registry.register(
            "plan_stalled_since_timestamp_seconds",
            "Since when (Unix time) a plan's Stalled condition has been true, by plan and reason",
            self.plan_stalled_since.family.clone(),
        );
        registry.register(
            "node_cordoned_since_timestamp_seconds",
            "When (Unix time) Tessera cordoned a node that is still cordoned, by node and plan",
            self.node_cordoned_since.family.clone(),
        );
        registry.register(
            "node_cordon_limit_seconds",
            "How long the node's plan lets it stay cordoned: drainTimeoutSeconds + applyTimeoutSeconds \
             (no series when applyTimeoutSeconds is 0)",
            self.node_cordon_limit.family.clone(),
        );
    }

    /// The quotas against the fleet's supply.
    fn register_quota(&self, registry: &mut Registry) {
        registry.register(
            "quota_shortfall",
            "How much all tenants' quota limits together exceed what the fleet's applied layouts supply, \
             by resource (0: the fleet honours every quota at once)",
            self.quota_shortfall.family.clone(),
        );
    }

    /// The tenants' devices by activity (the idle report), and when it was last computed.
    fn register_activity(&self, registry: &mut Registry) {
        registry.register(
            "tenant_slices",
            "Devices (MIG instances or whole GPUs) a tenant's pods hold, by state: allocated, active, \
             idle (past the quota's idleAfter) or unmeasured",
            self.tenant_slices.family.clone(),
        );
        registry.register(
            "tenant_idle_since_timestamp_seconds",
            "Since when a tenant's longest-idle held device has been idle (Unix time; absent while none is), \
             by whether that is certain (exact holder, or every device it may hold idle) or the placement's guess",
            self.tenant_idle_since.family.clone(),
        );
        registry.register(
            "idle_report_timestamp_seconds",
            "When (Unix time) the tenant_* figures were last computed from a pod list (0: not yet); \
             they are kept while pods cannot be listed, so an old value means stale figures",
            self.idle_report_at.clone(),
        );
    }

    pub fn reconciled(&self, took: Duration) {
        self.reconciles.inc();
        self.duration.observe(took.as_secs_f64());
    }

    pub fn nodes_cache_behind(&self, n: usize) {
        self.cache_behind.inc_by(n as u64);
    }

    pub fn nodes_planned(&self, planned: usize, reused: usize) {
        self.nodes_planned.inc_by(planned as u64);
        self.nodes_reused.inc_by(reused as u64);
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

    /// The plans whose `Stalled` condition is true, with the condition's lastTransitionTime.
    pub fn set_stalled_plans(&self, since: &BTreeMap<StalledPlan, i64>) {
        self.plan_stalled_since.replace(since);
    }

    /// The nodes Tessera holds cordoned: since when, and how long their plan allows.
    pub fn set_cordons(&self, since: &BTreeMap<CordonedNode, i64>, limit: &BTreeMap<CordonedNode, i64>) {
        self.node_cordoned_since.replace(since);
        self.node_cordon_limit.replace(limit);
    }

    /// Per resource the tenants' quotas ask for: how much of it the fleet lacks (0 when none).
    pub fn set_quota_shortfall(&self, shortfall: &BTreeMap<String, i64>) {
        let values = shortfall.iter().map(|(r, n)| (ResourceLabel { resource: r.clone() }, *n)).collect();
        self.quota_shortfall.replace(&values);
    }

    /// Per tenant: devices by state (`idle`: past its quota's `idleAfter`), and since when its
    /// longest-idle device has been idle, apart for certain and guessed holders (no series while
    /// none is idle).
    pub fn set_tenant_activity(&self, report: &tessera_planner::idle::IdleReport) {
        let mut slices = BTreeMap::new();
        for (tenant, u) in &report.tenants {
            for (state, n) in
                [("allocated", u.allocated), ("active", u.active), ("idle", u.idle), ("unmeasured", u.unmeasured)]
            {
                slices.insert(TenantState { tenant: tenant.clone(), state: state.into() }, n);
            }
        }
        self.tenant_slices.replace(&slices);
        let mut since: BTreeMap<TenantIdle, i64> = BTreeMap::new();
        for h in &report.idle {
            let (certain, at) = h.certain_since.map_or(("false", h.idle_since), |t| ("true", t));
            let key = TenantIdle { tenant: h.tenant.clone().unwrap_or_default(), certain: certain.into() };
            let e = since.entry(key).or_insert(i64::MAX);
            *e = (*e).min(at.as_second());
        }
        self.tenant_idle_since.replace(&since);
    }

    /// The idle report was computed from a pod list at `unix_seconds`.
    pub fn idle_reported(&self, unix_seconds: i64) {
        self.idle_report_at.set(unix_seconds);
    }

    /// On losing the lease: what only the leader knows goes stale, so it goes (the new leader
    /// exports it); the alerts must not fire on a follower's leftovers.
    pub fn forget_leader_state(&self) {
        self.set_stalled_plans(&BTreeMap::new());
        self.set_cordons(&BTreeMap::new(), &BTreeMap::new());
        self.set_quota_shortfall(&BTreeMap::new());
        self.set_tenant_activity(&Default::default());
        self.idle_reported(0);
        self.nodes.clear();
        self.fragmented.clear();
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = crate::locked(&self.registry);
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
        m.set_tenant_activity(&idle_report());
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

    /// `reconcile_errors_total` is exported at zero for every kind before the first error (the
    /// README and the dashboard query it; a missing series reads as "no data", not as 0).
    #[test]
    fn error_counters_start_at_zero_for_every_kind() {
        let text = Metrics::default().render();
        for kind in crate::Error::KINDS {
            let series = format!("tessera_operator_reconcile_errors_total{{kind=\"{kind}\"}} 0");
            assert!(text.contains(&series), "{series} missing:\n{text}");
        }
        let m = Metrics::default();
        m.error("api");
        assert!(m.render().contains("tessera_operator_reconcile_errors_total{kind=\"api\"} 1"));
    }

    fn repo_yaml(path: &str) -> serde_json::Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// A metrics registry with one series of every family the alerts use.
    fn every_series() -> String {
        let m = Metrics::default();
        m.reconciled(Duration::from_millis(3));
        let stalled = StalledPlan { plan: "p".into(), reason: "DrainTimeout".into() };
        m.set_stalled_plans(&[(stalled, 1000)].into());
        let node = CordonedNode { node: "n".into(), plan: "p".into() };
        m.set_cordons(&[(node.clone(), 1000)].into(), &[(node, 1200)].into());
        m.set_quota_shortfall(&[("nvidia.com/gpu".to_string(), 2)].into());
        // A certain holder of tenant `ml` and a guessed one of tenant `web`.
        let mut r = idle_report();
        let mut g = r.idle[0].clone();
        (g.pod, g.tenant, g.exact, g.certain_since) = ("web/b".into(), Some("web".into()), false, None);
        r.idle.push(g);
        m.set_tenant_activity(&r);
        m.idle_reported(2000);
        m.render()
    }

    /// A metric name, its `label="value"` matchers, and the labels it is grouped by.
    type Selector = (String, Vec<(String, String)>, Vec<String>);

    /// The series selectors of a PromQL expression: each `tessera_operator_*` name, its
    /// `label="value"` matchers, and the labels of a `by (...)` just before it.
    fn selectors(expr: &str) -> Vec<Selector> {
        let mut out = Vec::new();
        let mut rest = expr;
        let mut by: Vec<String> = Vec::new();
        while let Some(i) = rest.find("tessera_operator_").into_iter().chain(rest.find("by (")).min() {
            rest = &rest[i..];
            if let Some(tail) = rest.strip_prefix("by (") {
                let end = tail.find(')').unwrap();
                by = tail[..end].split(',').map(|l| l.trim().to_string()).collect();
                rest = &tail[end..];
                continue;
            }
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
            let (name, tail) = rest.split_at(end);
            let mut matchers = Vec::new();
            rest = tail;
            if let Some(inner) = tail.strip_prefix('{') {
                let close = inner.find('}').unwrap();
                for m in inner[..close].split(',').filter(|m| !m.trim().is_empty()) {
                    let (k, v) = m.split_once('=').unwrap();
                    assert!(!k.ends_with('!') && !v.starts_with('~'), "only equality matchers are checked: {m}");
                    matchers.push((k.trim().to_string(), v.trim().trim_matches('"').to_string()));
                }
                rest = &inner[close..];
            }
            out.push((name.to_string(), matchers, std::mem::take(&mut by)));
        }
        out
    }

    /// Tenant `ml` holds two devices, one idle since 1000 s after the epoch.
    fn idle_report() -> tessera_planner::idle::IdleReport {
        let mut r = tessera_planner::idle::IdleReport::default();
        r.tenants.insert(
            "ml".into(),
            tessera_planner::idle::TenantUse { allocated: 2, active: 1, idle: 1, unmeasured: 0, ..Default::default() },
        );
        r.idle.push(tessera_planner::idle::IdleHolder {
            pod: "ml/a".into(),
            tenant: Some("ml".into()),
            virtual_pod: None,
            claim: None,
            node: "n".into(),
            gpu: 0,
            profile: "3g.40gb".into(),
            start: Some(0),
            memory_used_mib: 0,
            idle_since: k8s_openapi::jiff::Timestamp::from_second(1000).unwrap(),
            exact: true,
            certain_since: Some(k8s_openapi::jiff::Timestamp::from_second(1000).unwrap()),
        });
        r
    }

    #[test]
    fn tenant_slices_follow_the_report_and_go_with_the_lease() {
        let m = Metrics::default();
        m.set_tenant_activity(&idle_report());
        let text = m.render();
        for series in [
            "tessera_operator_tenant_slices{tenant=\"ml\",state=\"allocated\"} 2",
            "tessera_operator_tenant_slices{tenant=\"ml\",state=\"idle\"} 1",
            "tessera_operator_tenant_idle_since_timestamp_seconds{tenant=\"ml\",certain=\"true\"} 1000",
        ] {
            assert!(text.contains(series), "{series}:\n{text}");
        }
        // A guessed holder idle for longer is exported apart: the alert counts certain ones only.
        let mut guessed = idle_report();
        let mut g = guessed.idle[0].clone();
        (g.pod, g.exact, g.certain_since) = ("ml/b".into(), false, None);
        g.idle_since = k8s_openapi::jiff::Timestamp::from_second(500).unwrap();
        guessed.idle.insert(0, g);
        m.set_tenant_activity(&guessed);
        let text = m.render();
        for series in [
            "tessera_operator_tenant_idle_since_timestamp_seconds{tenant=\"ml\",certain=\"true\"} 1000",
            "tessera_operator_tenant_idle_since_timestamp_seconds{tenant=\"ml\",certain=\"false\"} 500",
        ] {
            assert!(text.contains(series), "{series}:\n{text}");
        }
        let mut none_idle = idle_report();
        none_idle.idle.clear();
        m.set_tenant_activity(&none_idle);
        assert!(!m.render().contains("tenant_idle_since_timestamp_seconds{"), "no idle device: no series");
        m.forget_leader_state();
        assert!(!m.render().contains("tenant=\"ml\""));
    }

    /// Every series selector of the shipped alerts matches an exported line: its name, its
    /// `label="value"` matchers and the labels it is grouped by (a certain and a guessed idle
    /// holder are exported, so `certain="true"` must pick one); the staleness clause's timestamp is
    /// 0 before any report (the clause is false) and the report's time after. And the
    /// PrometheusRule holds exactly the plain rule file's groups.
    #[test]
    fn the_alerts_query_only_exported_metrics_and_both_rule_files_agree() {
        let text = every_series();
        let rules = repo_yaml("config/observability/alerts.yaml");
        let mut checked = 0;
        for rule in rules["groups"][0]["rules"].as_array().unwrap() {
            let expr = rule["expr"].as_str().unwrap();
            for (name, matchers, by) in selectors(expr) {
                let found = text.lines().filter(|l| !l.starts_with('#')).any(|l| {
                    let labels = l.strip_prefix(&name).and_then(|t| t.split_once(' ')).map(|(labels, _)| labels);
                    labels.is_some_and(|labels| {
                        (labels.is_empty() || labels.starts_with('{'))
                            && matchers.iter().all(|(k, v)| labels.contains(&format!("{k}=\"{v}\"")))
                            && by.iter().all(|k| labels.contains(&format!("{k}=\"")))
                    })
                });
                assert!(found, "{name} {matchers:?} by {by:?} matches no exported line:\n{text}");
                checked += 1;
            }
        }
        assert!(checked >= 6, "{checked}");
        let idle = selectors(
            rules["groups"][0]["rules"].as_array().unwrap().iter().find(|r| r["alert"] == "TesseraSlicesIdle").unwrap()
                ["expr"]
                .as_str()
                .unwrap(),
        );
        let certain = ("certain".to_string(), "true".to_string());
        assert!(idle.iter().any(|(_, m, by)| m.contains(&certain) && by == &["tenant"]), "{idle:?}");
        assert!(
            text.contains("tessera_operator_tenant_idle_since_timestamp_seconds{tenant=\"web\",certain=\"false\"}")
        );
        assert!(text.contains("tessera_operator_idle_report_timestamp_seconds 2000"), "{text}");
        let before = Metrics::default().render();
        assert!(before.contains("tessera_operator_idle_report_timestamp_seconds 0"), "{before}");
        for series in [
            "tessera_operator_plan_stalled_since_timestamp_seconds{plan=\"p\",reason=\"DrainTimeout\"} 1000",
            "tessera_operator_node_cordoned_since_timestamp_seconds{node=\"n\",plan=\"p\"} 1000",
            "tessera_operator_node_cordon_limit_seconds{node=\"n\",plan=\"p\"} 1200",
            "tessera_operator_quota_shortfall{resource=\"nvidia.com/gpu\"} 2",
        ] {
            assert!(text.contains(series), "{series}:\n{text}");
        }
        let wrapped = repo_yaml("config/observability/prometheus-rule.yaml");
        assert_eq!(wrapped["kind"], "PrometheusRule");
        assert!(wrapped["spec"] == rules, "prometheus-rule.yaml's spec differs from alerts.yaml: edit both");
        assert!(
            repo_yaml("config/helm/tessera/files/alerts.yaml") == rules,
            "the Helm chart's files/alerts.yaml differs from config/observability/alerts.yaml: copy it"
        );
    }

    /// Series of objects that are gone disappear; a follower that lost the lease exports none.
    #[test]
    fn object_gauges_follow_the_objects_and_go_with_the_lease() {
        let m = Metrics::default();
        let plan = |p: &str| StalledPlan { plan: p.into(), reason: "Conflict".into() };
        m.set_stalled_plans(&[(plan("a"), 10), (plan("b"), 20)].into());
        m.set_stalled_plans(&[(plan("b"), 20)].into());
        let text = m.render();
        assert!(!text.contains("plan=\"a\"") && text.contains("plan=\"b\""), "{text}");
        m.set_phases(&[("Draining".to_string(), 1)].into());
        m.forget_leader_state();
        let text = m.render();
        assert!(!text.contains("plan=\"b\"") && !text.contains("phase="), "{text}");
    }
}
