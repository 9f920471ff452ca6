//! Quotas over DRA ResourceClaims. A ResourceQuota limits claims per DeviceClass
//! (`<class>.deviceclass.resource.k8s.io/devices`) and cannot add that to an extended resource,
//! so each quota picks a path (`spec.allocation`): the other path, and every GPU-reaching class
//! that is not Tessera's, gets 0 in the tenant's namespaces. The API server's quota admission
//! then does all the counting (race-free); the operator only writes keys. A class created
//! between two passes is refused by the ValidatingAdmissionPolicy in `config/dra`, which reads
//! the allow-lists planned here ([`policy_data`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::DeviceClass;
use tessera_crds::TenantGpuQuota;
use tessera_crds::catalog;
use tessera_crds::quota::{AllocationPath, UnlistedPolicy};
use tessera_crds::validate::{GPU_RESOURCE, is_dns1123_label};

use crate::dra::GpuDrivers;

/// The domain of Tessera's DeviceClass names.
pub const CLASS_SUFFIX: &str = ".tessera.dev";
/// The ResourceQuota key suffix that counts a class's devices.
pub const DEVICES_KEY_SUFFIX: &str = ".deviceclass.resource.k8s.io/devices";
/// The params key listing all of Tessera's classes, and the `<ns>.allowed` value meaning "all".
pub const ALL_OURS: &str = "_tessera";
/// The ConfigMap (in the operator's namespace) the claim-class policy reads as its params.
pub const POLICY_PARAMS: &str = "tessera-claim-classes";

/// Tessera's DeviceClass for a resource: `nvidia.com/gpu` -> `gpu.tessera.dev`,
/// `nvidia.com/mig-1g.10gb.me` -> `mig-1g.10gb.me.tessera.dev` (`+me` -> `.me`, like the
/// device plugin's resource names).
pub fn class_of_resource(res: &str) -> Option<String> {
    if res == GPU_RESOURCE {
        return Some(format!("gpu{CLASS_SUFFIX}"));
    }
    catalog::profile_of_resource(res)?;
    Some(format!("{}{CLASS_SUFFIX}", res.strip_prefix("nvidia.com/")?))
}

/// Inverse of [`class_of_resource`]: the resource a Tessera class name stands for.
pub fn resource_of_class(class: &str) -> Option<String> {
    let stem = class.strip_suffix(CLASS_SUFFIX)?;
    let res = format!("nvidia.com/{stem}");
    (res == GPU_RESOURCE || catalog::profile_of_resource(&res).is_some()).then_some(res)
}

/// The ResourceQuota key counting `class`'s devices.
pub fn devices_key(class: &str) -> String {
    format!("{class}{DEVICES_KEY_SUFFIX}")
}

/// The class a ResourceQuota devices key counts.
pub fn class_of_key(key: &str) -> Option<&str> {
    key.strip_suffix(DEVICES_KEY_SUFFIX)
}

/// A DeviceClass Tessera manages: its name and its one CEL selector.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassApply {
    pub name: String,
    pub expression: String,
}

/// Tessera's class for `res`: the devices of any configured GPU driver whose `type` is `gpu`
/// (whole GPUs) or `mig` with the resource's profile.
pub fn managed_class(res: &str, drivers: &GpuDrivers) -> Option<ClassApply> {
    let name = class_of_resource(res)?;
    let profile = catalog::profile_of_resource(res);
    let each: Vec<String> = drivers
        .iter()
        .map(|d| {
            let a = format!("device.attributes['{d}']");
            match &profile {
                Some(p) => format!("(device.driver == '{d}' && {a}.type == 'mig' && {a}.profile == '{p}')"),
                None => format!("(device.driver == '{d}' && {a}.type == 'gpu')"),
            }
        })
        .collect();
    // No driver configured: a selector matching nothing, never one matching everything.
    let expression = if each.is_empty() { "false".to_string() } else { each.join(" || ") };
    Some(ClassApply { name, expression })
}

/// The driver a CEL selector pins: `Some(X)` when the expression is a conjunction (at the top
/// level: no `||`, `?:`) with a conjunct `device.driver == 'X'`. Anything else is `None`, and so
/// is any text this reader does not follow: comments (`//`), line breaks, triple-quoted strings
/// and prefixed (raw or bytes) strings, each of which can hide an `||` from it.
pub fn pinned_driver(expr: &str) -> Option<String> {
    conjuncts(expr)?.iter().find_map(|p| driver_equals(p.trim()))
}

/// The top-level conjuncts of a CEL expression (see [`pinned_driver`] for what is read), or
/// `None` for an expression that is not a plain conjunction or is not followed.
pub(super) fn conjuncts(expr: &str) -> Option<Vec<String>> {
    if ["//", "\n", "\r", "'''", r#"""""#].iter().any(|s| expr.contains(s)) {
        return None;
    }
    let mut parts = vec![String::new()];
    let (mut depth, mut quote, mut chars) = (0i32, None::<char>, expr.chars().peekable());
    let mut prev = ' ';
    while let Some(c) = chars.next() {
        let before = std::mem::replace(&mut prev, c);
        if quote.is_none() && (c == '\'' || c == '"') && before.is_ascii_alphanumeric() {
            return None; // r'..', R"..", b'..': a prefixed string is not read
        }
        if let Some(q) = quote {
            if c == '\\' {
                return None; // escapes: not read, so not trusted
            }
            if c == q {
                quote = None;
            }
        } else if c == '\'' || c == '"' {
            quote = Some(c);
        } else if c == '(' || c == '[' || c == '{' {
            depth += 1;
        } else if c == ')' || c == ']' || c == '}' {
            depth -= 1;
        } else if depth == 0 && (c == '?' || (c == '|' && chars.peek() == Some(&'|'))) {
            return None;
        } else if depth == 0 && c == '&' && chars.peek() == Some(&'&') {
            chars.next();
            parts.push(String::new());
            continue;
        }
        parts.last_mut()?.push(c);
    }
    if quote.is_some() || depth != 0 {
        return None;
    }
    Some(parts)
}

/// `device.driver == 'X'` -> X ([`compared_literal`]).
fn driver_equals(term: &str) -> Option<String> {
    compared_literal(term, "device.driver")
}

/// `<lhs> == 'X'` (either side, either quote, outer parentheses allowed) -> X.
pub(super) fn compared_literal(term: &str, lhs: &str) -> Option<String> {
    let mut t = term.trim();
    while let Some(inner) = t.strip_prefix('(').and_then(|s| s.strip_suffix(')')) {
        t = inner.trim();
    }
    let (l, r) = t.split_once("==")?;
    let (l, r) = (l.trim(), r.trim());
    let lit = if l == lhs {
        r
    } else if r == lhs {
        l
    } else {
        return None;
    };
    let q = lit.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let inner = lit.strip_prefix(q)?.strip_suffix(q)?;
    (!inner.contains(['\'', '"', '\\'])).then(|| inner.to_string())
}

/// Whether `class` can match devices of a GPU driver: true unless one of its selectors is a
/// conjunction pinning another driver (an upper bound: what cannot be read reaches GPUs).
/// NVIDIA's driver always counts, even when `--gpu-dra-drivers` leaves it out: its devices are
/// GPUs whatever the flag says, so a class of them is never open.
pub fn reaches_gpus(class: &DeviceClass, drivers: &GpuDrivers) -> bool {
    let selectors = class.spec.as_ref().and_then(|s| s.selectors.as_ref());
    let gpu_driver = |d: &str| d == crate::dra::NVIDIA_GPU_DRIVER || drivers.contains(d);
    !selectors
        .into_iter()
        .flatten()
        .any(|s| s.cel.as_ref().and_then(|c| pinned_driver(&c.expression)).is_some_and(|d| !gpu_driver(&d)))
}

/// The cluster's DeviceClasses as quotas see them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassView {
    /// GPU-reaching classes (Tessera's among them).
    pub reaching: BTreeSet<String>,
    /// Classes proven not to reach GPUs: open in every namespace.
    pub open: BTreeSet<String>,
    /// `spec.extendedResourceName` of GPU-reaching classes, other than Tessera's resources.
    pub extended: BTreeSet<String>,
    /// GPU-reaching classes that match whole GPUs only (a selector pins a GPU driver and its
    /// `type` to `gpu`): an unallocated claim of one can take only `nvidia.com/gpu`.
    pub whole_gpu: BTreeSet<String>,
    /// Classes named as Tessera's whose spec is not what the operator writes (made by someone
    /// else first, with a broader selector, and our apply failed): held at 0, never open.
    pub mismatched: BTreeSet<String>,
}

/// Whether `have` is the class `want` describes: its name and its one selector (the writer's
/// test too, which also wants our label).
pub fn spec_matches(have: &DeviceClass, want: &ClassApply) -> bool {
    let exprs: Vec<&str> = have
        .spec
        .iter()
        .flat_map(|s| s.selectors.iter().flatten())
        .map(|s| s.cel.as_ref().map_or("", |c| c.expression.as_str()))
        .collect();
    have.metadata.name.as_deref() == Some(&want.name) && exprs == [want.expression.as_str()]
}

impl ClassView {
    pub fn of<'a>(classes: impl IntoIterator<Item = &'a DeviceClass>, drivers: &GpuDrivers) -> Self {
        let mut v = ClassView::default();
        for c in classes {
            let name = c.metadata.name.clone().unwrap_or_default();
            if !reaches_gpus(c, drivers) {
                v.open.insert(name);
                continue;
            }
            let ext = c.spec.as_ref().and_then(|s| s.extended_resource_name.clone());
            if let Some(ext) = ext.filter(|e| e != GPU_RESOURCE && catalog::profile_of_resource(e).is_none()) {
                v.extended.insert(ext);
            }
            let want = resource_of_class(&name).and_then(|r| managed_class(&r, drivers));
            if want.is_some_and(|w| !spec_matches(c, &w)) {
                v.mismatched.insert(name.clone());
            }
            if super::unallocated::pins_whole_gpus(c, drivers) {
                v.whole_gpu.insert(name.clone());
            }
            v.reaching.insert(name);
        }
        v
    }
}

/// The claim keys of one namespace's ResourceQuota, added to `hard` (`requests.<res>` keys
/// already there). `share` is the namespace's share of `hard`; `unlisted` what `unlisted: Zero`
/// holds at 0 (empty when unlimited); `unlimited` the resources `unlisted: Unlimited` leaves
/// unlimited (empty under `Zero`). Only the classes of these resources are exempt from the 0 of
/// GPU-reaching classes: a class merely named like ours (a made-up profile) is held at 0.
pub fn claim_keys(
    mode: AllocationPath,
    share: &BTreeMap<String, i64>,
    unlisted: &BTreeSet<String>,
    unlimited: &BTreeSet<String>,
    view: &ClassView,
    hard: &mut BTreeMap<String, String>,
) {
    for ext in &view.extended {
        hard.insert(format!("requests.{ext}"), "0".into());
    }
    match mode {
        AllocationPath::ExtendedResources => {
            // The share's classes whether they exist or not: a class of ours deleted and made
            // again (by anyone) is closed from its first claim.
            let share_classes = share.keys().filter_map(|r| class_of_resource(r));
            for c in view.reaching.iter().cloned().chain(share_classes) {
                hard.insert(devices_key(&c), "0".into());
            }
        }
        AllocationPath::ResourceClaims => {
            let exempt: BTreeSet<String> =
                share.keys().chain(unlisted).chain(unlimited).filter_map(|r| class_of_resource(r)).collect();
            let exempt: BTreeSet<&String> = exempt.iter().filter(|c| !view.mismatched.contains(*c)).collect();
            for c in view.reaching.iter().filter(|c| !exempt.contains(c)) {
                hard.insert(devices_key(c), "0".into());
            }
            let limits = share.iter().map(|(r, n)| (r, *n)).chain(unlisted.iter().map(|r| (r, 0)));
            for (res, n) in limits {
                if let Some(class) = class_of_resource(res) {
                    let n = if view.mismatched.contains(&class) { 0 } else { n };
                    hard.insert(devices_key(&class), n.to_string());
                    hard.insert(format!("requests.{res}"), "0".into());
                }
            }
        }
    }
}

/// Adds what a ResourceQuota's `status.used` counts through Tessera's classes to the resources
/// they stand for (both paths of one resource summed). `used` is keyed as the ResourceQuota is.
pub fn used_by_resource(used: impl IntoIterator<Item = (String, i64)>) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for (k, n) in used {
        let res =
            k.strip_prefix("requests.").map(str::to_string).or_else(|| class_of_key(&k).and_then(resource_of_class));
        if let Some(res) = res {
            *out.entry(res).or_default() += n;
        }
    }
    out
}

/// The classes Tessera manages while any quota allocates through claims: one per resource of
/// `resources` (whole GPUs, the catalog's and the fleet's profiles). They are never deleted:
/// claims may be using them.
pub fn managed_classes(
    quotas: &[&TenantGpuQuota],
    resources: &BTreeSet<String>,
    drivers: &GpuDrivers,
) -> Vec<ClassApply> {
    if !quotas.iter().any(|q| q.spec.allocation == AllocationPath::ResourceClaims) {
        return Vec::new();
    }
    resources.iter().filter_map(|r| managed_class(r, drivers)).collect()
}

/// The params of the claim-class policy: `_open` (classes proven not to reach GPUs),
/// `_reaching` (those that do), `_tessera` (all of Tessera's), and per tenant namespace
/// `<ns>.quota` (who claims it), `<ns>.allowed` (`_tessera` when all of ours) and `<ns>.hint`
/// (what to use instead). Values are space-separated. `_pending` (read by the pod policy
/// `tessera-gpu-pods`) lists the tenant namespaces not yet enforced ([`super::pod_gate`]).
///
/// A class of Tessera's is allowed in a namespace only where one valid quota alone claims it,
/// allocates through claims, and its ResourceQuota there as cached (so: written) already limits
/// that class and carries its in-force stamp ([`allowed_classes`], [`super::stamp`]). The params
/// are written before the ResourceQuotas, so they close at once and open only a pass after the
/// stamp is written: a failed write, or a process that dies in between, leaves a class closed,
/// never unlimited. An invalid or conflicted quota closes its namespaces. `quotas` are the live
/// ones; `valid` names those that passed validation.
pub fn policy_data(
    quotas: &[&TenantGpuQuota],
    valid: &BTreeSet<&str>,
    rqs: &[ResourceQuota],
    applies: &[super::Apply],
    resources: &BTreeSet<String>,
    view: &ClassView,
) -> BTreeMap<String, String> {
    let join = |s: &mut dyn Iterator<Item = String>| s.collect::<Vec<_>>().join(" ");
    let mut data = BTreeMap::new();
    data.insert("_open".to_string(), join(&mut view.open.iter().cloned()));
    data.insert("_reaching".to_string(), join(&mut view.reaching.iter().cloned()));
    // Every class of ours, once: a namespace where all are open says `_tessera` (no class name
    // starts with `_`), which keeps the ConfigMap far under its 1 MiB with thousands of tenants.
    let all: BTreeSet<String> = resources.iter().filter_map(|r| class_of_resource(r)).collect();
    data.insert(ALL_OURS.to_string(), join(&mut all.iter().cloned()));
    let mut by_ns: BTreeMap<&str, Vec<&TenantGpuQuota>> = BTreeMap::new();
    for q in quotas {
        // An invalid quota may list a name that is no valid ConfigMap key: it would fail the
        // whole write, for every tenant. No such namespace can exist, so nothing is lost.
        for ns in q.spec.namespaces.iter().filter(|ns| is_dns1123_label(ns)) {
            by_ns.entry(ns.as_str()).or_default().push(q);
        }
    }
    let mut pending = Vec::new();
    for (ns, qs) in by_ns {
        if !super::pod_gate::enforced(ns, &qs, rqs, applies) {
            pending.push(ns.to_string());
        }
        let names = join(&mut qs.iter().map(|q| q.metadata.name.clone().unwrap_or_default()));
        let q = qs[0];
        let name = q.metadata.name.as_deref().unwrap_or_default();
        let (allowed, hint) = if qs.len() > 1 {
            (String::new(), "the namespace is claimed by more than one TenantGpuQuota (see their Conflict condition); no GPU class is open until one lets go".to_string())
        } else if !valid.contains(name) {
            (
                String::new(),
                format!("TenantGpuQuota {name} is invalid (see its status); no GPU class is open until it is fixed"),
            )
        } else if q.spec.allocation == AllocationPath::ExtendedResources {
            // Also what a pod of a KEP-5004 class hears: the scheduler's claim for its extended
            // resource is refused here too, only a device plugin's node serves it.
            (String::new(), "request nvidia.com/gpu or nvidia.com/mig-<profile> resources instead (spec.allocation: ExtendedResources); only nodes whose device plugin advertises them serve them here, not a DeviceClass's extendedResourceName".to_string())
        } else {
            let allowed = allowed_classes(q, ns, rqs, applies, resources, view);
            let granted: Vec<String> =
                q.spec.hard.iter().filter(|(_, n)| **n > 0).filter_map(|(r, _)| class_of_resource(r)).collect();
            let unlimited = q.spec.unlisted == UnlistedPolicy::Unlimited;
            let hint = if granted.is_empty() && !unlimited {
                "this quota grants no GPU devices".to_string()
            } else if granted.iter().any(|c| !allowed.contains(c)) {
                format!(
                    "the tenant's ResourceQuota is still being written; retry shortly (use {})",
                    granted.join(" or ")
                )
            } else if granted.is_empty() {
                "use a class named <mig-profile|gpu>.tessera.dev".to_string()
            } else {
                format!("use {}", granted.join(" or "))
            };
            let listed = if !allowed.is_empty() && allowed == all {
                ALL_OURS.to_string()
            } else {
                join(&mut allowed.into_iter())
            };
            (listed, hint)
        };
        data.insert(format!("{ns}.quota"), names);
        data.insert(format!("{ns}.allowed"), allowed);
        data.insert(format!("{ns}.hint"), hint);
        if let Some(since) = since(qs.as_slice(), ns, rqs) {
            data.insert(format!("{ns}.since"), since);
        }
    }
    data.insert(super::pod_gate::PENDING.to_string(), pending.join(" "));
    data
}

/// `<ns>.since`: from when the quota admission counts `ns`'s claims, the earliest stamp
/// ([`super::stamp`]: a time its limits were already in `status.hard`) of its only quota's
/// ResourceQuotas there (RFC3339). The claim policy refuses allocating a claim made no later
/// (or, with no key, any claim) in every class not in `_open`, Tessera's too: the ResourceQuota
/// counts claims from their creation, so one made before its `status.hard` was never checked.
/// None until a stamp is cached (fails closed). Claimed by more than one quota (every class is
/// closed there anyway): the latest of each one's earliest stamp, once each has one, so
/// `<ns>.pods` lists what was made before all of them counted it (none, pods went unlisted).
fn since(qs: &[&TenantGpuQuota], ns: &str, rqs: &[ResourceQuota]) -> Option<String> {
    let earliest = |q: &TenantGpuQuota| {
        rqs.iter()
            .filter(|rq| rq.metadata.namespace.as_deref() == Some(ns) && super::owned_by(rq, q))
            .filter_map(|rq| super::stamp::stamp_of(rq).map(|(_, t)| t))
            .min()
    };
    let each: Option<Vec<_>> = qs.iter().map(|q| earliest(q)).collect();
    each?.into_iter().max().map(super::stamp::format)
}

/// Tessera's classes a valid claims quota `q` opens in `ns`: those whose key this pass plans
/// (`applies`) and its ResourceQuota there already enforces at no more than planned. The API
/// server's quota admission enforces `status.hard` (copied from `spec.hard` by the controller
/// manager later), so a key only in `spec.hard` limits nothing yet. With `unlisted: Unlimited`
/// the classes of resources its `hard` does not list open too (unlimited by the spec itself).
/// None before that ResourceQuota carries its stamp as cached ([`super::stamp`]).
fn allowed_classes(
    q: &TenantGpuQuota,
    ns: &str,
    rqs: &[ResourceQuota],
    applies: &[super::Apply],
    resources: &BTreeSet<String>,
    view: &ClassView,
) -> BTreeSet<String> {
    let name = q.metadata.name.as_deref().unwrap_or_default();
    let planned = applies.iter().find(|a| a.namespace == ns && a.quota == name);
    let rq = planned.and_then(|a| {
        rqs.iter().find(|rq| {
            rq.metadata.namespace.as_deref() == Some(ns)
                && rq.metadata.name.as_deref() == Some(a.name.as_str())
                && super::owned_by(rq, q)
        })
    });
    // Nothing opens before the stamp is cached: a claim admitted through an open class is then
    // never earlier than `<ns>.since` ([`since`]).
    let (Some(a), Some(rq)) = (planned, rq.filter(|rq| super::stamp::stamp_of(rq).is_some())) else {
        return BTreeSet::new();
    };
    let spec = rq.spec.as_ref().and_then(|s| s.hard.as_ref());
    let status = rq.status.as_ref().and_then(|s| s.hard.as_ref());
    let mut out: BTreeSet<String> = a
        .hard
        .iter()
        .filter_map(|(k, want)| {
            let class = class_of_key(k).filter(|c| resource_of_class(c).is_some())?;
            // Its own stamp cached: a claim admitted through it is never earlier than its
            // `<ns>.since.<class>` ([`super::stamp::keys`]).
            super::stamp::keys::key_stamp(rq, k)?;
            let have = super::phases::in_force(spec, status, k)?;
            (have <= super::quantity::count(want)?).then(|| class.to_string())
        })
        .collect();
    if q.spec.unlisted == UnlistedPolicy::Unlimited {
        out.extend(resources.iter().filter(|r| !q.spec.hard.contains_key(*r)).filter_map(|r| class_of_resource(r)));
    }
    out.retain(|c| !view.mismatched.contains(c));
    out
}

/// After a switch of `spec.allocation` the other path's objects stay (pods holding the extended
/// resource, allocated claims): the new path gets the share less what the other path still
/// holds in this namespace, never below 0. The other path's limit is 0, so its usage only falls
/// and each pass gives back what it freed. What it holds is known only from the ResourceQuota's
/// `status` (`rq`) once `status.hard` enforces the old key at 0 and `status.used` counts it; until
/// then (a new ResourceQuota, a status not synced yet) the new path gets 0. Only where this plan
/// closes the old path (its key in `hard`). Returns a note per reduced resource, for the status.
pub fn reduce_for_other_path(
    mode: AllocationPath,
    share: &BTreeMap<String, i64>,
    rq: Option<&k8s_openapi::api::core::v1::ResourceQuotaStatus>,
    view: &ClassView,
    hard: &mut BTreeMap<String, String>,
) -> Vec<String> {
    let mut notes = Vec::new();
    for (res, &n) in share {
        let Some(class) = class_of_resource(res) else { continue };
        let (new_key, old_key, old_path) = match mode {
            AllocationPath::ResourceClaims => (devices_key(&class), format!("requests.{res}"), "extended resources"),
            AllocationPath::ExtendedResources => (format!("requests.{res}"), devices_key(&class), "claims"),
        };
        if !hard.contains_key(&new_key) || !hard.contains_key(&old_key) {
            continue;
        }
        let num = |m: &Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            super::quantity::count(&m.as_ref()?.get(&old_key)?.0)
        };
        let held = rq.filter(|s| num(&s.hard) == Some(0)).and_then(|s| num(&s.used));
        // Back on extended resources with no class of ours to claim through and no claims
        // limit ever enforced here: the claims path holds nothing (a plain quota's first pass).
        let never_open = mode == AllocationPath::ExtendedResources
            && !view.reaching.contains(&class)
            && !rq.and_then(|s| s.hard.as_ref()).is_some_and(|h| h.contains_key(&old_key));
        let held = held.or(never_open.then_some(0));
        match held {
            Some(0) => {}
            Some(held) => {
                hard.insert(new_key, (n - held).max(0).to_string());
                notes.push(format!("{res}: share {n} reduced while the other path ({old_path}) still holds {held}"));
            }
            None if n > 0 => {
                hard.insert(new_key, "0".into());
                notes.push(format!(
                    "{res}: share {n} held at 0 until the ResourceQuota's status shows what the other path \
                     ({old_path}) holds"
                ));
            }
            None => {}
        }
    }
    notes
}

/// The status condition on every quota that says whether the claim-class policy reads the
/// params the operator writes.
pub const CLAIM_POLICY: &str = "ClaimPolicyBound";

/// What is wrong with the claim-class policy's binding (`tessera-claim-classes`), read by the
/// operator whose params live in `namespace`: `None` when its `paramRef` names our ConfigMap
/// there. With `parameterNotFoundAction: Allow` a binding pointing elsewhere finds no params
/// and allows every class, silently; `binding` is `None` when the binding does not exist.
pub fn binding_problem(
    binding: Option<&k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>,
    namespace: &str,
) -> Option<String> {
    let Some(b) = binding else {
        return Some(format!(
            "ValidatingAdmissionPolicyBinding {POLICY_PARAMS} not found: claims of a DeviceClass created between two \
             quota passes are not refused in tenant namespaces (install config/rbac/claim-classes.yaml or the chart)"
        ));
    };
    let r = b.spec.param_ref.as_ref();
    let (name, ns) = (r.and_then(|r| r.name.as_deref()), r.and_then(|r| r.namespace.as_deref()));
    (name != Some(POLICY_PARAMS) || ns != Some(namespace)).then(|| {
        format!(
            "ValidatingAdmissionPolicyBinding {POLICY_PARAMS} reads params {}/{} but the operator writes \
             {namespace}/{POLICY_PARAMS}: the policy finds no params and allows every class \
             (parameterNotFoundAction: Allow); set its spec.paramRef.namespace to {namespace}",
            ns.unwrap_or("<unset>"),
            name.unwrap_or("<unset>")
        )
    })
}

#[cfg(test)]
mod tests;
