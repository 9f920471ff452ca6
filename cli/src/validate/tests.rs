//! `validate` on hostile input: non-objects are errors, and no text or plan-shaped JSON panics.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

fn report(text: &str) -> Report {
    let mut r = Report::default();
    validate_text("f.yaml", text, &mut r);
    r
}

fn lines(r: &Report) -> Vec<String> {
    r.errors.iter().map(ToString::to_string).collect()
}

#[test]
fn documents_that_are_not_kubernetes_objects_are_errors() {
    for (text, want) in [
        ("hello world", "f.yaml:doc 1: (document): a YAML string is not a Kubernetes object"),
        ("42", "f.yaml:doc 1: (document): a YAML number is not a Kubernetes object"),
        ("true", "f.yaml:doc 1: (document): a YAML boolean is not a Kubernetes object"),
        ("- a\n- b", "f.yaml:doc 1: (document): a YAML list is not a Kubernetes object"),
        ("!thing 3", "f.yaml:doc 1: (document): unsupported tag `!thing`"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: !secret {name: x}", "f.yaml:doc 1: (document): unsupported tag"),
        ("{}", "f.yaml:doc 1: apiVersion: is required"),
        ("kind: ConfigMap", "f.yaml:doc 1: apiVersion: is required"),
        ("apiVersion: v1", "f.yaml:doc 1: kind: is required"),
        ("apiVersion: 1\nkind: [x]", "f.yaml:doc 1: apiVersion: must be a string"),
        ("? [a]\n: b\napiVersion: v1\nkind: X", "f.yaml:doc 1: (document): "),
        ("apiVersion: v1\nkind: ConfigMap\n---\njunk", "f.yaml:doc 2: (document): a YAML string is not"),
    ] {
        let r = report(text);
        let got = lines(&r);
        assert!(got.iter().any(|l| l.starts_with(want)), "{text:?}: expected {want:?} in {got:#?}");
        assert!(r.documents.iter().any(|d| !d.valid), "{text:?}: {:?}", r.documents);
    }
    // Empty documents (a trailing `---`, comments only) are not documents at all.
    let r = report("# nothing\n---\n");
    assert!(r.documents.is_empty() && r.errors.is_empty(), "{:?}", r.errors);
}

#[test]
fn every_unknown_profile_is_named() {
    let r = report(
        "apiVersion: tessera.dev/v1alpha1\nkind: GpuPartitionPlan\nmetadata: {name: p}\n\
         spec: {layouts: [{gpuProduct: H100-80GB, profiles: {2g.10gb: 1, 1g.5gb: 2, 3g.40gb: 1}}]}\n",
    );
    let got = lines(&r);
    for p in ["1g.5gb", "2g.10gb"] {
        let want = format!("f.yaml:doc 1: spec.layouts[0].profiles[{p:?}]: profile {p:?} does not exist on H100-80GB");
        assert!(got.iter().any(|l| l.starts_with(&want)), "expected {want:?} in {got:#?}");
    }
}

/// `kubectl apply` refuses unknown fields (strict decoding); the offline gate must too: a plan
/// whose `nodeSelectr` typo passed would take over every node of the product.
#[test]
fn unknown_fields_are_errors_naming_their_path() {
    let r = report(
        "apiVersion: tessera.dev/v1alpha1\nkind: GpuPartitionPlan\nmetadata: {name: p, labls: {a: b}}\n\
         spec: {nodeSelectr: {matchLabels: {pool: h100}}, rollout: {maxUnavailble: 1},\n\
         \x20 layouts: [{gpuProduct: H100-80GB, profiles: {1g.10gb: 7}}]}\n---\n\
         apiVersion: tessera.dev/v1alpha1\nkind: TenantGpuQuota\nmetadata: {name: q}\n\
         spec: {namespaces: [a], namespacs: [b], hard: {nvidia.com/gpu: 1}, physical: {computeSlice: 2}}\n",
    );
    let got = lines(&r);
    for want in [
        "f.yaml:doc 1: metadata.labls: unknown field",
        "f.yaml:doc 1: spec.nodeSelectr: unknown field",
        "f.yaml:doc 1: spec.rollout.maxUnavailble: unknown field",
        "f.yaml:doc 2: spec.namespacs: unknown field",
        "f.yaml:doc 2: spec.physical.computeSlice: unknown field",
    ] {
        assert!(got.iter().any(|l| l.starts_with(want)), "expected {want:?} in {got:#?}");
    }
    assert_eq!(got.len(), 5, "{got:#?}");
    assert!(r.documents.iter().all(|d| !d.valid), "{:?}", r.documents);
}

/// Type errors name their field as every other message does: map keys quoted in brackets.
#[test]
fn type_errors_use_the_one_path_style() {
    let r = report(
        "apiVersion: tessera.dev/v1alpha1\nkind: GpuPartitionPlan\nmetadata: {name: p}\n\
         spec: {layouts: [{gpuProduct: H100-80GB, profiles: {1g.10gb: seven}}]}\n---\n\
         apiVersion: tessera.dev/v1alpha1\nkind: TenantGpuQuota\nmetadata: {name: q}\n\
         spec: {namespaces: [a], hard: {nvidia.com/gpu: 1}, split: Explicit, namespaceHard: {a: {nvidia.com/gpu: x}}}\n",
    );
    let got = lines(&r);
    for want in [
        r#"f.yaml:doc 1: spec.layouts[0].profiles["1g.10gb"]: invalid type: string "seven""#,
        r#"f.yaml:doc 2: spec.namespaceHard["a"]["nvidia.com/gpu"]: invalid type: string "x""#,
    ] {
        assert!(got.iter().any(|l| l.starts_with(want)), "expected {want:?} in {got:#?}");
    }
}

/// A count of 2^31 must be refused by the counting rules before the solver expands the request
/// into one entry per instance; spellings of one profile add up without overflowing.
#[test]
fn huge_counts_are_refused_without_exhausting_memory() {
    let r = report(
        "apiVersion: tessera.dev/v1alpha1\nkind: GpuPartitionPlan\nmetadata: {name: p}\nspec: {layouts: [\n\
         {gpuProduct: H100-80GB, gpuIndices: [0], profiles: {1g.10gb: 2147483647}},\n\
         {gpuProduct: H100-80GB, profiles: {1g.10gb: 2147483647, 1G.10GB: 2147483647, 1g.10GB: 2147483647}}]}\n",
    );
    let got = lines(&r);
    for (i, n) in [(0, "2147483647"), (1, "4294967295")] {
        let want = format!("spec.layouts[{i}].profiles: {n} x 1g.10gb requested, but one H100-80GB holds at most 7");
        assert!(got.iter().any(|l| l.contains(&want)), "expected {want:?} in {got:#?}");
    }
}

#[test]
fn huge_quota_shares_do_not_overflow() {
    let r = report(
        "apiVersion: tessera.dev/v1alpha1\nkind: TenantGpuQuota\nmetadata: {name: q}\n\
         spec: {namespaces: [a, b], hard: {nvidia.com/gpu: 1}, split: Explicit, namespaceHard: {\n\
         a: {nvidia.com/gpu: 9223372036854775807}, b: {nvidia.com/gpu: 9223372036854775807}}}\n",
    );
    let got = lines(&r);
    assert!(got.iter().any(|l| l.contains("spec.namespaceHard: the shares of nvidia.com/gpu add up to")), "{got:#?}");
}

/// The document at 1-based position `doc` of `text` (empty ones not counted), parsed on its own.
fn nth_document(text: &str, doc: usize) -> Option<Value> {
    documents(text).nth(doc - 1)?.ok()
}

/// Whether a document is a mapping with string `apiVersion` and `kind`.
fn is_object(v: &Value) -> bool {
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).is_some_and(|s| !s.is_empty());
    v.is_object() && field("apiVersion") && field("kind")
}

/// YAML-ish token soup: more likely than uniform text to reach the parser's corners.
fn yamlish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("apiVersion: ".to_string()),
        Just("tessera.dev/v1alpha1".to_string()),
        Just("kind: GpuPartitionPlan".to_string()),
        Just("kind: TenantGpuQuota".to_string()),
        Just("\n".to_string()),
        Just("\n---\n".to_string()),
        Just("- ".to_string()),
        Just("  ".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just(": ".to_string()),
        Just(", ".to_string()),
        Just("&a ".to_string()),
        Just("*a".to_string()),
        Just("!!str ".to_string()),
        Just("? ".to_string()),
        Just("spec: ".to_string()),
        Just("layouts: ".to_string()),
        Just("profiles: ".to_string()),
        "[a-z0-9.+\"']{0,8}",
        "-?[0-9]{1,20}",
    ];
    proptest::collection::vec(token, 0..60).prop_map(|t| t.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// No text panics, and a document is valid only if it is a Kubernetes object.
    #[test]
    fn no_text_panics_and_junk_is_never_valid(text in prop_oneof![any::<String>(), "\\PC{0,200}", yamlish()]) {
        let r = report(&text);
        for d in r.documents.iter().filter(|d| d.valid) {
            let doc = nth_document(&text, d.doc);
            prop_assert!(doc.as_ref().is_some_and(is_object), "doc {} of {:?} counted valid: {:?}", d.doc, text, doc);
        }
        for e in &r.errors {
            prop_assert!(!e.field.is_empty() && !e.reason.is_empty(), "{:?}", e);
        }
    }
}

/// A JSON value of any type, integers of every size included.
fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop_oneof![Just(i64::from(i32::MAX)), Just(i64::from(i32::MIN)), -3i64..12].prop_map(Value::from),
        any::<f64>().prop_filter("JSON has no NaN", |f| f.is_finite()).prop_map(Value::from),
        "[a-zA-Z0-9.+%_ -]{0,12}".prop_map(Value::from),
        Just(json!([])),
        Just(json!({})),
    ]
}

fn profile_name() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(vec![
            "1g.10gb",
            "1G.10GB",
            "1g.10GB",
            "3g.40gb",
            "7g.80gb",
            "1g.10gb+me",
            "1g.24gb+gfx",
            "1g.24gb.gfx",
            "2g.48gb+me.all",
            "1g.24gb-me",
            "1g.5gb",
            "2g.10gb"
        ])
        .prop_map(String::from),
        "[0-9]{1,5}g\\.[0-9]{1,5}gb(\\+me|\\.me|\\+gfx|\\.gfx|\\+me\\.all|\\.me\\.all|-me)?",
        "[a-z0-9.+]{0,8}",
    ]
}

fn count() -> impl Strategy<Value = Value> {
    let big = prop_oneof![Just(i64::from(i32::MAX)), Just(i64::from(i32::MIN)), Just(i64::MAX), Just(i64::MIN)];
    prop_oneof![3 => prop_oneof![-2i64..10, big].prop_map(Value::from), 1 => leaf()]
}

fn maybe(v: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    prop_oneof![3 => v, 1 => leaf()]
}

fn layout() -> impl Strategy<Value = Value> {
    (
        maybe(
            proptest::sample::select(vec!["H100-80GB", "NVIDIA A30", "nvidia-a100-sxm4-40gb-mig-1g.5gb", "Z900", ""])
                .prop_map(Value::from),
        ),
        maybe(any::<bool>().prop_map(Value::from)),
        maybe(proptest::collection::btree_map(profile_name(), count(), 0..14).prop_map(|m| json!(m))),
        maybe(proptest::collection::vec(prop_oneof![-2i64..20, any::<i64>()], 0..20).prop_map(|v| json!(v))),
    )
        .prop_map(
            |(p, m, profiles, idx)| json!({"gpuProduct": p, "migEnabled": m, "profiles": profiles, "gpuIndices": idx}),
        )
}

fn plan_spec() -> impl Strategy<Value = Value> {
    (
        maybe(proptest::collection::vec(layout(), 0..36).prop_map(Value::from)),
        maybe(prop_oneof![any::<i64>().prop_map(Value::from), "[0-9%]{0,5}".prop_map(Value::from)]),
        maybe(any::<i64>().prop_map(Value::from)),
        maybe(
            (
                "[a-z./-]{0,6}",
                proptest::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist", "Bogus"]),
                proptest::collection::vec("[a-z]{0,3}", 0..3),
            )
                .prop_map(|(k, op, v)| json!({"matchExpressions": [{"key": k, "operator": op, "values": v}]})),
        ),
    )
        .prop_map(|(layouts, mu, dt, sel)| {
            json!({"layouts": layouts, "nodeSelector": sel,
                   "rollout": {"maxUnavailable": mu, "drainTimeoutSeconds": dt}})
        })
}

fn resource() -> impl Strategy<Value = String> {
    prop_oneof![
        profile_name().prop_map(|p| format!("nvidia.com/mig-{p}")),
        Just("nvidia.com/gpu".to_string()),
        "[a-z./-]{0,12}",
    ]
}

fn quota_spec() -> impl Strategy<Value = Value> {
    let namespaces = proptest::collection::vec("[a-z-]{0,5}", 0..4);
    let hard = proptest::collection::btree_map(resource(), count(), 0..6);
    let shares = proptest::collection::btree_map(
        "[a-z-]{0,5}",
        proptest::collection::btree_map(resource(), count(), 0..4),
        0..3,
    );
    (
        maybe(namespaces.prop_map(|n| json!(n))),
        maybe(hard.prop_map(|h| json!(h))),
        maybe(proptest::sample::select(vec!["Even", "Explicit", "Other"]).prop_map(Value::from)),
        maybe(shares.prop_map(|s| json!(s))),
        maybe((count(), count()).prop_map(|(c, m)| json!({"computeSlices": c, "memoryGB": m}))),
    )
        .prop_map(|(namespaces, hard, split, namespace_hard, physical)| {
            json!({"namespaces": namespaces, "hard": hard, "split": split, "namespaceHard": namespace_hard,
                   "physical": physical})
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Plan- and quota-shaped JSON with any value in any field: no panic, and every problem is
    /// reported with a field and a reason.
    #[test]
    fn no_plan_or_quota_shaped_json_panics(
        plan in plan_spec(),
        quota in quota_spec(),
        name in maybe("[a-z0-9.-]{0,10}".prop_map(Value::from)),
    ) {
        let text: String = [("GpuPartitionPlan", plan), ("TenantGpuQuota", quota)]
            .into_iter()
            .map(|(kind, spec)| {
                let doc = json!({"apiVersion": "tessera.dev/v1alpha1", "kind": kind,
                                 "metadata": {"name": name}, "spec": spec});
                format!("---\n{doc}\n")
            })
            .collect();
        let r = report(&text);
        prop_assert_eq!(r.documents.len(), 2);
        for e in &r.errors {
            prop_assert!(!e.field.is_empty() && !e.reason.is_empty(), "{:?}", e);
        }
    }
}

fn quota_doc(name: &str, namespaces: &str) -> String {
    format!(
        "apiVersion: tessera.dev/v1alpha1\nkind: TenantGpuQuota\nmetadata: {{name: {name}}}\n\
         spec: {{namespaces: {namespaces}, hard: {{nvidia.com/gpu: 1}}}}\n"
    )
}

/// Two quotas claiming one namespace each validate on their own, but once applied neither is
/// enforced there (the controller's rule): over a set of files the claim is an error on both.
#[test]
fn a_namespace_claimed_by_two_quotas_is_an_error_on_both() {
    let mut r = Report::default();
    validate_text("a.yaml", &quota_doc("a", "[own-a, shared]"), &mut r);
    validate_text(
        "b.yaml",
        &format!("{}---\n{}", quota_doc("b", "[shared, shared]"), quota_doc("c", "[own-c]")),
        &mut r,
    );
    assert!(r.errors.iter().all(|e| e.field == "spec.namespaces[1]" && e.doc == 1), "{:?}", r.errors);
    assert_eq!(r.errors.len(), 1, "b lists shared twice: its own error, before any conflict: {:?}", r.errors);
    r.finish();
    let got = lines(&r);
    for want in [
        r#"a.yaml:doc 1: spec.namespaces[1]: namespace "shared" is also claimed by TenantGpuQuota "b" (b.yaml:doc 1)"#,
        r#"b.yaml:doc 1: spec.namespaces[0]: namespace "shared" is also claimed by TenantGpuQuota "a" (a.yaml:doc 1)"#,
    ] {
        assert!(got.iter().any(|l| l.starts_with(want)), "expected {want:?} in {got:#?}");
    }
    assert_eq!(got.len(), 3, "one conflict error per quota, not per listing: {got:#?}");
    let valid: Vec<(&str, bool)> = r.documents.iter().map(|d| (d.name.as_str(), d.valid)).collect();
    assert_eq!(valid, [("a", false), ("b", false), ("c", true)]);
}

/// The same quota in two documents is one object applied twice, not two claims; quotas of
/// other API groups claim nothing.
#[test]
fn one_quota_twice_or_a_foreign_kind_is_no_conflict() {
    let mut r = Report::default();
    validate_text("a.yaml", &quota_doc("a", "[shared]"), &mut r);
    validate_text("a-copy.yaml", &quota_doc("a", "[shared]"), &mut r);
    let foreign = quota_doc("x", "[shared]").replace("tessera.dev/v1alpha1", "example.com/v1");
    validate_text("x.yaml", &foreign, &mut r);
    r.finish();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}
