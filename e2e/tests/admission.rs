//! Admission on the real API server: the CEL rules generated from the MIG catalog refuse layouts
//! that cannot fit the product they name.

use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tessera_crds::GpuPartitionPlan;
use tessera_crds::admission::{Limits, maximal_multisets};
use tessera_crds::catalog::MODELS;
use tessera_e2e::fixtures::{apply_file, install_crds};
use tessera_e2e::{ControlPlane, Identity};

fn plan(name: &str, layouts: Vec<Value>) -> GpuPartitionPlan {
    serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan",
        "metadata": {"name": name}, "spec": {"layouts": layouts}}))
    .expect("a plan")
}

fn layout(product: &str, profiles: Value) -> Value {
    json!({"gpuProduct": product, "profiles": profiles})
}

fn counts(set: &Limits) -> Value {
    Value::Object(set.iter().map(|(k, v)| (k.to_string(), json!(v))).collect())
}

/// Creates the plan; the API server's refusal (422 Invalid) as its message, or `None` if stored.
async fn create(api: &Api<GpuPartitionPlan>, p: &GpuPartitionPlan, dry_run: bool) -> Option<String> {
    match api.create(&PostParams { dry_run, ..Default::default() }, p).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) if s.code == 422 => Some(s.message),
        Err(e) => panic!("{}: unexpected error {e}", p.name_any()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_layouts_that_cannot_fit_their_catalog_product() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    install_crds(&admin).await.unwrap();
    let plans: Api<GpuPartitionPlan> = Api::all(admin.clone());
    let refused: [(Vec<Value>, &str); 9] = [
        (
            vec![layout("H100-80GB", json!({"3g.40gb": 3}))],
            "spec.layouts[0].profiles: Invalid value: \"object\": does not fit H100-80GB: 3 x 3g.40gb requested, \
             but one H100-80GB holds at most 2",
        ),
        (
            vec![layout("NVIDIA-H100-80GB-HBM3", json!({"3g.40gb": 1, "2g.10gb": 1}))],
            "does not fit H100-80GB: profiles that do not exist on H100-80GB: 2g.10gb; valid profiles: 1g.10gb, \
             1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        ),
        (
            vec![layout("nvidia a30", json!({"1g.6gb": 5}))],
            "does not fit A30-24GB: 5 x 1g.6gb requested, but one A30-24GB holds at most 4",
        ),
        (
            vec![layout("A30-24GB", json!({"2g.12gb": 2, "1g.6gb": 1}))],
            "does not fit A30-24GB: the layout needs 5 compute slices, but one A30-24GB has 4",
        ),
        (
            vec![layout("NVIDIA A30", json!({"1g.6gb+me": 1, "2g.12gb+me": 1}))],
            "does not fit A30-24GB: 2 instances with media extensions (+me) requested, but a GPU holds at most one",
        ),
        (
            vec![layout("H100-80GB", json!({"1g.10gb+me": 2}))],
            "does not fit H100-80GB: 2 x 1g.10gb+me requested, but one H100-80GB holds at most 1",
        ),
        (
            vec![json!({"gpuProduct": "H100-80GB", "migEnabled": false, "profiles": {"1g.10gb": 1}})],
            "spec.layouts[0].profiles: Invalid value: \"object\": profiles must be empty when migEnabled is false",
        ),
        (
            // A GFD label with its MIG suffix, padded with a no-break space, in the second layout.
            vec![
                layout("A100-40GB", json!({"7g.40gb": 1})),
                layout("\u{a0}NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", json!({"3g.20gb": 2, "1g.5gb": 1})),
            ],
            "spec.layouts[1].profiles: Invalid value: \"object\": does not fit A100-40GB: the layout needs 9 memory \
             slices, but one A100-40GB has 8",
        ),
        (
            vec![layout("B200-180GB", json!({"9g.99gb": 1}))],
            "profiles that do not exist on B200-180GB: profiles that no catalog GPU has",
        ),
    ];
    for (i, (layouts, want)) in refused.into_iter().enumerate() {
        let p = plan(&format!("refused-{i}"), layouts);
        let msg = create(&plans, &p, false).await.unwrap_or_else(|| panic!("{} was accepted", p.name_any()));
        assert!(msg.contains(want), "{}: expected {want:?} in {msg:?}", p.name_any());
    }
    assert!(plans.list(&Default::default()).await.unwrap().items.is_empty(), "nothing refused was stored");

    // Products outside the catalog stay allowed; the operator checks them against the agent's table.
    let unknown = plan("new-board", vec![layout("NVIDIA RTX PRO 6000 Blackwell", json!({"3g.40gb": 3, "9g.99gb": 1}))]);
    assert_eq!(create(&plans, &unknown, false).await, None);
    // The samples still apply.
    for f in ["gpupartitionplan-inference", "gpupartitionplan-training", "tenantgpuquota-team-a"] {
        apply_file(&admin, &format!("config/samples/{f}.yaml")).await.unwrap();
    }
    assert_eq!(plans.list(&Default::default()).await.unwrap().items.len(), 3);

    // Every board: each maximal layout is admitted, and one instance more of any profile is not.
    for m in MODELS {
        let maximal = maximal_multisets(m);
        let mut grown = Vec::new();
        for set in &maximal {
            for p in m.profiles {
                let mut g = set.clone();
                *g.entry(p.name).or_default() += 1;
                grown.push(g);
            }
        }
        for chunk in maximal.chunks(32) {
            let p = plan("sweep", chunk.iter().map(|s| layout(m.name, counts(s))).collect());
            assert_eq!(create(&plans, &p, true).await, None, "{}: a maximal layout was refused", m.name);
        }
        for chunk in grown.chunks(32) {
            let p = plan("sweep", chunk.iter().map(|s| layout(m.name, counts(s))).collect());
            let msg = create(&plans, &p, true).await.unwrap_or_else(|| panic!("{}: {chunk:?} accepted", m.name));
            let refusals = msg.matches(&format!("does not fit {}: ", m.name)).count();
            assert_eq!(refusals, chunk.len(), "{}: every layout over a maximal one is refused: {msg}", m.name);
        }
    }
}
