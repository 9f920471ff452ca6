use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

use super::*;
use crate::plan::GpuLayout;
use crate::quota::PhysicalLimits;

fn layout(product: &str, profiles: &[(&str, i32)], indices: Option<Vec<i32>>) -> GpuLayout {
    GpuLayout {
        gpu_product: product.into(),
        mig_enabled: true,
        profiles: profiles.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        gpu_indices: indices,
    }
}

fn plan(layouts: Vec<GpuLayout>) -> GpuPartitionPlanSpec {
    GpuPartitionPlanSpec {
        node_selector: Default::default(),
        priority: 0,
        paused: false,
        layouts,
        layouts_from: None,
        rollout: Default::default(),
    }
}

fn fields(errs: &[FieldError]) -> Vec<&str> {
    errs.iter().map(|e| e.field.as_str()).collect()
}

#[test]
fn a_good_plan_has_no_errors() {
    let p = plan(vec![
        layout("H100-80GB", &[("3g.40gb", 1), ("2g.20gb", 2)], None),
        layout("NVIDIA A100-SXM4-40GB", &[("7g.40gb", 1)], Some(vec![0])),
        layout("A100-40GB", &[("1g.5gb", 7)], Some(vec![1, 2])),
    ]);
    assert_eq!(validate_plan(&p), vec![]);
}

#[test]
fn plan_errors_name_the_field_and_reason() {
    let mut p = plan(vec![
        layout("H100-81GB", &[("1g.10gb", 1)], None),
        layout("H100-80GB", &[("4g.40gb", 2)], None),
        layout("H100-80GB", &[("3g", 1)], Some(vec![0, 0])),
        GpuLayout { mig_enabled: false, ..layout("A30", &[("1g.6gb", 1)], None) },
        layout("A30", &[], Some(vec![1])),
    ]);
    p.rollout.max_unavailable = IntOrString::String("150%".into());
    p.rollout.drain_timeout_seconds = -1;
    let errs = validate_plan(&p);
    let got: Vec<String> = errs.iter().map(ToString::to_string).collect();
    let has = |field: &str, reason_part: &str| {
        assert!(
            errs.iter().any(|e| e.field == field && e.reason.contains(reason_part)),
            "missing {field}: ...{reason_part}... in {got:#?}"
        )
    };
    has("spec.layouts[0].gpuProduct", "unknown GPU product \"H100-81GB\"; known products: A30-24GB");
    has("spec.layouts[1].profiles", "2 x 4g.40gb requested, but one H100-80GB holds at most 1");
    has("spec.layouts[2].profiles[\"3g\"]", "is not a MIG profile name");
    has("spec.layouts[2].gpuIndices[1]", "GPU 0 of H100-80GB is already listed by this layout");
    has("spec.layouts[3].profiles", "must be empty when migEnabled is false");
    has("spec.layouts[4].profiles", "no instances are listed");
    has("spec.rollout.maxUnavailable", "percentage from 1% to 100%");
    has("spec.rollout.drainTimeoutSeconds", ">= 0");
}

#[test]
fn two_catch_all_layouts_for_one_product_conflict() {
    let p = plan(vec![layout("H100-80GB", &[("7g.80gb", 1)], None), layout("h100-80gb", &[("1g.10gb", 7)], None)]);
    let errs = validate_plan(&p);
    assert_eq!(fields(&errs), vec!["spec.layouts[1].gpuIndices"]);
    assert!(errs[0].reason.contains("spec.layouts[0] already applies to every H100-80GB GPU"));
}

#[test]
fn selector_operators_are_checked() {
    let mut p = plan(vec![layout("H100-80GB", &[("7g.80gb", 1)], None)]);
    p.node_selector.match_expressions = Some(vec![
        LabelSelectorRequirement { key: "a".into(), operator: "In".into(), values: None },
        LabelSelectorRequirement { key: "b".into(), operator: "Equals".into(), values: None },
        LabelSelectorRequirement { key: "c".into(), operator: "Exists".into(), values: Some(vec!["x".into()]) },
    ]);
    assert_eq!(
        fields(&validate_plan(&p)),
        vec![
            "spec.nodeSelector.matchExpressions[0].values",
            "spec.nodeSelector.matchExpressions[1].operator",
            "spec.nodeSelector.matchExpressions[2].values"
        ]
    );
}

#[test]
fn max_unavailable_rounds_percentages_down_but_never_to_zero() {
    let pct = |s: &str| IntOrString::String(s.into());
    assert_eq!(max_unavailable(&IntOrString::Int(2), 10), Ok(2));
    assert_eq!(max_unavailable(&pct("25%"), 10), Ok(2));
    assert_eq!(max_unavailable(&pct("25%"), 3), Ok(1));
    assert_eq!(max_unavailable(&pct("100%"), 7), Ok(7));
    for bad in ["0%", "101%", "abc", "5", "05%", "-1%"] {
        assert!(max_unavailable(&pct(bad), 10).is_err(), "{bad}");
    }
    assert!(max_unavailable(&IntOrString::Int(0), 10).is_err());
}

fn quota(namespaces: &[&str], hard: &[(&str, i64)]) -> TenantGpuQuotaSpec {
    TenantGpuQuotaSpec {
        namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
        hard: hard.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        split: SplitPolicy::Even,
        unlisted: Default::default(),
        allocation: Default::default(),
        namespace_hard: BTreeMap::new(),
        physical: None,
        idle_after: None,
        namespace_selector: None,
    }
}

#[test]
fn a_namespace_selector_names_a_label_not_tessera_s_own_and_goes_with_an_even_split() {
    let sel = |v: serde_json::Value| Some(serde_json::from_value(v).unwrap());
    let mut q = quota(&[], &[("nvidia.com/gpu", 2)]);
    let errs = validate_quota(&q);
    assert!(
        errs.iter().any(|e| e.field == "spec.namespaces" && e.reason.contains("or a spec.namespaceSelector")),
        "{errs:?}"
    );
    q.namespace_selector = sel(serde_json::json!({"matchLabels": {"team": "a"}}));
    assert!(validate_quota(&q).is_empty(), "a selector alone is enough: {:?}", validate_quota(&q));
    for (bad, part) in [
        (serde_json::json!({}), "an empty selector would claim every namespace"),
        (serde_json::json!({"matchLabels": {"tessera.dev/gpu-gate": "open"}}), "which Tessera sets from the quotas"),
        (serde_json::json!({"matchExpressions": [{"key": "team", "operator": "Near"}]}), "is not one of In"),
        (
            serde_json::json!({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["b"]}]}),
            "selects by what namespaces lack",
        ),
        (
            serde_json::json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "Exists"}]}),
            "selects by what namespaces lack",
        ),
    ] {
        q.namespace_selector = sel(bad.clone());
        let errs = validate_quota(&q);
        assert!(
            errs.iter().any(|e| e.field.starts_with("spec.namespaceSelector") && e.reason.contains(part)),
            "{bad}: {errs:?}"
        );
    }
    q.namespace_selector = sel(serde_json::json!({"matchLabels": {"team": "a"}}));
    q.split = SplitPolicy::Explicit;
    let errs = validate_quota(&q);
    assert!(errs.iter().any(|e| e.field == "spec.split" && e.reason.contains("use Even")), "{errs:?}");
    // More than the old cap of 64 names is fine (the schema bounds what is written).
    let many: Vec<String> = (0..100).map(|i| format!("ns-{i}")).collect();
    let q = quota(&many.iter().map(String::as_str).collect::<Vec<_>>(), &[("nvidia.com/gpu", 2)]);
    assert!(validate_quota(&q).is_empty(), "{:?}", validate_quota(&q));
}

#[test]
fn idle_after_is_parsed_and_a_bad_value_named() {
    use crate::quota::parse_idle_after;
    for (good, secs) in [("90s", 90), ("30m", 1800), ("1h", 3600), ("1h30m", 5400), ("1d", 86400), ("30d", 2592000)] {
        assert_eq!(parse_idle_after(good), Ok(secs), "{good}");
    }
    for bad in ["", "1", "h", "1x", "-1h", "0m", "31d", "1.5h", "1h 30m", "99999999999999999999s"] {
        assert!(parse_idle_after(bad).is_err(), "{bad}");
    }
    let mut q = quota(&["a"], &[]);
    q.idle_after = Some("1h".into());
    assert!(validate_quota(&q).is_empty());
    q.idle_after = Some("an hour".into());
    let errs = validate_quota(&q);
    assert_eq!(fields(&errs), vec!["spec.idleAfter"]);
    assert!(errs[0].reason.contains("not a duration like 30m"), "{}", errs[0].reason);
}

#[test]
fn a_good_quota_has_no_errors() {
    let mut q = quota(&["team-a", "team-a-batch"], &[("nvidia.com/mig-1g.10gb", 4), ("nvidia.com/gpu", 1)]);
    q.split = SplitPolicy::Explicit;
    q.namespace_hard.insert("team-a".into(), [("nvidia.com/mig-1g.10gb".to_string(), 3)].into());
    q.physical = Some(PhysicalLimits { compute_slices: Some(8), memory_gb: Some(80) });
    assert_eq!(validate_quota(&q), vec![]);
}

/// `allocation` is read (default `ExtendedResources`, omitted when default) and a bad
/// value is refused naming the field.
#[test]
fn the_allocation_path_is_read_defaulted_and_a_bad_value_named() {
    use crate::quota::{AllocationPath, TenantGpuQuotaSpec};
    let spec = |v: serde_json::Value| serde_json::from_value::<TenantGpuQuotaSpec>(v);
    let plain = spec(serde_json::json!({"namespaces": ["a"], "hard": {}})).unwrap();
    assert_eq!(plain.allocation, AllocationPath::ExtendedResources);
    assert!(serde_json::to_value(&plain).unwrap().get("allocation").is_none());
    let claims = spec(serde_json::json!({"namespaces": ["a"], "hard": {}, "allocation": "ResourceClaims"})).unwrap();
    assert_eq!(claims.allocation, AllocationPath::ResourceClaims);
    assert_eq!(validate_quota(&claims), vec![]);
    let err = spec(serde_json::json!({"namespaces": ["a"], "hard": {}, "allocation": "Claims"})).unwrap_err();
    assert!(err.to_string().contains("unknown variant `Claims`"), "{err}");
}

#[test]
fn quota_errors_name_the_field_and_reason() {
    let mut q = quota(
        &["team-a", "Team_B", "team-a"],
        &[
            ("nvidia.com/mig-1g.11gb", 1),
            ("nvidia.com/mig-3g", 1),
            ("nvidia.com/gpu", -1),
            ("nvidia.com/mig-1g.10gb", 2),
            ("nvidia.com/mig-1G.20GB", 1),
            ("nvidia.com/mig-1g.10gb+me", 1),
        ],
    );
    q.split = SplitPolicy::Explicit;
    q.namespace_hard.insert("team-c".into(), BTreeMap::new());
    q.namespace_hard.insert("team-a".into(), [("nvidia.com/mig-1g.10gb".to_string(), 3)].into());
    q.physical = Some(PhysicalLimits { compute_slices: Some(-2), memory_gb: None });
    let errs = validate_quota(&q);
    let has = |field: &str, part: &str| {
        assert!(
            errs.iter().any(|e| e.field == field && e.reason.contains(part)),
            "missing {field}: {part} in {errs:#?}"
        )
    };
    has("spec.namespaces[1]", "not a valid namespace name");
    has("spec.namespaces[2]", "listed twice");
    has("spec.hard[\"nvidia.com/mig-1g.11gb\"]", "exists on no known GPU");
    has("spec.hard[\"nvidia.com/mig-3g\"]", "is not nvidia.com/gpu or nvidia.com/mig-<profile>");
    has("spec.hard[\"nvidia.com/gpu\"]", "must be >= 0");
    // The CRD's CEL rule refuses other spellings; so does the offline check.
    has("spec.hard[\"nvidia.com/mig-1G.20GB\"]", "write \"nvidia.com/mig-1g.20gb\"");
    has("spec.hard[\"nvidia.com/mig-1g.10gb+me\"]", "write \"nvidia.com/mig-1g.10gb.me\"");
    has("spec.namespaceHard[\"team-c\"]", "not in spec.namespaces");
    has("spec.namespaceHard", "add up to 3, more than spec.hard allows (2)");
    has("spec.physical.computeSlices", "must be >= 0");
}

#[test]
fn schema_bounds_are_checked_offline_too() {
    let many: Vec<(String, i32)> = (1..=13).map(|i| (format!("{i}g.{i}gb"), 0)).collect();
    let mut l = layout("H100-80GB", &[("7g.80gb", 1)], Some((0..17).collect()));
    l.profiles.extend(many);
    let errs = validate_plan(&plan(vec![l]));
    assert!(errs.iter().any(|e| e.field == "spec.layouts[0].profiles" && e.reason.contains("at most 12")), "{errs:?}");
    assert!(
        errs.iter().any(|e| e.field == "spec.layouts[0].gpuIndices" && e.reason.contains("at most 16")),
        "{errs:?}"
    );
}

#[test]
fn namespace_hard_without_explicit_split_is_refused() {
    let mut q = quota(&["a"], &[("nvidia.com/gpu", 1)]);
    q.namespace_hard.insert("a".into(), BTreeMap::new());
    assert_eq!(fields(&validate_quota(&q)), vec!["spec.namespaceHard"]);
}

#[test]
fn every_unknown_profile_is_named_under_its_own_key() {
    let p = plan(vec![layout("H100-80GB", &[("2g.10gb", 1), ("1g.5gb", 2), ("3g.40gb", 1), ("1g.6gb", 0)], None)]);
    let errs = validate_plan(&p);
    assert_eq!(fields(&errs), vec![r#"spec.layouts[0].profiles["1g.5gb"]"#, r#"spec.layouts[0].profiles["2g.10gb"]"#]);
    assert!(errs[0].reason.starts_with("profile \"1g.5gb\" does not exist on H100-80GB; valid profiles: 1g.10gb,"));
}

#[test]
fn exactly_one_of_layouts_and_layouts_from_is_required_and_its_fields_are_checked() {
    let none = plan(vec![]);
    assert_eq!(fields(&validate_plan(&none)), vec!["spec.layouts"]);
    let mut both = plan(vec![layout("H100-80GB", &[("7g.80gb", 1)], None)]);
    both.layouts_from = Some(Default::default());
    assert_eq!(fields(&validate_plan(&both)), vec!["spec.layoutsFrom"]);
    let mut auto = plan(vec![]);
    auto.layouts_from =
        Some(crate::plan::LayoutsFrom { headroom_percent: -1, stabilization_seconds: -5, ..Default::default() });
    assert_eq!(
        fields(&validate_plan(&auto)),
        vec!["spec.layoutsFrom.headroomPercent", "spec.layoutsFrom.stabilizationSeconds"]
    );
    auto.layouts_from = Some(Default::default());
    assert_eq!(validate_plan(&auto), vec![]);
}

/// RTX PRO Blackwell variants: plans name them as NVML does (`+gfx`, `+me.all`, `-me`), quotas as
/// the device plugin does (`+` becomes `.`); the other spelling is refused in each, as for `+me`.
#[test]
fn gfx_profiles_are_named_as_nvml_in_plans_and_as_the_device_plugin_in_quotas() {
    let good = plan(vec![layout(
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        &[("1g.24gb+gfx", 2), ("1g.24gb-me", 1), ("1g.24gb+me.all", 1)],
        None,
    )]);
    assert_eq!(validate_plan(&good), vec![]);
    let bad = plan(vec![layout("RTX-PRO-6000-96GB", &[("1g.24gb.gfx", 1), ("2g.48gb.me.all", 1)], None)]);
    let errs = validate_plan(&bad);
    for (name, nvml) in [("1g.24gb.gfx", "1g.24gb+gfx"), ("2g.48gb.me.all", "2g.48gb+me.all")] {
        assert!(
            errs.iter().any(|e| e.field.contains(name) && e.reason.contains(&format!("write {nvml:?}"))),
            "{name}: {errs:#?}"
        );
    }
    let q = quota(
        &["team-a"],
        &[("nvidia.com/mig-1g.24gb.gfx", 2), ("nvidia.com/mig-1g.24gb-me", 1), ("nvidia.com/mig-2g.48gb.me.all", 1)],
    );
    assert_eq!(validate_quota(&q), vec![]);
    let errs = validate_quota(&quota(&["team-a"], &[("nvidia.com/mig-1g.24gb+gfx", 1)]));
    assert!(errs.iter().any(|e| e.reason.contains("write \"nvidia.com/mig-1g.24gb.gfx\"")), "{errs:#?}");
}
