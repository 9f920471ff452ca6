use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ResourceQuota;
use serde_json::json;
use tessera_crds::TenantGpuQuota;

use super::*;
use crate::quota::claims::managed_class;
use crate::quota::{Capacity, DraInputs, QuotaPlan, plan_quotas_dra, quota_label_value, resource_quota_name};

/// NVIDIA's whole-GPU class, as its DRA driver installs it.
const NVIDIA_GPU_CLASS: &str = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'";
const GPU_KEY: &str = "gpu.tessera.dev.deviceclass.resource.k8s.io/devices";
const GPU_REQ: &str = "requests.nvidia.com/gpu";

fn class(name: &str, expr: &str) -> DeviceClass {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}))
        .unwrap()
}

fn view() -> ClassView {
    let drivers = GpuDrivers::default();
    let ours = managed_class(GPU_RESOURCE, &drivers).unwrap();
    let classes = [
        class("gpu.nvidia.com", NVIDIA_GPU_CLASS),
        class(
            "mig.nvidia.com",
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
        ),
        class("fpga", "device.driver == 'fpga.example.com'"),
        class(&ours.name, &ours.expression),
    ];
    ClassView::of(&classes, &drivers)
}

fn claim(ns: &str, name: &str, requests: serde_json::Value, allocated: bool) -> ResourceClaim {
    let status = if allocated { json!({"allocation": {"devices": {"results": []}}}) } else { json!({}) };
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": requests}}, "status": status}))
    .unwrap()
}

fn pending(ns: &str, name: &str, class: &str, resource: Option<&str>, count: i64) -> Pending {
    let (namespace, name, class) = (ns.to_string(), name.to_string(), class.to_string());
    Pending { namespace, name, class, resource: resource.map(str::to_string), count }
}

#[test]
fn only_a_gpu_driver_pinned_to_type_gpu_is_a_whole_gpu_class() {
    let d = GpuDrivers::default();
    for (expr, want) in [
        (NVIDIA_GPU_CLASS, true),
        ("(device.attributes[\"gpu.nvidia.com\"].type == \"gpu\") && device.driver == \"gpu.nvidia.com\"", true),
        ("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'", false),
        ("device.driver == 'gpu.nvidia.com'", false),
        ("device.attributes['gpu.nvidia.com'].type == 'gpu'", false), // no driver pinned
        ("device.driver == 'x.example.com' && device.attributes['x.example.com'].type == 'gpu'", false),
        ("device.driver == 'gpu.nvidia.com' && device.attributes['other.com'].type == 'gpu'", false),
        (&format!("{NVIDIA_GPU_CLASS} || true"), false),
    ] {
        assert_eq!(pins_whole_gpus(&class("c", expr), &d), want, "{expr}");
    }
}

/// A claim made before its namespace joined, never allocated, counts at its most against what
/// its class reaches, never 0.
#[test]
fn unallocated_claims_count_at_their_most_against_what_their_class_reaches() {
    let claims = [
        claim(
            "x",
            "stash",
            json!([{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com",
            "allocationMode": "All"}}]),
            false,
        ),
        claim(
            "x",
            "eight",
            json!([{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com", "count": 8}},
            {"name": "a", "exactly": {"deviceClassName": "mig.nvidia.com", "adminAccess": true, "count": 4}}]),
            false,
        ),
        claim(
            "x",
            "either",
            json!([{"name": "f", "firstAvailable": [
            {"name": "t", "deviceClassName": "gpu.tessera.dev", "count": 9},
            {"name": "g", "deviceClassName": "gpu.nvidia.com", "count": 2},
            {"name": "m", "deviceClassName": "mig.nvidia.com", "count": 3}]}]),
            false,
        ),
        claim("y", "unknown", json!([{"name": "r", "exactly": {"deviceClassName": "made-up"}}]), false),
        // Not counted: allocated (held_elsewhere counts it), Tessera's class, a class of no GPU.
        claim("x", "running", json!([{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]), true),
        claim("x", "ours", json!([{"name": "r", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]), false),
        claim("x", "fpga", json!([{"name": "r", "exactly": {"deviceClassName": "fpga", "count": 5}}]), false),
    ];
    assert_eq!(
        unallocated(&claims, &view()),
        vec![
            pending("x", "stash", "gpu.nvidia.com", Some(GPU_RESOURCE), MAX_DEVICES_PER_CLAIM),
            pending("x", "eight", "mig.nvidia.com", None, 8),
            pending("x", "either", "gpu.nvidia.com|mig.nvidia.com", None, 3),
            pending("y", "unknown", "made-up", None, 1),
        ]
    );
}

fn quota(spec: serde_json::Value) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": "team-a", "generation": 1, "uid": "uid-team-a"}, "spec": spec}))
    .unwrap()
}

/// Our ResourceQuota in `ns`, synced, holding nothing through its own keys.
fn synced(ns: &str, keys: &[(&str, i64)]) -> ResourceQuota {
    let hard: serde_json::Map<_, _> = keys.iter().map(|(k, v)| (k.to_string(), json!(v.to_string()))).collect();
    let used: serde_json::Map<_, _> = keys.iter().map(|(k, _)| (k.to_string(), json!("0"))).collect();
    crate::quota::stamp::stamped(
        serde_json::from_value(json!({"metadata": {"name": resource_quota_name("team-a"), "namespace": ns,
            "labels": {"tessera.dev/quota": quota_label_value("team-a")},
            "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": "team-a",
                                 "uid": "uid-team-a", "controller": true}]},
            "spec": {"hard": hard}, "status": {"hard": hard, "used": used}}))
        .unwrap(),
    )
}

fn plan(q: &TenantGpuQuota, rqs: &[ResourceQuota], claims: &[ResourceClaim]) -> QuotaPlan {
    let classes = view();
    let pending = unallocated(claims, &classes);
    let admin_access = admin_access(claims, &classes);
    let dra = DraInputs { classes, pending, admin_access, ..Default::default() };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap());
    let nss: BTreeSet<String> = ["x", "y"].iter().map(|s| s.to_string()).collect();
    plan_quotas_dra(std::slice::from_ref(q), &nss, rqs, &Capacity::default(), &dra, now)
}

fn limit(p: &QuotaPlan, ns: &str, key: &str) -> String {
    let a = p.apply.iter().find(|a| a.namespace == ns).unwrap_or_else(|| panic!("no ResourceQuota in {ns}"));
    a.hard.get(key).cloned().unwrap_or_else(|| panic!("no {key} in {:?}", a.hard))
}

/// `x` joins `team-a` (nvidia.com/gpu: 2) holding ResourceClaim `stash` (`gpu.nvidia.com`,
/// `All`), unallocated. It counts at its most, 32 GPUs in `x` (counted as 0, a pod using it
/// would get every GPU of a node, and again after each pod): no share is left there or in `y`,
/// status shows the usage, and `Ready` names the claim and says what to do. Deleted, both
/// shares come back.
#[test]
fn a_claim_made_before_the_namespace_joined_counts_at_its_most_until_deleted() {
    let stash = claim(
        "x",
        "stash",
        json!([{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com",
        "allocationMode": "All"}}]),
        false,
    );
    for (mode, key) in [("ResourceClaims", GPU_KEY), ("ExtendedResources", GPU_REQ)] {
        let q = quota(json!({"namespaces": ["x", "y"], "hard": {"nvidia.com/gpu": 2}, "allocation": mode}));
        let other = if key == GPU_KEY { GPU_REQ } else { GPU_KEY };
        let rqs = [synced("x", &[(key, 1), (other, 0)]), synced("y", &[(key, 1), (other, 0)])];
        let p = plan(&q, &rqs, std::slice::from_ref(&stash));
        assert_eq!((limit(&p, "x", key), limit(&p, "y", key)), ("0".into(), "0".into()), "{mode}");
        let st = &p.statuses["team-a"];
        assert_eq!(st.resources[0].used, MAX_DEVICES_PER_CLAIM, "{mode}: {:?}", st.resources);
        let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(
            ready.message.contains("ResourceClaim x/stash (class gpu.nvidia.com)")
                && ready.message.contains("up to 32 device(s) of nvidia.com/gpu")
                && ready.message.contains("delete it"),
            "{mode}: {}",
            ready.message
        );
        let gone = plan(&q, &rqs, &[]);
        assert_eq!((limit(&gone, "x", key), limit(&gone, "y", key)), ("1".into(), "1".into()), "{mode}");
    }
}

/// A claim of a class that may reach any GPU resource counts against every resource of the
/// share (an upper bound), and only in its own namespace's notes.
#[test]
fn a_claim_of_a_class_of_any_gpu_counts_against_every_resource_of_the_share() {
    let mig = "nvidia.com/mig-1g.10gb";
    let q = quota(json!({"namespaces": ["x", "y"], "hard": {"nvidia.com/gpu": 4, mig: 4},
        "allocation": "ExtendedResources"}));
    let mig_req = format!("requests.{mig}");
    let mig_key = "mig-1g.10gb.tessera.dev.deviceclass.resource.k8s.io/devices";
    let keys = [(GPU_REQ, 2), (mig_req.as_str(), 2), (GPU_KEY, 0), (mig_key, 0)];
    let rqs = [synced("x", &keys), synced("y", &keys)];
    let one = claim(
        "y",
        "one",
        json!([{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com",
        "count": 1}}]),
        false,
    );
    let p = plan(&q, &rqs, std::slice::from_ref(&one));
    assert_eq!((limit(&p, "y", GPU_REQ), limit(&p, "y", &mig_req)), ("1".into(), "1".into()));
    assert_eq!((limit(&p, "x", GPU_REQ), limit(&p, "x", &mig_req)), ("2".into(), "2".into()));
    let notes = notes(&unallocated([&one], &view()), ["x"]);
    assert!(notes.is_empty(), "{notes:?}");
}

/// Counting `stash` is not enough: a pod naming it
/// (`spec.resourceClaims[].resourceClaimName: stash`) is allocated every GPU of a node with no
/// quota check. The params list it for the pod policy (`x.claims`), only in tenant
/// namespaces, and not once it is allocated or deleted.
#[test]
fn a_claim_made_before_the_namespace_joined_is_listed_for_the_pod_policy() {
    let stash = claim(
        "x",
        "stash",
        json!([{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}},
               {"name": "s", "exactly": {"deviceClassName": "mig.nvidia.com"}}]),
        false,
    );
    let other =
        claim("z", "elsewhere", json!([{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]), false);
    let q = quota(json!({"namespaces": ["x", "y"], "hard": {"nvidia.com/gpu": 2}}));
    let rqs = [synced("x", &[(GPU_REQ, 1)]), synced("y", &[(GPU_REQ, 1)])];
    let p = plan(&q, &rqs, &[stash, other]);
    assert_eq!(p.policy.get("x.claims").map(String::as_str), Some("stash:gpu.nvidia.com"), "{:?}", p.policy);
    assert!(!p.policy.contains_key("y.claims") && !p.policy.contains_key("z.claims"), "{:?}", p.policy);
    let allocated = claim("x", "stash", json!([{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]), true);
    assert!(!plan(&q, &rqs, &[allocated]).policy.contains_key("x.claims"));
    assert!(!plan(&q, &rqs, &[]).policy.contains_key("x.claims"));
}

/// `<ns>.claims` is capped: uncapped, thousands of leftover claims would pass the ConfigMap's
/// 1 MiB and fail every params write, for every tenant. Past [`CLAIMS_CAP`] in a namespace,
/// or [`CLAIMS_BUDGET`] over all, the value is [`ALL_CLAIMS`] (the pod policy then refuses
/// every pod naming a claim there); the rest stay listed.
#[test]
fn leftover_claims_past_the_cap_are_listed_as_all() {
    let many: Vec<Pending> =
        (0..5000).map(|i| pending("x", &format!("leftover-{i:05}"), "gpu.nvidia.com", None, 1)).collect();
    let few = [pending("y", "stash", "gpu.nvidia.com", None, 1)];
    let all: Vec<Pending> = many.iter().chain(&few).cloned().collect();
    let listed = policy_claims(&all, &[], &[], ["x", "y"]);
    assert_eq!(listed["x.claims"], ALL_CLAIMS);
    assert_eq!(listed["y.claims"], "stash:gpu.nvidia.com");
    let at_cap: Vec<Pending> =
        (0..CLAIMS_CAP / 30).map(|i| pending("x", &format!("c-{i:05}"), "gpu.nvidia.com", None, 1)).collect();
    assert!(
        policy_claims(&at_cap, &[], &[], ["x"])["x.claims"].starts_with("c-00000:gpu.nvidia.com "),
        "under the cap: listed"
    );
    // Many namespaces each just under the cap: the total stays within the budget.
    let names: Vec<String> = (0..1000).map(|n| format!("ns-{n:04}")).collect();
    let spread: Vec<Pending> = names
        .iter()
        .flat_map(|ns| (0..30).map(move |i| pending(ns, &format!("c-{i:05}"), "gpu.nvidia.com", None, 1)))
        .collect();
    let listed = policy_claims(&spread, &[], &[], names.iter().map(String::as_str));
    let total: usize = listed.values().map(String::len).sum();
    assert!(total <= CLAIMS_BUDGET + ALL_CLAIMS.len() * names.len(), "{total}");
    assert_eq!(listed["ns-0999.claims"], ALL_CLAIMS, "past the budget");
    assert_ne!(listed["ns-0000.claims"], ALL_CLAIMS, "within it");
}

/// `watch` asks for admin access to `mig.nvidia.com` devices, made while `x`
/// carried `resource.kubernetes.io/admin-access` (before it joined `team-a`). It takes no device,
/// so it counts toward nothing, but a pod naming it sees GPUs other tenants hold. It is listed
/// for the pod policy (`x.claims`, its class marked `,adminAccess`) whether allocated or not;
/// not an admin request of a class proven off GPUs, nor one outside tenant namespaces.
#[test]
fn an_admin_access_claim_of_a_gpu_class_is_listed_for_the_pod_policy_and_counts_toward_nothing() {
    let admin = |ns: &str, name: &str, class: &str, allocated: bool| {
        claim(ns, name, json!([{"name": "r", "exactly": {"deviceClassName": class, "adminAccess": true}}]), allocated)
    };
    let q = quota(json!({"namespaces": ["x", "y"], "hard": {"nvidia.com/gpu": 2}}));
    let rqs = [synced("x", &[(GPU_REQ, 1)]), synced("y", &[(GPU_REQ, 1)])];
    let ours = managed_class(GPU_RESOURCE, &GpuDrivers::default()).unwrap().name;
    for allocated in [false, true] {
        let claims = [
            admin("x", "watch", "mig.nvidia.com", allocated),
            admin("x", "ours", &ours, allocated),
            admin("x", "card", "fpga", allocated),
            admin("z", "elsewhere", "gpu.nvidia.com", allocated),
        ];
        let p = plan(&q, &rqs, &claims);
        assert_eq!(
            p.policy.get("x.claims").map(String::as_str),
            Some(format!("ours:{ours},adminAccess watch:mig.nvidia.com,adminAccess").as_str()),
            "allocated: {allocated}: {:?}",
            p.policy
        );
        assert!(!p.policy.contains_key("z.claims"), "{:?}", p.policy);
        // Counted toward nothing: every ResourceQuota is as without the claims.
        assert_eq!(p.apply, plan(&q, &rqs, &[]).apply, "allocated: {allocated}");
    }
    // A claim both unallocated (counted) and with an admin request is listed once, as counted.
    let both = claim(
        "x",
        "both",
        json!([{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
               {"name": "a", "exactly": {"deviceClassName": "mig.nvidia.com", "adminAccess": true}}]),
        false,
    );
    let p = plan(&q, &rqs, &[both]);
    assert_eq!(p.policy.get("x.claims").map(String::as_str), Some("both:gpu.nvidia.com"));
}

/// Claim `hoard` of Tessera's class (`All`) made in `x` before its ResourceQuota
/// (before `x` joined): the claim policy refuses its allocation, and the params list it in
/// `x.claims` so a new pod naming it is refused too. One made after the ResourceQuota is
/// counted by it and not listed; one of another namespace with no `.since` is not listed either.
#[test]
fn a_claim_of_tessera_s_class_made_before_the_resource_quota_is_listed_for_the_pod_policy() {
    let at = |ns: &str, name: &str, t: &str, class: &str| {
        let mut c = claim(
            ns,
            name,
            json!([{"name": "r", "exactly": {"deviceClassName": class, "allocationMode": "All"}}]),
            false,
        );
        c.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t.parse().unwrap()));
        c
    };
    let mut rq = synced("x", &[(GPU_KEY, 1), (GPU_REQ, 1)]);
    rq.metadata.creation_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T09:59:58Z".parse().unwrap()));
    // Its limits seen in force at 10:00:00 (`quota::stamp`): `since`.
    let stamp = crate::quota::stamp::IN_FORCE_SINCE.to_string();
    rq.metadata.annotations.get_or_insert_default().insert(stamp, "2026-06-01T10:00:00Z".into());
    let claims = [
        at("x", "hoard", "2026-06-01T09:00:00Z", "gpu.tessera.dev"),
        at("x", "same", "2026-06-01T10:00:00Z", "gpu.tessera.dev"),
        at("x", "later", "2026-06-01T10:00:01Z", "gpu.tessera.dev"),
        at("y", "other", "2026-06-01T09:00:00Z", "gpu.tessera.dev"),
    ];
    let q = quota(json!({"namespaces": ["x", "y"], "hard": {"nvidia.com/gpu": 2}, "allocation": "ResourceClaims"}));
    let classes = view();
    let dra = DraInputs { classes, ours: ours(&claims), ..Default::default() };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T11:00:00Z".parse().unwrap());
    let nss: BTreeSet<String> = ["x", "y"].iter().map(|s| s.to_string()).collect();
    let p = plan_quotas_dra(std::slice::from_ref(&q), &nss, &[rq], &Capacity::default(), &dra, now);
    assert_eq!(p.policy.get("x.since").map(String::as_str), Some("2026-06-01T10:00:00Z"));
    assert_eq!(
        p.policy.get(&claims_key("x")).map(String::as_str),
        Some("hoard:gpu.tessera.dev,early same:gpu.tessera.dev,early")
    );
    assert_eq!(p.policy.get(&claims_key("y")), None, "no ResourceQuota in y yet");
}

/// Claims of Tessera's classes made before the limits were in force must not use up
/// `<ns>.claims` like foreign ones (about 20 would turn the namespace to `_all`, every pod naming
/// any claim refused, and spend the budget other namespaces need). The claim policy refuses their
/// allocation anyway, so their entries only improve a message: they are listed after the others,
/// with what room is left, and never make a namespace `_all`.
#[test]
fn claims_made_before_the_limits_never_turn_a_namespace_to_all() {
    let early = |ns: &str, i: usize| pending(ns, &format!("early-{i:05}"), "gpu.tessera.dev", None, 0);
    let many: Vec<Pending> = (0..200).map(|i| early("x", i)).collect();
    let stash = [pending("x", "stash", "gpu.nvidia.com", None, 1)];
    let listed = policy_claims(&stash, &[], &many, ["x"]);
    let x = &listed["x.claims"];
    assert!(x.starts_with("stash:gpu.nvidia.com early-00000:gpu.tessera.dev,early "), "{x}");
    assert!(x.len() <= CLAIMS_CAP && x.len() > CLAIMS_CAP - 40, "filled up to the cap: {}", x.len());
    // A claim both foreign-pending and early is listed once, as pending.
    let both = policy_claims(&stash, &[], &[pending("x", "stash", "gpu.tessera.dev", None, 0)], ["x"]);
    assert_eq!(both["x.claims"], "stash:gpu.nvidia.com");
    // Early claims of earlier namespaces do not take the budget a later one's foreign claims need.
    let names: Vec<String> = (0..1000).map(|n| format!("ns-{n:04}")).collect();
    let spread: Vec<Pending> = names.iter().flat_map(|ns| (0..30).map(move |i| early(ns, i))).collect();
    let last = [pending("ns-0999", "stash", "gpu.nvidia.com", None, 1)];
    let listed = policy_claims(&last, &[], &spread, names.iter().map(String::as_str));
    assert!(listed["ns-0999.claims"].starts_with("stash:gpu.nvidia.com"), "{}", listed["ns-0999.claims"]);
    assert!(listed.values().all(|v| v != ALL_CLAIMS));
    let total: usize = listed.values().map(String::len).sum();
    assert!(total <= CLAIMS_BUDGET, "{total}");
}
