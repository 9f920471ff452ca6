use serde_json::json;

use super::*;

fn class(name: &str, selectors: &[&str], ext: Option<&str>) -> DeviceClass {
    let sel: Vec<_> = selectors.iter().map(|e| json!({"cel": {"expression": e}})).collect();
    let mut spec = json!({"selectors": sel});
    if let Some(e) = ext {
        spec["extendedResourceName"] = json!(e);
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

fn nvidia() -> GpuDrivers {
    GpuDrivers::default()
}

#[test]
fn class_names_follow_the_resource_names_and_map_back() {
    assert_eq!(class_of_resource("nvidia.com/gpu").as_deref(), Some("gpu.tessera.dev"));
    assert_eq!(class_of_resource("nvidia.com/mig-1g.10gb").as_deref(), Some("mig-1g.10gb.tessera.dev"));
    assert_eq!(class_of_resource("nvidia.com/mig-1g.10gb.me").as_deref(), Some("mig-1g.10gb.me.tessera.dev"));
    assert_eq!(class_of_resource("nvidia.com/mig-bogus"), None);
    assert_eq!(class_of_resource("example.com/fpga"), None);
    for r in ["nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb.me"] {
        assert_eq!(resource_of_class(&class_of_resource(r).unwrap()).as_deref(), Some(r));
    }
    for not_ours in ["mig.nvidia.com", "gpu.nvidia.com", "mig-bogus.tessera.dev", "fpga.tessera.dev"] {
        assert_eq!(resource_of_class(not_ours), None, "{not_ours}");
    }
    let key = devices_key("mig-1g.10gb.tessera.dev");
    assert_eq!(key, "mig-1g.10gb.tessera.dev.deviceclass.resource.k8s.io/devices");
    assert_eq!(class_of_key(&key), Some("mig-1g.10gb.tessera.dev"));
}

#[test]
fn a_managed_class_selects_one_profile_of_every_gpu_driver() {
    let two = GpuDrivers::new(["gpu.nvidia.com", "gpu.example.com"]);
    let c = managed_class("nvidia.com/mig-1g.10gb.me", &two).unwrap();
    assert_eq!(c.name, "mig-1g.10gb.me.tessera.dev");
    assert_eq!(
        c.expression,
        "(device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && \
         device.attributes['gpu.nvidia.com'].profile == '1g.10gb+me') || (device.driver == 'gpu.example.com' && \
         device.attributes['gpu.example.com'].type == 'mig' && device.attributes['gpu.example.com'].profile == '1g.10gb+me')"
    );
    let g = managed_class("nvidia.com/gpu", &nvidia()).unwrap();
    assert_eq!(
        g.expression,
        "(device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu')"
    );
    assert_eq!(managed_class("nvidia.com/gpu", &GpuDrivers::new(Vec::<String>::new())).unwrap().expression, "false");
}

#[test]
fn only_a_plain_conjunction_pins_a_driver() {
    let cases: &[(&str, Option<&str>)] = &[
        ("device.driver == 'fpga.example.com'", Some("fpga.example.com")),
        ("device.driver == \"fpga.example.com\"", Some("fpga.example.com")),
        ("'x.example' == device.driver", Some("x.example")),
        ("device.attributes['x.example'].model == 'a' && (device.driver == 'x.example')", Some("x.example")),
        ("device.driver == 'x.example' || device.driver == 'gpu.nvidia.com'", None),
        ("(device.driver == 'x.example' || true) && size(device.attributes) > 0", None),
        ("true ? device.driver == 'x.example' : true", None),
        ("device.driver == 'x.example\\' || true || \\'a'", None),
        ("device.driver != 'x.example'", None),
        ("device.driver.startsWith('x')", None),
        ("device.driver == 'x.example' && device.driver == 'gpu.nvidia.com'", Some("x.example")),
        ("(device.driver == 'x.example'", None),
        ("", None),
        // Comments, newlines, triple-quoted and raw strings are not read: each can hide an `||`.
        ("device.driver == 'fpga.example.com' && true // (\n|| true // )", None),
        ("device.driver == 'fpga.example.com' && true // (", None),
        ("device.driver == 'fpga.example.com'\n&& true", None),
        ("device.driver == 'fpga.example.com' && '''a' || true || 'b'''.size() > 0", None),
        (r#"device.driver == 'fpga.example.com' && """a" || true || "b""".size() > 0"#, None),
        ("device.driver == r'fpga.example.com' && true", None),
        (r#"device.driver == 'fpga.example.com' && R"x\" || true || \"" != ''"#, None),
        ("device.driver == 'fpga.example.com' && b'x' != b''", None),
        // Triple-quoted strings holding a quote hide the `||`s between.
        ("device.driver == 'x' && '''a'b''' != '' || true || '''c'd''' != ''", None),
    ];
    for (expr, want) in cases {
        assert_eq!(pinned_driver(expr).as_deref(), *want, "{expr}");
    }
}

#[test]
fn a_class_reaches_gpus_unless_a_selector_pins_another_driver() {
    let cases: &[(DeviceClass, bool)] = &[
        (
            class(
                "mig.nvidia.com",
                &["device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"],
                None,
            ),
            true,
        ),
        (class("everything", &[], None), true),
        (class("unreadable", &["device.driver in ['fpga.example.com']"], None), true),
        (class("either", &["device.driver == 'fpga.example.com' || device.driver == 'gpu.nvidia.com'"], None), true),
        (class("fpga", &["device.driver == 'fpga.example.com'"], None), false),
        (
            class(
                "fpga-and-more",
                &["true", "device.driver == 'fpga.example.com' && device.attributes['fpga.example.com'].x == 1"],
                None,
            ),
            false,
        ),
    ];
    for (c, want) in cases {
        assert_eq!(reaches_gpus(c, &nvidia()), *want, "{:?}", c.metadata.name);
    }
    // A driver added to --gpu-dra-drivers makes its pinned classes GPU-reaching.
    let fpga_gpus = GpuDrivers::new(["gpu.nvidia.com", "fpga.example.com"]);
    assert!(reaches_gpus(&cases[4].0, &fpga_gpus));
}

/// `--gpu-dra-drivers` empty (or without NVIDIA's driver): NVIDIA's own classes still reach GPUs,
/// so tenant namespaces hold them at 0 and the policy does not list them as open.
#[test]
fn nvidias_driver_reaches_gpus_whatever_the_driver_list_says() {
    let nvidia_class = class("gpu.nvidia.com", &["device.driver == 'gpu.nvidia.com'"], None);
    for drivers in [GpuDrivers::new(Vec::<String>::new()), GpuDrivers::new(["gpu.example.com"])] {
        assert!(reaches_gpus(&nvidia_class, &drivers), "{drivers:?}");
        let v = ClassView::of([&nvidia_class], &drivers);
        assert!(v.reaching.contains("gpu.nvidia.com") && v.open.is_empty(), "{v:?}");
    }
}

/// Tessera's class for `res` as the operator writes it.
fn ours(res: &str) -> DeviceClass {
    let c = managed_class(res, &nvidia()).unwrap();
    class(&c.name, &[&c.expression], None)
}

fn view() -> ClassView {
    ClassView::of(
        &[
            class("mig.nvidia.com", &["device.driver == 'gpu.nvidia.com'"], None),
            ours("nvidia.com/mig-1g.10gb"),
            class("fpga", &["device.driver == 'fpga.example.com'"], None),
            class("dra-ext", &[], Some("example.com/accel")),
            class("dra-ours", &[], Some("nvidia.com/mig-1g.10gb")),
            class("fpga-ext", &["device.driver == 'fpga.example.com'"], Some("example.com/fpga")),
        ],
        &nvidia(),
    )
}

#[test]
fn the_class_view_sorts_classes_and_extended_resources() {
    let v = view();
    let s = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(v.reaching, s(&["dra-ext", "dra-ours", "mig-1g.10gb.tessera.dev", "mig.nvidia.com"]));
    assert_eq!(v.open, s(&["fpga", "fpga-ext"]));
    assert_eq!(v.extended, s(&["example.com/accel"]), "ours and non-GPU classes' resources are not zeroed");
}

fn keys(mode: AllocationPath, share: &[(&str, i64)], unlisted: &[&str]) -> BTreeMap<String, String> {
    let share: BTreeMap<String, i64> = share.iter().map(|(r, n)| (r.to_string(), *n)).collect();
    let mut hard: BTreeMap<String, String> =
        share.iter().map(|(r, n)| (format!("requests.{r}"), n.to_string())).collect();
    let unlisted = unlisted.iter().map(|s| s.to_string()).collect();
    claim_keys(mode, &share, &unlisted, &BTreeSet::new(), &view(), &mut hard);
    hard
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

const DEV: &str = ".deviceclass.resource.k8s.io/devices";

#[test]
fn extended_resources_mode_closes_every_gpu_reaching_class() {
    let got = keys(AllocationPath::ExtendedResources, &[("nvidia.com/mig-1g.10gb", 3)], &[]);
    assert_eq!(
        got,
        map(&[
            ("requests.nvidia.com/mig-1g.10gb", "3"),
            ("requests.example.com/accel", "0"),
            (&format!("mig.nvidia.com{DEV}"), "0"),
            (&format!("mig-1g.10gb.tessera.dev{DEV}"), "0"),
            (&format!("dra-ext{DEV}"), "0"),
            (&format!("dra-ours{DEV}"), "0"),
        ])
    );
}

#[test]
fn resource_claims_mode_moves_each_limit_to_its_class_and_zeroes_the_rest() {
    let got = keys(
        AllocationPath::ResourceClaims,
        &[("nvidia.com/mig-1g.10gb", 3), ("nvidia.com/gpu", 1)],
        &["nvidia.com/mig-2g.20gb"],
    );
    assert_eq!(
        got,
        map(&[
            ("requests.nvidia.com/mig-1g.10gb", "0"),
            ("requests.nvidia.com/gpu", "0"),
            ("requests.nvidia.com/mig-2g.20gb", "0"),
            ("requests.example.com/accel", "0"),
            (&format!("mig-1g.10gb.tessera.dev{DEV}"), "3"),
            (&format!("gpu.tessera.dev{DEV}"), "1"),
            (&format!("mig-2g.20gb.tessera.dev{DEV}"), "0"),
            (&format!("mig.nvidia.com{DEV}"), "0"),
            (&format!("dra-ext{DEV}"), "0"),
            (&format!("dra-ours{DEV}"), "0"),
        ])
    );
    // unlisted: Unlimited leaves unlisted resources unlimited on both paths.
    let open = keys(AllocationPath::ResourceClaims, &[("nvidia.com/mig-1g.10gb", 3)], &[]);
    assert!(!open.keys().any(|k| k.contains("2g.20gb") || k.contains("nvidia.com/gpu") || k.starts_with("gpu.")));
}

#[test]
fn usage_through_tessera_classes_counts_for_its_resource() {
    let used = used_by_resource([
        ("requests.nvidia.com/mig-1g.10gb".to_string(), 1),
        (format!("mig-1g.10gb.tessera.dev{DEV}"), 2),
        (format!("gpu.tessera.dev{DEV}"), 1),
        (format!("mig.nvidia.com{DEV}"), 5),
        ("count/pods".to_string(), 9),
    ]);
    assert_eq!(used, BTreeMap::from([("nvidia.com/gpu".to_string(), 1), ("nvidia.com/mig-1g.10gb".to_string(), 3)]));
}

fn quota(name: &str, nss: &[&str], allocation: &str) -> TenantGpuQuota {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": name, "uid": format!("uid-{name}")}, "spec": {"namespaces": nss, "hard": {"nvidia.com/mig-1g.10gb": 3},
        "allocation": allocation}}))
    .unwrap()
}

#[test]
fn the_policy_params_list_what_each_tenant_namespace_may_use() {
    let (a, b, c) = (
        quota("team-a", &["a"], "ExtendedResources"),
        quota("team-b", &["b", "shared", "both"], "ResourceClaims"),
        quota("team-c", &["shared", "both"], "ExtendedResources"),
    );
    let resources: BTreeSet<String> = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"].map(String::from).into();
    let valid: BTreeSet<&str> = ["team-a", "team-b", "team-c"].into();
    let written = our_rq("team-b", "b", &[(&format!("mig-1g.10gb.tessera.dev{DEV}"), "3")], &[]);
    let planned = crate::quota::Apply {
        namespace: "b".into(),
        quota: "team-b".into(),
        name: crate::quota::resource_quota_name("team-b"),
        hard: [(format!("mig-1g.10gb.tessera.dev{DEV}"), "3".to_string())].into(),
        in_force_since: None,
        in_force_keys: None,
    };
    let d = policy_data(&[&a, &b, &c], &valid, &[written], &[planned], &resources, &view());
    assert_eq!(d["_open"], "fpga fpga-ext");
    assert_eq!(d["_reaching"], "dra-ext dra-ours mig-1g.10gb.tessera.dev mig.nvidia.com");
    assert_eq!((d["a.quota"].as_str(), d["a.allowed"].as_str()), ("team-a", ""));
    assert!(d["a.hint"].contains("nvidia.com/mig-<profile>"));
    // A pod served through a KEP-5004 class hears why its extended resource gets no device.
    assert!(d["a.hint"].contains("only nodes whose device plugin advertises them serve them here"), "{}", d["a.hint"]);
    // All of ours: named once under `_tessera`.
    assert_eq!(
        (d["b.allowed"].as_str(), d["_tessera"].as_str()),
        ("_tessera", "gpu.tessera.dev mig-1g.10gb.tessera.dev")
    );
    assert_eq!(d["b.hint"], "use mig-1g.10gb.tessera.dev");
    // Claimed by two quotas: the stricter rule (only what both allow).
    assert_eq!((d["shared.quota"].as_str(), d["shared.allowed"].as_str()), ("team-b team-c", ""));
    assert!(managed_classes(&[&a, &c], &resources, &nvidia()).is_empty(), "no classes while no quota uses claims");
    let made: Vec<String> = managed_classes(&[&a, &b], &resources, &nvidia()).into_iter().map(|c| c.name).collect();
    assert_eq!(made, ["gpu.tessera.dev", "mig-1g.10gb.tessera.dev"]);
}

/// The whole pass: a claims quota's ResourceQuota carries the class keys, and its status counts
/// devices held through claims with those held through extended resources.
#[test]
fn a_claims_quota_is_planned_with_class_keys_and_counts_usage_on_both_paths() {
    use k8s_openapi::api::core::v1::ResourceQuota;

    use crate::quota::{Capacity, DraInputs, plan_quotas_dra, quota_label_value, resource_quota_name};
    let q: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team-a", "uid": "uid-a", "generation": 1},
        "spec": {"namespaces": ["a"], "hard": {"nvidia.com/mig-1g.10gb": 3}, "allocation": "ResourceClaims"}}))
    .unwrap();
    let rq: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": resource_quota_name("team-a"),
        "namespace": "a", "labels": {"tessera.dev/quota": quota_label_value("team-a")},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": "team-a",
                             "uid": "uid-a", "controller": true}]},
        "status": {"hard": {"requests.nvidia.com/mig-1g.10gb": "0", format!("mig-1g.10gb.tessera.dev{DEV}"): "3"},
                   "used": {"requests.nvidia.com/mig-1g.10gb": "1", format!("mig-1g.10gb.tessera.dev{DEV}"): "2"}}}))
    .unwrap();
    let dra = DraInputs { classes: view(), drivers: nvidia(), ..Default::default() };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap());
    let plan = plan_quotas_dra(&[q], &["a".to_string()].into(), &[rq], &Capacity::default(), &dra, now);
    let hard = &plan.apply[0].hard;
    // One device is still held through the extended resource: the claims path gets 3 - 1.
    assert_eq!(hard[&format!("mig-1g.10gb.tessera.dev{DEV}")], "2");
    assert_eq!(hard["requests.nvidia.com/mig-1g.10gb"], "0");
    assert_eq!(hard[&format!("mig.nvidia.com{DEV}")], "0");
    let st = &plan.statuses["team-a"];
    assert_eq!((st.resources[0].used, st.resources[0].remaining), (3, 0));
    assert_eq!(st.namespaces[0].used["nvidia.com/mig-1g.10gb"], 3);
    assert!(plan.device_classes.iter().any(|c| c.name == "mig-1g.10gb.tessera.dev"));
    assert_eq!(plan.policy["a.quota"], "team-a");
}

/// Our ResourceQuota of quota `q` (uid `uid-<q>`) in `ns` with `hard` (in spec and, as the
/// controller manager copies it, in status) and `used`.
fn our_rq(
    q: &str,
    ns: &str,
    hard: &[(&str, &str)],
    used: &[(&str, &str)],
) -> k8s_openapi::api::core::v1::ResourceQuota {
    use crate::quota::{quota_label_value, resource_quota_name};
    let m = |p: &[(&str, &str)]| p.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>();
    // The controller manager counts every key of `hard`: 0 where nothing is held.
    let mut used_all = m(&hard.iter().map(|(k, _)| (*k, "0")).collect::<Vec<_>>());
    used_all.extend(m(used));
    let used = serde_json::Value::Object(used_all);
    let rq = serde_json::from_value(json!({"metadata": {"name": resource_quota_name(q), "namespace": ns,
        "labels": {"tessera.dev/quota": quota_label_value(q)},
        "ownerReferences": [{"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "name": q,
                             "uid": format!("uid-{q}"), "controller": true}]},
        "spec": {"hard": m(hard)}, "status": {"hard": m(hard), "used": used}}))
    .unwrap();
    crate::quota::stamp::stamped(rq) // synced: a pass stamped it
}

fn plan_of(
    quotas: &[TenantGpuQuota],
    nss: &[&str],
    rqs: &[k8s_openapi::api::core::v1::ResourceQuota],
) -> crate::quota::QuotaPlan {
    use crate::quota::{Capacity, DraInputs, plan_quotas_dra};
    let dra = DraInputs { classes: view(), drivers: nvidia(), ..Default::default() };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap());
    let nss = nss.iter().map(|s| s.to_string()).collect();
    plan_quotas_dra(quotas, &nss, rqs, &Capacity::default(), &dra, now)
}

/// The policy opens a class of ours in a namespace only once the quota's own
/// ResourceQuota there (as cached: written) limits it; never for an invalid or conflicted quota,
/// whatever the specs say. Otherwise a failed or not-yet-made write leaves the class unlimited.
#[test]
fn the_policy_opens_a_class_only_where_a_written_resource_quota_limits_it() {
    let mig = format!("mig-1g.10gb.tessera.dev{DEV}");
    let mut b = quota("team-b", &["b"], "ResourceClaims");
    // Nothing opens before the quota's ResourceQuota there carries its stamp (`quota::stamp`),
    // not even the classes `unlisted: Unlimited` leaves unlimited: claims made before `since`.
    let p = plan_of(std::slice::from_ref(&b), &["b"], &[]);
    assert_eq!(p.policy["b.allowed"], "");
    // Stamped: the classes of unlisted resources are open (no limit by the spec itself), but
    // never the class of a limited resource before its key is written.
    let stamped = our_rq("team-b", "b", &[("requests.nvidia.com/mig-1g.10gb", "3")], &[]);
    let p = plan_of(std::slice::from_ref(&b), &["b"], &[stamped]);
    let open: Vec<&str> = p.policy["b.allowed"].split(' ').collect();
    assert!(open.contains(&"gpu.tessera.dev") && !open.contains(&"mig-1g.10gb.tessera.dev"), "{open:?}");
    assert!(p.policy["b.hint"].contains("still being written"), "{:?}", p.policy["b.hint"]);
    b.spec.unlisted = UnlistedPolicy::Zero;
    // Nothing written yet (first pass, or the write failed, or the process died after the params).
    let p = plan_of(std::slice::from_ref(&b), &["b"], &[]);
    assert_eq!((p.policy["b.quota"].as_str(), p.policy["b.allowed"].as_str()), ("team-b", ""));
    // An extended-resources ResourceQuota (no key of ours): still closed.
    let old = our_rq("team-b", "b", &[("requests.nvidia.com/mig-1g.10gb", "3")], &[]);
    assert_eq!(plan_of(std::slice::from_ref(&b), &["b"], &[old]).policy["b.allowed"], "");
    // Written with the class's key: that class opens, and only it.
    let written = our_rq("team-b", "b", &[("requests.nvidia.com/mig-1g.10gb", "0"), (&mig, "3")], &[]);
    let p = plan_of(std::slice::from_ref(&b), &["b"], std::slice::from_ref(&written));
    assert_eq!(p.policy["b.allowed"], "mig-1g.10gb.tessera.dev");
    // A user's ResourceQuota carrying the key does not open it (only ours counts).
    let mut theirs = written.clone();
    theirs.metadata.owner_references = None;
    assert_eq!(plan_of(std::slice::from_ref(&b), &["b"], &[theirs]).policy["b.allowed"], "");

    // A mode switch whose edit also makes the spec invalid: the old ResourceQuota is kept and
    // nothing opens (nor are classes made for it).
    let mut bad = b.clone();
    bad.spec.hard.insert("nvidia.com/mig-bogus".into(), 1);
    let old = our_rq("team-b", "b", &[("requests.nvidia.com/mig-1g.10gb", "3")], &[]);
    let p = plan_of(&[bad], &["b"], &[old]);
    assert_eq!(p.policy["b.allowed"], "", "{:?}", p.policy);
    assert!(p.policy["b.hint"].contains("invalid"), "{:?}", p.policy);
    assert!(p.device_classes.is_empty());
    // Invalid even with our keys written before: closed until it is fixed.
    let mut bad = b.clone();
    bad.spec.hard.insert("nvidia.com/mig-bogus".into(), 1);
    assert_eq!(plan_of(&[bad], &["b"], std::slice::from_ref(&written)).policy["b.allowed"], "");

    // Claimed by two claims quotas: a conflict, closed.
    let mut c = quota("team-c", &["b"], "ResourceClaims");
    c.spec.unlisted = UnlistedPolicy::Zero;
    let p = plan_of(&[b, c], &["b"], &[written]);
    assert_eq!((p.policy["b.quota"].as_str(), p.policy["b.allowed"].as_str()), ("team-b team-c", ""));
}

/// Params come from valid quotas only; a namespace that is no valid name never
/// becomes a ConfigMap key (which would fail the write for every tenant).
#[test]
fn an_invalid_namespace_name_never_becomes_a_params_key() {
    let mut q = quota("team-x", &["a/b", "ok"], "ResourceClaims");
    q.spec.unlisted = UnlistedPolicy::Zero;
    let p = plan_of(&[q], &["ok"], &[]);
    assert!(p.policy.keys().all(|k| !k.contains('/')), "{:?}", p.policy);
    assert_eq!(p.policy["ok.allowed"], "");
}

/// Switching `spec.allocation` gives the new path the share less what the old path
/// still holds in that namespace (the old path is at 0, so that only falls), and says so.
#[test]
fn a_switched_path_gets_the_share_less_what_the_old_path_still_holds() {
    let mig = format!("mig-1g.10gb.tessera.dev{DEV}");
    let rq_name = "requests.nvidia.com/mig-1g.10gb";
    // To claims: 2 of 3 still held by pods through the extended resource.
    let b = quota("team-b", &["b"], "ResourceClaims");
    let rq = our_rq("team-b", "b", &[(rq_name, "0"), (&mig, "3")], &[(rq_name, "2"), (&mig, "0")]);
    let p = plan_of(std::slice::from_ref(&b), &["b"], &[rq]);
    assert_eq!((p.apply[0].hard[&mig].as_str(), p.apply[0].hard[rq_name].as_str()), ("1", "0"));
    let ready = p.statuses["team-b"].conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert!(ready.message.contains("still holds 2") && ready.message.contains("nvidia.com/mig-1g.10gb"), "{ready:?}");
    // More held than the share: 0, never negative.
    let rq = our_rq("team-b", "b", &[(rq_name, "0"), (&mig, "3")], &[(rq_name, "5")]);
    assert_eq!(plan_of(std::slice::from_ref(&b), &["b"], &[rq]).apply[0].hard[&mig], "0");
    // Once the old path is empty: the whole share.
    let rq = our_rq("team-b", "b", &[(rq_name, "0"), (&mig, "1")], &[(rq_name, "0"), (&mig, "3")]);
    let p = plan_of(std::slice::from_ref(&b), &["b"], &[rq]);
    assert_eq!(p.apply[0].hard[&mig], "3");
    let ready = p.statuses["team-b"].conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert!(!ready.message.contains("still holds"), "{ready:?}");
    // Back to extended resources: 3 claims allocated leave the extended resource at 0.
    let a = quota("team-b", &["b"], "ExtendedResources");
    let rq = our_rq("team-b", "b", &[(rq_name, "0"), (&mig, "3")], &[(rq_name, "0"), (&mig, "3")]);
    let p = plan_of(&[a], &["b"], &[rq]);
    assert_eq!((p.apply[0].hard[rq_name].as_str(), p.apply[0].hard[&mig].as_str()), ("0", "0"));
}

/// A binding whose paramRef is not the operator's params ConfigMap (another
/// namespace) turns the policy off silently (`parameterNotFoundAction: Allow`): it is named.
#[test]
fn a_binding_reading_params_elsewhere_or_missing_is_named() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
    let binding = |name: &str, ns: Option<&str>| -> ValidatingAdmissionPolicyBinding {
        serde_json::from_value(json!({"metadata": {"name": "tessera-claim-classes"},
            "spec": {"policyName": "tessera-claim-classes", "paramRef": {"name": name, "namespace": ns,
                     "parameterNotFoundAction": "Allow"}}}))
        .unwrap()
    };
    assert_eq!(binding_problem(Some(&binding("tessera-claim-classes", Some("gpu-ops"))), "gpu-ops"), None);
    let elsewhere = binding_problem(Some(&binding("tessera-claim-classes", Some("tessera-system"))), "gpu-ops");
    let msg = elsewhere.expect("named");
    assert!(msg.contains("tessera-system/tessera-claim-classes") && msg.contains("gpu-ops/tessera-claim-classes"));
    assert!(msg.contains("allows every class"), "{msg}");
    assert!(binding_problem(Some(&binding("other", Some("gpu-ops"))), "gpu-ops").is_some());
    assert!(binding_problem(Some(&binding("tessera-claim-classes", None)), "gpu-ops").is_some());
    assert!(binding_problem(None, "gpu-ops").unwrap().contains("not found"));
}

/// The list of all of Tessera's classes is written once (`_tessera`), not per
/// namespace, so thousands of tenant namespaces stay far under a ConfigMap's 1 MiB.
#[test]
fn all_of_our_classes_are_listed_once_and_thousands_of_namespaces_fit_a_config_map() {
    let nss: Vec<String> = (0..3000).map(|i| format!("tenant-namespace-{i:05}")).collect();
    let quotas: Vec<TenantGpuQuota> = nss
        .chunks(60)
        .enumerate()
        .map(|(i, c)| quota(&format!("team-{i}"), &c.iter().map(String::as_str).collect::<Vec<_>>(), "ResourceClaims"))
        .collect();
    let mig = format!("mig-1g.10gb.tessera.dev{DEV}");
    let rqs: Vec<_> = quotas
        .iter()
        .flat_map(|q| q.spec.namespaces.iter().map(move |ns| (q.metadata.name.clone().unwrap(), ns.clone())))
        .map(|(q, ns)| our_rq(&q, &ns, &[("requests.nvidia.com/mig-1g.10gb", "0"), (&mig, "0")], &[]))
        .collect();
    let names: Vec<&str> = nss.iter().map(String::as_str).collect();
    let p = plan_of(&quotas, &names, &rqs);
    assert_eq!(p.policy["tenant-namespace-00000.allowed"], "_tessera");
    assert!(p.policy["_tessera"].split(' ').any(|c| c == "mig-1g.10gb.tessera.dev"));
    let size: usize = p.policy.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert!(size < 1024 * 1024, "{size} bytes");
}

/// The API server enforces `status.hard`, which the controller manager
/// copies from `spec.hard` later. A class opens only once `status.hard` carries its key at no
/// more than the planned limit.
#[test]
fn a_class_opens_only_once_the_resource_quota_status_enforces_its_limit() {
    let mig = format!("mig-1g.10gb.tessera.dev{DEV}");
    let mut b = quota("team-b", &["b"], "ResourceClaims");
    b.spec.unlisted = UnlistedPolicy::Zero;
    let synced = our_rq("team-b", "b", &[("requests.nvidia.com/mig-1g.10gb", "0"), (&mig, "3")], &[]);
    assert_eq!(
        plan_of(std::slice::from_ref(&b), &["b"], std::slice::from_ref(&synced)).policy["b.allowed"],
        "mig-1g.10gb.tessera.dev"
    );
    // Written, but no status yet (a new ResourceQuota): nothing is enforced, so closed.
    let mut unsynced = synced.clone();
    unsynced.status = None;
    let p = plan_of(std::slice::from_ref(&b), &["b"], &[unsynced]);
    assert_eq!(p.policy["b.allowed"], "", "{:?}", p.policy);
    assert!(p.policy["b.hint"].contains("still being written"), "{:?}", p.policy["b.hint"]);
    // Status enforces more than planned (the share shrank, not synced yet): closed.
    let mut higher = synced.clone();
    higher
        .status
        .as_mut()
        .unwrap()
        .hard
        .as_mut()
        .unwrap()
        .insert(mig.clone(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("5".into()));
    assert_eq!(plan_of(std::slice::from_ref(&b), &["b"], &[higher]).policy["b.allowed"], "");
}

/// A ResourceQuota without `status.used` (new, or not synced) says nothing
/// of what the old path holds: the new path gets 0 until it does (and `status.hard` holds the
/// old key at 0).
#[test]
fn a_switched_path_gets_0_while_the_old_paths_usage_is_unknown() {
    let mig = format!("mig-1g.10gb.tessera.dev{DEV}");
    let rq_name = "requests.nvidia.com/mig-1g.10gb";
    let b = quota("team-b", &["b"], "ResourceClaims");
    // No ResourceQuota yet, or one without status: 0, and the status says why.
    for rqs in [vec![], {
        let mut rq = our_rq("team-b", "b", &[(rq_name, "0"), (&mig, "3")], &[]);
        rq.status = None;
        vec![rq]
    }] {
        let p = plan_of(std::slice::from_ref(&b), &["b"], &rqs);
        assert_eq!(p.apply[0].hard[&mig], "0", "{rqs:?}");
        let ready = p.statuses["team-b"].conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(ready.message.contains("held at 0"), "{ready:?}");
    }
    // The old key still enforced above 0 (switch not synced): its usage may still rise, 0.
    let rq = our_rq("team-b", "b", &[(rq_name, "3")], &[(rq_name, "1")]);
    assert_eq!(plan_of(std::slice::from_ref(&b), &["b"], &[rq]).apply[0].hard[&mig], "0");
    // Synced: the share less what is held.
    let rq = our_rq("team-b", "b", &[(rq_name, "0"), (&mig, "0")], &[(rq_name, "1"), (&mig, "0")]);
    assert_eq!(plan_of(std::slice::from_ref(&b), &["b"], &[rq]).apply[0].hard[&mig], "2");
}

/// Only the classes of the share (and of what `unlisted` names) are exempt
/// from the 0 of GPU-reaching classes, not every class named like ours.
#[test]
fn a_class_named_like_ours_but_outside_the_share_is_held_at_0() {
    let made_up = ["mig-7g.999gb.tessera.dev", "mig-01g.10gb.tessera.dev", "mig-2g.20gb.tessera.dev"];
    // Each with the selector the operator would write (so only the name decides).
    let like_ours =
        |n: &str| match managed_class(&format!("nvidia.com/{}", n.trim_end_matches(".tessera.dev")), &nvidia()) {
            Some(c) => class(&c.name, &[&c.expression], None),
            None => class(n, &["device.driver == 'gpu.nvidia.com'"], None),
        };
    let mut classes = vec![ours("nvidia.com/mig-1g.10gb")];
    classes.extend(made_up.iter().map(|n| like_ours(n)));
    let v = ClassView::of(&classes, &nvidia());
    let share: BTreeMap<String, i64> = [("nvidia.com/mig-1g.10gb".to_string(), 3)].into();
    let none = BTreeSet::new();
    let mut hard = BTreeMap::new();
    claim_keys(AllocationPath::ResourceClaims, &share, &none, &none, &v, &mut hard);
    assert_eq!(hard[&format!("mig-1g.10gb.tessera.dev{DEV}")], "3");
    for c in made_up {
        assert_eq!(hard.get(&format!("{c}{DEV}")).map(String::as_str), Some("0"), "{c}: {hard:?}");
    }
    // `unlisted: Unlimited`: the class of a resource left unlimited is not held (and only it).
    let unlimited: BTreeSet<String> = ["nvidia.com/mig-2g.20gb".to_string()].into();
    let mut hard = BTreeMap::new();
    claim_keys(AllocationPath::ResourceClaims, &share, &none, &unlimited, &v, &mut hard);
    assert!(!hard.contains_key(&format!("mig-2g.20gb.tessera.dev{DEV}")), "{hard:?}");
    assert_eq!(hard[&format!("mig-7g.999gb.tessera.dev{DEV}")], "0");
}

/// A class named as ours but made by someone else first (a broad selector;
/// our apply failed) is held at 0 and never opened, whatever the ResourceQuota enforces.
#[test]
fn a_class_of_ours_with_another_selector_is_held_at_0_and_closed() {
    let mig = format!("mig-1g.10gb.tessera.dev{DEV}");
    let broad = class("mig-1g.10gb.tessera.dev", &["device.driver == 'gpu.nvidia.com'"], None);
    let v = ClassView::of([&broad, &ours("nvidia.com/gpu")], &nvidia());
    assert_eq!(v.mismatched, ["mig-1g.10gb.tessera.dev".to_string()].into());
    let share: BTreeMap<String, i64> = [("nvidia.com/mig-1g.10gb".to_string(), 3)].into();
    let mut hard = BTreeMap::new();
    claim_keys(AllocationPath::ResourceClaims, &share, &BTreeSet::new(), &BTreeSet::new(), &v, &mut hard);
    assert_eq!(hard[&mig], "0", "{hard:?}");
    // Enforced at 0 (so no more than planned), yet not allowed.
    let mut b = quota("team-b", &["b"], "ResourceClaims");
    b.spec.unlisted = UnlistedPolicy::Zero;
    let rq = our_rq("team-b", "b", &[("requests.nvidia.com/mig-1g.10gb", "0"), (&mig, "0")], &[]);
    let dra = crate::quota::DraInputs { classes: v, drivers: nvidia(), ..Default::default() };
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap());
    let p = crate::quota::plan_quotas_dra(&[b], &["b".to_string()].into(), &[rq], &Default::default(), &dra, now);
    assert_eq!(p.apply[0].hard[&mig], "0");
    assert_eq!(p.policy["b.allowed"], "", "{:?}", p.policy);
    // The writer still applies ours over it.
    assert!(p.device_classes.iter().any(|c| c.name == "mig-1g.10gb.tessera.dev"));
}

/// In extended-resources mode the class of every resource of the share is
/// held at 0 whether it exists or not: a class of ours deleted (and made again by anyone) is
/// closed from its first claim. A plain quota's first pass still gets its whole share.
#[test]
fn extended_resources_mode_holds_the_shares_classes_at_0_even_when_they_do_not_exist() {
    let share: BTreeMap<String, i64> = [("nvidia.com/mig-3g.40gb".to_string(), 2)].into();
    let mut hard: BTreeMap<String, String> = [("requests.nvidia.com/mig-3g.40gb".to_string(), "2".to_string())].into();
    let none = BTreeSet::new();
    claim_keys(AllocationPath::ExtendedResources, &share, &none, &none, &ClassView::default(), &mut hard);
    assert_eq!(hard[&format!("mig-3g.40gb.tessera.dev{DEV}")], "0", "{hard:?}");
    let q = quota("team-a", &["a"], "ExtendedResources");
    let p = crate::quota::plan_quotas_with(
        &[q],
        &["a".to_string()].into(),
        &[],
        &Default::default(),
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-06-01T00:00:00Z".parse().unwrap()),
    );
    assert_eq!(p.apply[0].hard["requests.nvidia.com/mig-1g.10gb"], "3");
    assert_eq!(p.apply[0].hard[&format!("mig-1g.10gb.tessera.dev{DEV}")], "0");
}

/// A claim of Tessera's class made before its namespace joined a quota would be allocated later
/// with no limit (the ResourceQuota counts claims from their creation only). The params say
/// since when each namespace's claims are counted: the earliest stamp ([`crate::quota::stamp`]:
/// its limits seen in force) of its quota's ResourceQuotas there, not their creation
/// (`status.hard` syncs after it). None with no ResourceQuota stamped yet. Claimed by two
/// quotas: the later of their earliest stamps, none while one has none (with no `since` at all,
/// hoarded pods made before the namespace joined would go unlisted).
#[test]
fn the_params_say_since_when_each_namespace_s_claims_are_counted() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let (b, c, e) = (
        quota("team-b", &["b", "shared", "both"], "ResourceClaims"),
        quota("team-c", &["shared", "both"], "ExtendedResources"),
        quota("team-e", &["e"], "ResourceClaims"),
    );
    let stamp = crate::quota::stamp::IN_FORCE_SINCE;
    let at = |mut rq: k8s_openapi::api::core::v1::ResourceQuota, name: &str, created: &str, stamped: Option<&str>| {
        rq.metadata.name = Some(name.into());
        rq.metadata.creation_timestamp = Some(Time(created.parse().unwrap()));
        let annotations = rq.metadata.annotations.get_or_insert_default();
        annotations.remove(stamp);
        if let Some(t) = stamped {
            annotations.insert(stamp.into(), t.into());
        }
        rq
    };
    let rqs = [
        at(our_rq("team-b", "b", &[], &[]), "new", "2026-06-01T10:00:05Z", Some("2026-06-01T10:00:07Z")),
        at(our_rq("team-b", "b", &[], &[]), "old", "2026-06-01T09:00:00Z", Some("2026-06-01T09:00:02Z")),
        // Not stamped (its limits not seen in force yet): counts for nothing, however old.
        at(our_rq("team-b", "b", &[], &[]), "unsynced", "2026-06-01T08:00:00Z", None),
        // Another quota's, older: not what counts b's claims for team-b.
        at(our_rq("team-c", "b", &[], &[]), "other", "2026-01-01T00:00:00Z", Some("2026-01-01T00:00:00Z")),
        at(our_rq("team-b", "shared", &[], &[]), "shared", "2026-06-01T09:00:00Z", Some("2026-06-01T09:00:00Z")),
        at(our_rq("team-e", "e", &[], &[]), "e", "2026-06-01T09:00:00Z", None),
        at(our_rq("team-b", "both", &[], &[]), "b1", "2026-06-01T09:00:00Z", Some("2026-06-01T09:00:00Z")),
        at(our_rq("team-b", "both", &[], &[]), "b2", "2026-06-01T09:30:00Z", Some("2026-06-01T09:30:00Z")),
        at(our_rq("team-c", "both", &[], &[]), "c1", "2026-06-01T09:10:00Z", Some("2026-06-01T09:10:00Z")),
    ];
    let resources: BTreeSet<String> = ["nvidia.com/gpu"].map(String::from).into();
    let valid: BTreeSet<&str> = ["team-b", "team-c", "team-e"].into();
    let d = policy_data(&[&b, &c, &e], &valid, &rqs, &[], &resources, &view());
    assert_eq!(d.get("b.since").map(String::as_str), Some("2026-06-01T09:00:02Z"));
    assert_eq!(d.get("shared.since"), None, "claimed by two quotas, one with no ResourceQuota there");
    assert_eq!(d.get("both.since").map(String::as_str), Some("2026-06-01T09:10:00Z"), "the later quota's earliest");
    assert_eq!(d.get("e.since"), None, "no ResourceQuota stamped yet");
}
