//! The generated rules, evaluated with a CEL interpreter, against the Rust catalog and solver they
//! are generated from. The real API server runs them in `e2e/tests/admission.rs`.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::solver::ProfileCounts;

fn env() -> Arc<cel::Env> {
    let mut env = cel::Env::stdlib();
    env.add_extension(cel::extensions::strings).unwrap();
    Arc::new(env)
}

/// Every generated rule, compiled once per test thread: (rule, message expression, message).
struct Compiled {
    env: Arc<cel::Env>,
    rules: Vec<(cel::Program, Option<cel::Program>, String)>,
    product_key: cel::Program,
}

thread_local! {
    static COMPILED: Compiled = {
        let env = env();
            let compile = |expr: &str| env.compile(expr).unwrap_or_else(|e| panic!("{e}: {expr}"));
        let rules = layout_rules()
            .iter()
            .map(|r| {
                let message = r.get("messageExpression").map(|m| compile(m.as_str().unwrap()));
                (compile(r["rule"].as_str().unwrap()), message, r["message"].as_str().unwrap().to_string())
            })
            .collect();
        let product_key = compile(&format!("{PRODUCT_KEY}[0]"));
        Compiled { env, rules, product_key }
    };
}

/// JSON as the API server hands it to CEL: integers are `int`, never `uint`.
fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Number(n) => cel::Value::Int(n.as_i64().expect("test numbers are integers")),
        Value::Object(o) => {
            cel::Value::from(o.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect::<std::collections::HashMap<_, _>>())
        }
        Value::Array(a) => cel::Value::List(Arc::new(a.iter().map(to_cel).collect())),
        other => cel::to_value(other).unwrap(),
    }
}

fn run(c: &Compiled, program: &cel::Program, this: &Value) -> cel::Value {
    let mut ctx = cel::Context::with_env(c.env.clone());
    ctx.add_variable_from_value("self", to_cel(this));
    program.execute(&ctx).unwrap_or_else(|e| panic!("{e:?} on {this}"))
}

/// Runs every generated rule on a layout as the API server would: `Err` carries the messages of
/// the rules that failed.
fn admit(layout: &Value) -> Result<(), Vec<String>> {
    COMPILED.with(|c| {
        let mut refused = Vec::new();
        for (rule, message, fallback) in &c.rules {
            match run(c, rule, layout) {
                cel::Value::Bool(true) => {}
                cel::Value::Bool(false) => refused.push(match message.as_ref().map(|m| run(c, m, layout)) {
                    Some(cel::Value::String(s)) => s.to_string(),
                    None => fallback.clone(),
                    Some(other) => panic!("a message must be a string, got {other:?}"),
                }),
                other => panic!("a rule must be a bool, got {other:?}"),
            }
        }
        if refused.is_empty() { Ok(()) } else { Err(refused) }
    })
}

/// The catalog key the CEL normalisation computes for a product string.
fn cel_product_key(product: &str) -> String {
    COMPILED.with(|c| match run(c, &c.product_key, &json!({"gpuProduct": product})) {
        cel::Value::String(s) => s.to_string(),
        other => panic!("{other:?}"),
    })
}

fn layout(product: &str, profiles: &[(&str, u32)]) -> Value {
    let profiles: serde_json::Map<String, Value> = profiles.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    json!({"gpuProduct": product, "migEnabled": true, "profiles": profiles})
}

fn counts_layout(product: &str, counts: &Limits) -> Value {
    layout(product, &counts.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>())
}

#[test]
fn catalog_names_are_plain_literals_and_no_two_boards_share_a_key() {
    let mut owner = BTreeMap::new();
    for m in MODELS {
        for k in product_keys(m) {
            assert!(!k.contains(['\'', '\\']), "{k}");
            assert_eq!(owner.insert(k.clone(), m.name), None, "{k} names two boards");
        }
        for p in m.profiles {
            assert!(!p.name.contains(['\'', '\\']), "{}", p.name);
        }
    }
}

#[test]
fn every_maximal_layout_is_admitted_and_one_more_instance_is_refused() {
    for m in MODELS {
        let maximal = maximal_multisets(m);
        assert!(!maximal.is_empty(), "{}", m.name);
        for set in &maximal {
            let counts: ProfileCounts = set.iter().map(|(k, v)| (k.to_string(), *v)).collect();
            assert!(solver::fit(m, &counts).is_ok(), "{}: {set:?} is maximal but does not fit", m.name);
            assert_eq!(admit(&counts_layout(m.name, set)), Ok(()), "{}: {set:?}", m.name);
            for p in m.profiles {
                let mut grown = set.clone();
                *grown.entry(p.name).or_default() += 1;
                let refused = admit(&counts_layout(m.name, &grown));
                assert!(refused.is_err(), "{}: {grown:?} was admitted", m.name);
            }
        }
    }
}

/// What the fit rule of `model` says about `counts`, and what the solver says.
fn both_verdicts(model: &GpuModel, counts: &ProfileCounts) -> (Result<(), Vec<String>>, String) {
    let profiles: Vec<(&str, u32)> = counts.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let cel = admit(&layout(model.name, &profiles));
    let nonzero: ProfileCounts = counts.iter().filter(|(_, n)| **n > 0).map(|(k, n)| (k.clone(), *n)).collect();
    let solver = match solver::fit(model, &nonzero) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    };
    (cel, solver)
}

/// Checks the rules against the solver on one layout; see `the_rules_agree_with_the_solver`.
fn agree(model: &GpuModel, request: &ProfileCounts) -> Result<(), TestCaseError> {
    let (cel, solver) = both_verdicts(model, request);
    let messages = match cel {
        Ok(()) => {
            prop_assert_eq!(solver, "", "{} admitted {:?}", model.name, request);
            return Ok(());
        }
        Err(messages) => messages,
    };
    prop_assert_eq!(messages.len(), 1, "{:?}", messages);
    let message = &messages[0];
    prop_assert!(!solver.is_empty(), "{} refused a layout that fits: {:?}: {}", model.name, request, message);
    let prefix = format!("does not fit {}: ", model.name);
    prop_assert!(message.starts_with(&prefix), "{}", message);
    let reason = &message[prefix.len()..];
    if solver.contains("does not exist") {
        let head = format!("profiles that do not exist on {}: ", model.name);
        prop_assert!(reason.starts_with(&head), "{}", reason);
        for (k, _) in request.iter().filter(|(k, n)| **n > 0 && model.profile(k).is_none()) {
            let uncatalogued = !catalog_profile_names().contains(&k.as_str());
            let named = reason.contains(k.as_str()) || (uncatalogued && reason.contains("no catalog GPU has"));
            prop_assert!(named, "{} not named in {}", k, reason);
        }
    } else if solver.starts_with("no non-overlapping placement") {
        let head = format!("no non-overlapping placement exists on {}", model.name);
        prop_assert!(reason.starts_with(&head), "{}", reason);
    } else {
        prop_assert_eq!(reason, solver.as_str());
    }
    Ok(())
}

fn foreign_profile() -> impl Strategy<Value = (&'static str, u32)> {
    (proptest::sample::select(vec!["2g.10gb", "1g.6gb", "9g.99gb", "7g.80gb"]), 0u32..=2)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Admission and the solver agree on every layout, and the message gives the solver's reason.
    #[test]
    fn the_rules_agree_with_the_solver(
        board in 0..MODELS.len(),
        counts in proptest::collection::vec(0u32..=3, 11),
        extra in proptest::option::of(foreign_profile()),
        big in proptest::option::of(0usize..7),
    ) {
        let model = &MODELS[board];
        let mut request: ProfileCounts =
            model.profiles.iter().zip(&counts).map(|(p, n)| (p.name.to_string(), *n)).collect();
        if let Some(p) = big.and_then(|i| model.profiles.get(i)) {
            request.insert(p.name.to_string(), u32::from(p.max_count) + 1);
        }
        if let Some((name, n)) = extra {
            request.insert(name.to_string(), n);
        }
        agree(model, &request)?;
    }
}

/// Every reason but the placement one: on an empty GPU of a catalog board the counting rules
/// already refuse whatever cannot be placed (an exhaustive search up to every maximum count finds
/// none).
#[test]
fn each_reason_is_reached() {
    let h100 = catalog::lookup("H100-80GB").unwrap();
    let cases: [(&[(&str, u32)], &str); 5] = [
        (&[("3g.40gb", 3)], "3 x 3g.40gb requested, but one H100-80GB holds at most 2"),
        (
            &[("2g.10gb", 1), ("9g.99gb", 1)],
            "profiles that do not exist on H100-80GB: 2g.10gb, 9g.99gb (no catalog GPU has it); \
             valid profiles: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        ),
        (
            &[("4g.40gb", 1), ("3g.40gb", 1), ("1g.10gb", 1)],
            "the layout needs 8 compute slices, but one H100-80GB has 7",
        ),
        (&[("1g.20gb", 4), ("3g.40gb", 1)], "the layout needs 12 memory slices, but one H100-80GB has 8"),
        (&[("1g.10gb", 65)], "over 64 x 1g.10gb requested, but one H100-80GB holds at most 7"),
    ];
    for (profiles, want) in cases {
        let got = admit(&layout(h100.name, profiles)).unwrap_err();
        assert!(got[0].starts_with(&format!("does not fit H100-80GB: {want}")), "{profiles:?}: {got:?}");
    }
    let a30 = admit(&layout("NVIDIA A30", &[("1g.6gb+me", 1), ("2g.12gb+me", 1)])).unwrap_err();
    assert_eq!(
        a30,
        ["does not fit A30-24GB: 2 instances with media extensions (+me) requested, but a GPU holds at most one"]
    );
}

#[test]
fn whole_gpus_carry_no_instances_on_any_product() {
    for product in ["H100-80GB", "Z900"] {
        let mut l = layout(product, &[("1g.10gb", 1)]);
        l["migEnabled"] = json!(false);
        assert_eq!(
            admit(&l),
            Err(vec!["profiles must be empty when migEnabled is false (whole GPUs have no MIG instances)".to_string()])
        );
        l["profiles"] = json!({"1g.10gb": 0});
        assert_eq!(admit(&l), Ok(()));
    }
}

#[test]
fn products_outside_the_catalog_and_absent_fields_are_left_alone() {
    assert_eq!(admit(&layout("NVIDIA RTX PRO 6000", &[("3g.40gb", 3), ("9g.99gb", 1)])), Ok(()));
    assert_eq!(admit(&json!({"gpuProduct": "H100-80GB"})), Ok(()));
    assert_eq!(admit(&json!({"gpuProduct": "H100-80GB", "profiles": {"7g.80gb": 1}})), Ok(()));
    assert!(admit(&json!({"gpuProduct": "H100-80GB", "profiles": {"7g.80gb": 2}})).is_err());
}

/// A product string as users write them: a catalog alias with its case, separators, padding and
/// GPU Feature Discovery suffixes varied, or arbitrary text.
fn product_string() -> impl Strategy<Value = String> {
    let aliases: Vec<String> = MODELS
        .iter()
        .flat_map(|m| {
            let mut a = vec![m.name.to_string()];
            for n in m.nvml_names {
                a.push(n.to_string());
                a.push(n.trim_start_matches("NVIDIA ").to_string());
            }
            a
        })
        .collect();
    let varied = (
        proptest::sample::select(aliases),
        proptest::collection::vec(any::<bool>(), 32),
        proptest::sample::select(vec!["", " ", "\t", "\u{a0}", "\u{2003}", "x"]),
        proptest::sample::select(vec![
            "",
            "-SHARED",
            "-MIG-1g.10gb",
            "-mig-",
            "-shared-mig-x",
            "-mig-shared",
            "-MIG-3g.40gb-SHARED",
            "-mig--shared",
            "_shared",
            " MIG 2g",
            "x",
            "-",
        ]),
    )
        .prop_map(|(alias, flips, pad, suffix)| {
            let body: String = alias
                .chars()
                .zip(flips.iter().cycle())
                .map(|(c, &flip)| match c {
                    ' ' | '-' if flip => '_',
                    ' ' => '-',
                    c if flip => c.to_ascii_lowercase(),
                    c => c,
                })
                .collect();
            format!("{pad}{body}{suffix}{pad}")
        });
    prop_oneof![3 => varied, 1 => "\\PC{0,40}"]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// The CEL normalisation finds exactly the board `catalog::lookup` finds.
    #[test]
    fn cel_resolves_products_as_lookup_does(product in product_string()) {
            let key = cel_product_key(&product);
        let by_cel = MODELS.iter().find(|m| product_keys(m).contains(&key)).map(|m| m.name);
        prop_assert_eq!(by_cel, catalog::lookup(&product).map(|m| m.name), "{:?} -> {:?}", product, key);
    }
}

/// The RTX PRO 6000's variants share slots: graphics, no-media and plain 1g instances fill the
/// four slots together, and `+me` with `+me.all` is two media-engine instances.
#[test]
fn rtx_pro_6000_variants_share_the_four_slots_and_one_media_instance() {
    let board = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition";
    assert_eq!(admit(&layout(board, &[("1g.24gb+gfx", 2), ("1g.24gb-me", 1), ("1g.24gb", 1)])), Ok(()));
    assert_eq!(admit(&layout(board, &[("2g.48gb+gfx", 1), ("1g.24gb+me.all", 1), ("1g.24gb-me", 1)])), Ok(()));
    let got = admit(&layout(board, &[("1g.24gb+gfx", 2), ("2g.48gb-me", 1), ("1g.24gb", 1)])).unwrap_err();
    assert_eq!(
        got,
        ["does not fit RTX-PRO-6000-96GB: the layout needs 5 compute slices, but one RTX-PRO-6000-96GB has 4"]
    );
    let got = admit(&layout(board, &[("1g.24gb+me", 1), ("1g.24gb+me.all", 1)])).unwrap_err();
    assert!(got[0].contains("2 instances with media extensions (+me) requested"), "{got:?}");
    let got = admit(&layout(board, &[("1g.10gb", 1)])).unwrap_err();
    assert!(got[0].contains("profiles that do not exist on RTX-PRO-6000-96GB: 1g.10gb"), "{got:?}");
}
