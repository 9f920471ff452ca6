//! Pure quota planning: a `TenantGpuQuota` becomes one native `ResourceQuota` per namespace (the
//! API server's own admission enforces it, race-free), and its status reports usage, per-namespace
//! shares, conflicts and whether the fleet's applied layouts can honour every quota at once.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tessera_crds::conditions::{READY, RECONCILING, quota_reasons, remove_condition, set_condition};
use tessera_crds::quota::{SplitPolicy, TenantGpuQuotaSpec, TenantGpuQuotaStatus};
use tessera_crds::validate::GPU_RESOURCE;

pub use crate::supply::gpu_supply;
use crate::supply::{resource_of, supplied};
use tessera_crds::{GpuNode, TenantGpuQuota, catalog};

use crate::coverage::{self, Demand};

/// Label on every ResourceQuota Tessera writes: the owning quota's name ([`quota_label_value`]).
pub const QUOTA_LABEL: &str = "tessera.dev/quota";
/// Annotation with the owning quota's full name (a label value holds at most 63 characters).
pub const QUOTA_NAME_ANNOTATION: &str = "tessera.dev/quota-name";
/// Compute slices a whole GPU counts in physical limits (A30: 4; see the README).
pub const WHOLE_GPU_COMPUTE_SLICES: i64 = 7;

/// FNV-1a, 64 bits: a hash that is the same in every build, for short deterministic names.
fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// `s` if it fits in `max` characters, else a prefix and a hash of the whole: deterministic, and
/// two names that differ anywhere get different results.
fn fit_name(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let hash = format!("{:016x}", stable_hash(s));
    let prefix: String = s.chars().take(max - hash.len() - 1).collect();
    format!("{}-{hash}", prefix.trim_end_matches(['-', '.']))
}

/// The `ResourceQuota` name in each namespace: `tessera-<quota>`, shortened with a hash when that
/// would pass the 253 characters an object name may have.
pub fn resource_quota_name(quota: &str) -> String {
    fit_name(&format!("tessera-{quota}"), 253)
}

/// The [`QUOTA_LABEL`] value: the quota's name, shortened with a hash past 63 characters.
pub fn quota_label_value(quota: &str) -> String {
    fit_name(quota, 63)
}

/// The name to use in a namespace where `tessera-<quota>` is held by a ResourceQuota this quota
/// does not own: the name plus the start of the quota's UID, so the tenant's limit is enforced
/// anyway and the other object is left as it is.
pub fn fallback_resource_quota_name(quota: &str, uid: &str) -> String {
    let mut short: String = uid.chars().filter(char::is_ascii_alphanumeric).take(8).collect();
    if short.is_empty() {
        short = format!("{:08x}", stable_hash(quota) as u32); // no UID: not a stored object
    }
    fit_name(&format!("tessera-{quota}-{}", short.to_ascii_lowercase()), 253)
}

/// The quota that wrote this ResourceQuota, if Tessera did: a controller owner reference to a
/// TenantGpuQuota *and* the [`QUOTA_LABEL`] value that quota's name gives. Either alone is no
/// proof (a user's own ResourceQuota may carry our label, or a copied owner reference), so
/// nothing else is ever deleted.
pub fn written_by(rq: &ResourceQuota) -> Option<&str> {
    let label = rq.metadata.labels.as_ref()?.get(QUOTA_LABEL)?;
    rq.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| {
            o.controller == Some(true)
                && o.kind == "TenantGpuQuota"
                && o.api_version.starts_with("tessera.dev/")
                && quota_label_value(&o.name) == *label
        })
        .map(|o| o.name.as_str())
}

/// Each namespace's share of every tenant-wide limit.
pub fn shares(spec: &TenantGpuQuotaSpec) -> BTreeMap<String, BTreeMap<String, i64>> {
    let mut out: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    let n = spec.namespaces.len() as i64;
    for (i, ns) in spec.namespaces.iter().enumerate() {
        let mut mine = BTreeMap::new();
        for (res, &hard) in &spec.hard {
            let share = match spec.split {
                SplitPolicy::Even => hard / n + i64::from((i as i64) < hard % n),
                SplitPolicy::Explicit => spec.namespace_hard.get(ns).and_then(|m| m.get(res)).copied().unwrap_or(0),
            };
            mine.insert(res.clone(), share);
        }
        out.insert(ns.clone(), mine);
    }
    out
}

/// The GPU resources a quota's `hard` does not list (for `unlisted: Zero`): `nvidia.com/gpu`,
/// every MIG resource of the catalog's boards, every resource the fleet supplies (boards
/// outside the catalog report their own profiles), and every GPU resource ([`is_gpu_resource`])
/// a node advertises (time-sliced or MPS ones the device plugin renames, e.g. `nvidia.com/gpu.shared`).
pub fn unlisted_gpu_resources(spec: &TenantGpuQuotaSpec, capacity: &Capacity) -> BTreeSet<String> {
    capacity.gpu_resources().into_iter().filter(|r| !spec.hard.contains_key(r)).collect()
}

/// The GPU resources nodes advertise (`status.allocatable`, as the node cache keeps it:
/// `trimmed::advertised_only`).
pub fn advertised<'a>(nodes: impl IntoIterator<Item = &'a k8s_openapi::api::core::v1::Node>) -> BTreeSet<String> {
    let allocatable = nodes.into_iter().filter_map(|n| n.status.as_ref()?.allocatable.as_ref());
    allocatable.flat_map(|a| a.keys()).filter(|k| is_gpu_resource(k)).cloned().collect()
}

/// Whether an extended resource is a GPU one: `nvidia.com/gpu`, a rename of it by the device
/// plugin's time-slicing or MPS (`nvidia.com/gpu.shared`, `nvidia.com/gpu-<anything>`), or a MIG
/// resource (`nvidia.com/mig-...`, shared ones included). Other `nvidia.com/` resources (Network
/// Operator's `nvidia.com/hostdev`, RDMA and SR-IOV pools) are not GPUs; a rename to any other
/// name is not recognized either. The pod policy `tessera-gpu-pods` applies the same rule.
pub fn is_gpu_resource(name: &str) -> bool {
    name == GPU_RESOURCE
        || ["nvidia.com/gpu.", "nvidia.com/gpu-", "nvidia.com/mig-"].iter().any(|p| name.starts_with(p))
}

/// Every GPU resource a quota can name: `nvidia.com/gpu`, the catalog's MIG resources and the
/// fleet's.
pub fn gpu_resources(supply: &BTreeMap<String, i64>) -> BTreeSet<String> {
    let catalog = catalog::MODELS.iter().flat_map(|m| m.profiles.iter().map(|p| catalog::mig_resource_name(p.name)));
    std::iter::once(GPU_RESOURCE.to_string()).chain(catalog).chain(supply.keys().cloned()).collect()
}

/// Slices (and whole GPUs) the applied layouts supply, per resource name, from the agents' reports.
pub fn fleet_supply(gpunodes: &[GpuNode]) -> BTreeMap<String, i64> {
    Capacity::of(gpunodes).supply
}

/// What the quotas are planned against: the fleet's applied supply per resource name, and the
/// memory of its largest GPU in GB (what one whole GPU stands for). Read from borrowed GpuNodes,
/// so a pass copies no object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Capacity {
    pub supply: BTreeMap<String, i64>,
    pub whole_gpu_gb: i64,
    /// The `nvidia.com/` resources nodes advertise ([`advertised`]): names only, no supply.
    pub advertised: BTreeSet<String>,
}

impl Capacity {
    pub fn of<'a>(gpunodes: impl IntoIterator<Item = &'a GpuNode>) -> Self {
        // Counted by the borrowed profile name first: naming the resource allocates, and a
        // fleet has a few profiles over many GPUs.
        let mut c = Capacity::default();
        let mut slices: crate::FastMap<Option<&str>, i64> = crate::FastMap::default();
        for g in gpunodes.into_iter().flat_map(|gn| gn.status.iter().flat_map(|s| s.gpus.iter())) {
            supplied(g, |profile| *slices.entry(profile).or_default() += 1);
            c.whole_gpu_gb = c.whole_gpu_gb.max((g.memory_mib / 1024).max(0));
        }
        for (profile, n) in slices {
            *c.supply.entry(resource_of(profile)).or_default() += n;
        }
        c
    }

    /// [`gpu_resources`] of the supply, and the resources nodes advertise.
    pub fn gpu_resources(&self) -> BTreeSet<String> {
        let mut all = gpu_resources(&self.supply);
        all.extend(self.advertised.iter().cloned());
        all
    }
}

/// Compute slices and GB that `counts` (resource -> amount) stand for.
pub fn physical(counts: &BTreeMap<String, i64>, whole_gpu_gb: i64) -> (i64, i64) {
    let (mut compute, mut memory) = (0, 0);
    for (res, &n) in counts {
        if res == GPU_RESOURCE {
            compute += n * WHOLE_GPU_COMPUTE_SLICES;
            memory += n * whole_gpu_gb;
        } else if let Some(p) = catalog::profile_of_resource(res).and_then(|p| catalog::parse_profile_name(&p)) {
            compute += n * i64::from(p.compute_slices);
            memory += n * i64::from(p.memory_gb);
        }
    }
    (compute, memory)
}

/// One ResourceQuota to server-side-apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Apply {
    pub namespace: String,
    /// The TenantGpuQuota it enforces (its owner).
    pub quota: String,
    /// The ResourceQuota's name: [`resource_quota_name`], or [`fallback_resource_quota_name`].
    pub name: String,
    /// `requests.<resource>` -> quantity.
    pub hard: BTreeMap<String, String>,
    /// The [`stamp::IN_FORCE_SINCE`] annotation to carry ([`stamp::planned`]): the cached one
    /// unchanged, a new one once the limits are in force, none before.
    pub in_force_since: Option<String>,
    /// The [`stamp::keys::IN_FORCE_KEYS`] annotation to carry ([`stamp::keys::planned`]).
    pub in_force_keys: Option<String>,
}

/// One ResourceQuota to delete: stale or orphaned, and [`written_by`] Tessera.
#[derive(Debug, Clone, PartialEq)]
pub struct Delete {
    pub namespace: String,
    pub name: String,
    /// The quota that wrote it (it may be gone).
    pub quota: String,
}

/// What the controller should make true. It applies before it deletes, so a share that moves
/// from one ResourceQuota name to another is never unenforced in between.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QuotaPlan {
    pub apply: Vec<Apply>,
    pub delete: Vec<Delete>,
    pub statuses: BTreeMap<String, TenantGpuQuotaStatus>,
    /// Per resource the valid quotas ask for: how much more their limits add up to than the
    /// fleet's applied layouts supply (0 when the fleet covers it). For the over-commit alert.
    pub shortfall: BTreeMap<String, i64>,
    /// Tessera's DeviceClasses to apply (while a quota allocates through claims).
    pub device_classes: Vec<claims::ClassApply>,
    /// The claim-class policy's params ([`claims::policy_data`]).
    pub policy: BTreeMap<String, String>,
}

/// What the quotas know of DRA: the cluster's DeviceClasses and the GPU drivers.
#[derive(Debug, Clone, Default)]
pub struct DraInputs {
    pub classes: claims::ClassView,
    pub drivers: crate::dra::GpuDrivers,
    /// Devices tenant namespaces hold through GPU classes that are not Tessera's (the claim cache).
    pub held: holdings::Held,
    /// Unallocated claims of such classes in any namespace, counted at their most
    /// ([`unallocated`]).
    pub pending: Vec<unallocated::Pending>,
    /// Each existing namespace's UID (terminating ones included: [`pod_gate::namespace_facts`]),
    /// for the params' `<ns>.uid` ([`pod_gate::uid_key`]).
    pub namespace_uids: BTreeMap<String, String>,
    /// Each tenant namespace's `<ns>.uid` in the params as last written (the ConfigMap cache),
    /// by namespace: kept for one the namespace cache no longer shows ([`pod_gate::tombstone`]).
    pub params_uids: BTreeMap<String, String>,
    /// Claims asking for admin access to GPU devices, in any namespace ([`unallocated::admin_access`]).
    pub admin_access: Vec<unallocated::AdminAccess>,
    /// Unallocated claims of Tessera's classes ([`unallocated::ours`]): those made before their
    /// namespace's ResourceQuota are listed for the pod policy ([`unallocated::early`]).
    pub ours: Vec<unallocated::Ours>,
    /// The params as the cluster stores them (the ConfigMap's data): a ResourceQuota of an
    /// operator that wrote no stamp takes its `<ns>.since` ([`stamp::planned`]).
    pub stored_params: BTreeMap<String, String>,
    /// Unbound pods asking for GPU extended resources ([`early_pods::unbound_gpu_pod`]): those
    /// made before their namespace's ResourceQuota are listed for the binding policy.
    pub pods: Vec<early_pods::PendingPod>,
    /// The pod cache is not listed (`watch pods` denied): `pods` says nothing, and `<ns>.pods`
    /// are the stored params' ([`early_pods::carried`]).
    pub pods_unknown: bool,
}

/// The quotas (by name) that claim each namespace. A namespace claimed by two or more is a
/// conflict: each writes its own ResourceQuota there, no looser than before, so the stricter
/// holds ([`conflicts`]). The controller decides by this rule, and `validate`
/// reports such a conflict before the quotas are applied.
pub fn namespace_claims<'a>(
    quotas: impl IntoIterator<Item = (&'a str, &'a [String])>,
) -> BTreeMap<&'a str, BTreeSet<&'a str>> {
    let mut claims: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (name, namespaces) in quotas {
        for ns in namespaces {
            claims.entry(ns.as_str()).or_default().insert(name);
        }
    }
    claims
}

/// Plans every quota at once (conflicts and capacity are fleet-wide properties).
pub fn plan_quotas(
    quotas: &[TenantGpuQuota],
    existing_namespaces: &BTreeSet<String>,
    resource_quotas: &[ResourceQuota],
    gpunodes: &[GpuNode],
    now: Time,
) -> QuotaPlan {
    plan_quotas_with(quotas, existing_namespaces, resource_quotas, &Capacity::of(gpunodes), now)
}

/// [`plan_quotas`] against a [`Capacity`] read beforehand. The steps are in [`steps`]: each
/// invalid quota keeps what it enforced, each valid one applies its shares, then what no quota
/// wants any more is deleted.
pub fn plan_quotas_with(
    quotas: &[TenantGpuQuota],
    existing_namespaces: &BTreeSet<String>,
    resource_quotas: &[ResourceQuota],
    capacity: &Capacity,
    now: Time,
) -> QuotaPlan {
    plan_quotas_dra(quotas, existing_namespaces, resource_quotas, capacity, &DraInputs::default(), now)
}

/// [`plan_quotas_with`] in a cluster with DeviceClasses (`dra`): each namespace's ResourceQuota
/// also limits claims ([`claims::claim_keys`]), and the plan lists Tessera's classes and the
/// claim-class policy's params.
pub fn plan_quotas_dra(
    quotas: &[TenantGpuQuota],
    existing_namespaces: &BTreeSet<String>,
    resource_quotas: &[ResourceQuota],
    capacity: &Capacity,
    dra: &DraInputs,
    now: Time,
) -> QuotaPlan {
    let live: Vec<&TenantGpuQuota> = quotas.iter().filter(|q| q.metadata.deletion_timestamp.is_none()).collect();
    let claims =
        namespace_claims(live.iter().map(|q| (q.metadata.name.as_deref().unwrap_or_default(), &q.spec.namespaces[..])));
    // The one rule an automatic plan's `DemandMet` also follows (`coverage`).
    let demand = Demand::every(quotas).total();
    let short = coverage::shortfall(&demand, &capacity.supply);
    let resources = capacity.gpu_resources();
    let mut plan = QuotaPlan::default();
    let (classes, pending) = (&dra.classes, &dra.pending[..]);
    // What the steps count as held: allocated devices, and what unallocated claims may take.
    let held = &unallocated::with_pending(&dra.held, pending);
    let pass = steps::Pass {
        existing_namespaces,
        resource_quotas,
        claims,
        capacity,
        classes,
        held,
        pending,
        demand,
        short,
        stored: &dra.stored_params,
        now,
    };
    let mut wanted = steps::Wanted::new();
    let valid = plan_shares(&pass, &live, dra, &resources, &mut plan, &mut wanted);
    plan_policy(&pass, &live, &valid, dra, &resources, &mut plan);
    plan_deletes(resource_quotas, &wanted, &mut plan);
    plan
}

/// The shares: each invalid quota keeps what it enforced, each valid one applies its own; then
/// Tessera's DeviceClasses and the shortfall, of the valid quotas. Returns the valid quotas.
fn plan_shares<'q>(
    pass: &steps::Pass<'_>,
    live: &[&'q TenantGpuQuota],
    dra: &DraInputs,
    resources: &BTreeSet<String>,
    plan: &mut QuotaPlan,
    wanted: &mut steps::Wanted,
) -> Vec<&'q TenantGpuQuota> {
    let valid: Vec<&TenantGpuQuota> = live.iter().copied().filter(|q| !steps::invalid(pass, q, plan, wanted)).collect();
    // Classes and params from validated quotas only (see `claims::policy_data`).
    plan.device_classes = claims::managed_classes(&valid, resources, &dra.drivers);
    plan.shortfall = pass.demand.keys().map(|r| (r.clone(), pass.short.get(r).copied().unwrap_or(0))).collect();
    for q in &valid {
        steps::plan_quota(pass, q, plan, wanted);
    }
    valid
}

/// The claim-class policy's params, after the shares: the classes' limits where they are in
/// force, the claims and pods made before them, the quotas' names and each tenant namespace's
/// keys.
fn plan_policy(
    pass: &steps::Pass<'_>,
    live: &[&TenantGpuQuota],
    valid: &[&TenantGpuQuota],
    dra: &DraInputs,
    resources: &BTreeSet<String>,
    plan: &mut QuotaPlan,
) {
    let valid_names: BTreeSet<&str> = valid.iter().filter_map(|q| q.metadata.name.as_deref()).collect();
    // After the shares: a class opens only where its planned limit is already enforced, by a
    // ResourceQuota of a namespace the cache shows (terminating included), with no scope.
    let known = |ns: &str| pass.existing_namespaces.contains(ns) || dra.namespace_uids.contains_key(ns);
    // A stamp not yet reached (`stamp::MARGIN_SECS`) gates as none yet.
    let enforcing = stamp::due(pod_gate::enforcing(pass.resource_quotas, known), pass.now.0);
    plan.policy = claims::policy_data(live, &valid_names, &enforcing, &plan.apply, resources, &dra.classes);
    let tenants: Vec<String> =
        plan.policy.keys().filter_map(|k| k.strip_suffix(".quota")).map(str::to_string).collect();
    add_early(&mut plan.policy, live, &tenants, &enforcing, dra);
    plan.policy.extend(pod_gate::zero_resources(valid, &plan.apply));
    let names = live.iter().filter_map(|q| q.metadata.name.as_deref()).collect::<Vec<_>>();
    plan.policy.insert(pod_gate::QUOTAS.to_string(), names.join(" "));
    for ns in &tenants {
        let qs: Vec<&TenantGpuQuota> = live.iter().copied().filter(|q| q.spec.namespaces.contains(ns)).collect();
        let uid = match dra.namespace_uids.get(ns) {
            Some(uid) => Some(uid.as_str()),
            None if known(ns) => None,
            None => pod_gate::tombstone(ns, dra.params_uids.get(ns).map(String::as_str), pass.resource_quotas),
        };
        plan.policy.extend(pod_gate::namespace_keys(ns, &qs, &valid_names, &enforcing, &plan.apply, uid));
    }
}

/// Adds to the params the claims and pods made before the limits they fall under came into
/// force (`enforcing`), within the params' bound on size.
fn add_early(
    policy: &mut BTreeMap<String, String>,
    live: &[&TenantGpuQuota],
    tenants: &[String],
    enforcing: &[ResourceQuota],
    dra: &DraInputs,
) {
    // Keys that came into force after `<ns>.since` (a resource that was unlimited): claims and
    // pods made before their own stamp are early too ([`stamp::keys`]).
    let later = stamp::keys::later_keys(policy, live, enforcing);
    policy.extend(stamp::keys::class_since(&later));
    let early = unallocated::early(&dra.ours, policy);
    let claims =
        unallocated::policy_claims(&dra.pending, &dra.admin_access, &early, tenants.iter().map(String::as_str));
    // `<ns>.pods` share the claims' budget: the ConfigMap's bound stays what it was.
    let budget = unallocated::CLAIMS_BUDGET.saturating_sub(claims.values().map(String::len).sum());
    policy.extend(claims);
    let pods = match dra.pods_unknown {
        true => early_pods::carried::carried(&dra.stored_params, policy, budget),
        false => early_pods::policy_pods(&dra.pods, policy, &later, budget),
    };
    policy.extend(pods);
}

/// The ResourceQuotas no quota wants any more, to delete once their namespace's new limits are
/// in force.
fn plan_deletes(resource_quotas: &[ResourceQuota], wanted: &steps::Wanted, plan: &mut QuotaPlan) {
    steps::sweep_stale(resource_quotas, wanted, &mut plan.delete);
    // A ResourceQuota no quota wants stays while its namespace's new limits are not in force
    // (`_pending`): deleted in the pass that writes its replacement, it left the namespace
    // unlimited until the new one's `status.hard` synced, for any API server whose copy of the
    // params still showed the old quota. Both limiting meanwhile, the stricter holds per key.
    let pending: BTreeSet<String> =
        plan.policy.get(pod_gate::PENDING).map(|p| p.split(' ').map(str::to_string).collect()).unwrap_or_default();
    plan.delete.retain(|d| !pending.contains(&d.namespace));
}

/// Marks a quota's status with this pass's failed writes (API errors in `errors`): `Ready=False`
/// and `Reconciling=True`, reason `WriteFailed`, retried next pass. Without errors it clears
/// `Reconciling`. What was enforced before stays: a share whose write failed keeps its old
/// ResourceQuota (the controller deletes nothing that was to be replaced by a failed write).
pub fn report_write_failures(st: &mut TenantGpuQuotaStatus, errors: &[String], generation: Option<i64>, now: &Time) {
    if errors.is_empty() {
        remove_condition(&mut st.conditions, RECONCILING);
        return;
    }
    let msg = format!("retrying: {}", errors.join("; "));
    let reason = quota_reasons::WRITE_FAILED;
    set_condition(&mut st.conditions, READY, false, reason, &msg, generation, now.clone());
    set_condition(&mut st.conditions, RECONCILING, true, reason, msg, generation, now.clone());
}

/// Owned by this quota: [`written_by`] it, and the controller owner reference has its UID (a
/// quota deleted and created again under the same name owns nothing of the old one's).
fn owned_by(rq: &ResourceQuota, q: &TenantGpuQuota) -> bool {
    let controller_uid =
        rq.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true)).map(|o| &o.uid);
    written_by(rq).is_some()
        && written_by(rq) == q.metadata.name.as_deref()
        && controller_uid == q.metadata.uid.as_ref()
}

/// `status.used` of our ResourceQuota in `ns`, by resource name (without `requests.`); devices
/// of Tessera's classes count for their resource ([`claims::used_by_resource`]).
fn used_in(rqs: &[ResourceQuota], ns: &str, name: &str) -> BTreeMap<String, i64> {
    claims::used_by_resource(used_raw(rqs, ns, name))
}

/// `status.used` of our ResourceQuota in `ns`, keyed as the ResourceQuota is.
fn used_raw(rqs: &[ResourceQuota], ns: &str, name: &str) -> BTreeMap<String, i64> {
    let used = rqs
        .iter()
        .find(|rq| rq.metadata.namespace.as_deref() == Some(ns) && rq.metadata.name.as_deref() == Some(name))
        .and_then(|rq| rq.status.as_ref()?.used.clone())
        .unwrap_or_default();
    used.into_iter().filter_map(|(k, v)| Some((k, quantity::count(&v.0)?))).collect()
}

pub mod claims;
mod conflicts;
pub mod early_pods;
pub mod gates;
pub mod holdings;
pub mod phases;
pub mod pod_gate;
pub mod quantity;
pub mod selection;
pub mod stamp;
mod steps;
pub mod unallocated;

#[cfg(test)]
pub(crate) mod tests;
