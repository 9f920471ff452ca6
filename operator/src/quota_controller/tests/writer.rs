//! The quota controller's writes through a whole pass, against a fake API server: a refused write
//! fails only its quota, and classes and params are written only when they differ.

use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::json;
use tessera_crds::conditions::{READY, RECONCILING, find};
use tessera_crds::quota::TenantGpuQuotaStatus;
use tessera_planner::dra::GpuDrivers;
use tessera_planner::quota::claims::managed_class;

use super::super::QuotaController;
use super::super::test_support::{api_refusing_writes_in_locked, ours, quota, store_of};

fn cond<'a>(st: &'a TenantGpuQuotaStatus, t: &str) -> &'a Condition {
    find(&st.conditions, t).unwrap_or_else(|| panic!("no {t} in {:?}", st.conditions))
}

fn nvidia() -> GpuDrivers {
    GpuDrivers::default()
}

#[tokio::test]
async fn one_failing_write_fails_only_its_quota_and_nothing_is_deleted_where_it_failed() {
    // `a`'s share sits under the fallback name and moves back to `tessera-a`; that write is
    // refused, so the fallback must stay, and so must a gone quota's leftover there (it may be the
    // only limit left). `b` is unaffected: applied, its stale one deleted.
    let a = quota("a", json!({"namespaces": ["locked"], "hard": {"nvidia.com/mig-1g.10gb": 4}}));
    let b = quota("b", json!({"namespaces": ["open"], "hard": {"nvidia.com/mig-1g.10gb": 2}}));
    let mut a_fallback = ours("a", "locked", "0");
    a_fallback.metadata.name = Some("tessera-a-uida".into());
    let rqs = vec![a_fallback, ours("gone", "locked", "0"), ours("b", "retired", "0")];
    let namespaces: Vec<k8s_openapi::api::core::v1::Namespace> = ["locked", "open", "retired"]
        .iter()
        .map(|n| serde_json::from_value(json!({"metadata": {"name": n}})).unwrap())
        .collect();
    let (client, requests) = api_refusing_writes_in_locked();
    let controller = QuotaController::from_stores(client, store_of(vec![a, b]), store_of(rqs), store_of(namespaces));

    let result = controller.reconcile().await;
    assert!(matches!(result, Err(crate::Error::PartialPass(1))), "{result:?}");
    let requests = requests.lock().unwrap().clone();
    let asked = |method: &str, path: &str| requests.iter().any(|(m, p, _)| m == method && p == path);
    assert!(asked("PATCH", "/api/v1/namespaces/locked/resourcequotas/tessera-a"), "{requests:?}");
    assert!(asked("PATCH", "/api/v1/namespaces/open/resourcequotas/tessera-b"), "{requests:?}");
    assert!(asked("DELETE", "/api/v1/namespaces/retired/resourcequotas/tessera-b"), "{requests:?}");
    assert!(!asked("DELETE", "/api/v1/namespaces/locked/resourcequotas/tessera-a-uida"), "the share stays enforced");
    assert!(
        !asked("DELETE", "/api/v1/namespaces/locked/resourcequotas/tessera-gone"),
        "nothing goes where a write failed"
    );
    let status = |q: &str| -> TenantGpuQuotaStatus {
        let path = format!("/apis/tessera.dev/v1alpha1/tenantgpuquotas/{q}/status");
        let (_, _, body) = requests.iter().find(|(m, p, _)| m == "PATCH" && *p == path).expect("status written");
        serde_json::from_value(body["status"].clone()).unwrap()
    };
    let (a, b) = (status("a"), status("b"));
    assert_eq!((cond(&b, READY).status.as_str(), cond(&b, READY).reason.as_str()), ("True", "Enforced"));
    assert_eq!((cond(&a, READY).status.as_str(), cond(&a, READY).reason.as_str()), ("False", "WriteFailed"));
    let msg = &cond(&a, RECONCILING).message;
    assert!(msg.starts_with("retrying: ResourceQuota tessera-a in locked: ") && msg.contains("lock-quotas"), "{msg}");
}

/// The writer: Tessera's classes and the policy params are applied when they differ from the
/// cluster's, and not written again when they are current.
#[tokio::test]
async fn the_controller_applies_missing_classes_and_params_and_leaves_current_ones() {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};

    let q = quota(
        "team-b",
        json!({"namespaces": ["b"], "hard": {"nvidia.com/mig-1g.10gb": 3}, "allocation": "ResourceClaims"}),
    );
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "b"}})).unwrap();
    let requests_for = |classes: Vec<DeviceClass>, params: Vec<ConfigMap>| {
        let (q, ns) = (q.clone(), ns.clone());
        async move {
            let (client, requests) = api_refusing_writes_in_locked();
            let c = QuotaController::from_stores(client, store_of(vec![q]), store_of(vec![]), store_of(vec![ns]))
                .with_dra(store_of(classes), store_of(params));
            let _ = c.reconcile().await;
            let r = requests.lock().unwrap().clone();
            r.into_iter().filter(|(m, _, _)| m == "PATCH").map(|(_, p, b)| (p, b)).collect::<Vec<_>>()
        }
    };
    let first = requests_for(vec![], vec![]).await;
    let class_path = "/apis/resource.k8s.io/v1/deviceclasses/mig-1g.10gb.tessera.dev";
    let (_, body) = first.iter().find(|(p, _)| p == class_path).expect("our class applied");
    assert_eq!(body["metadata"]["labels"]["app.kubernetes.io/managed-by"], "tessera");
    let want = managed_class("nvidia.com/mig-1g.10gb", &nvidia()).unwrap().expression;
    assert_eq!(body["spec"]["selectors"][0]["cel"]["expression"], json!(want));
    let cm_path = "/api/v1/namespaces/tessera-system/configmaps/tessera-claim-classes";
    let (_, params) = first.iter().find(|(p, _)| p == cm_path).expect("params written");
    assert_eq!(params["data"]["b.quota"], "team-b");

    // What the first pass wrote, read back: nothing of it is written again.
    let classes: Vec<DeviceClass> = first
        .iter()
        .filter(|(p, _)| p.starts_with("/apis/resource.k8s.io/v1/deviceclasses/"))
        .map(|(_, b)| serde_json::from_value(b.clone()).unwrap())
        .collect();
    let cm: ConfigMap = serde_json::from_value(params.clone()).unwrap();
    let second = requests_for(classes.clone(), vec![cm]).await;
    assert!(!second.iter().any(|(p, _)| p.contains("/deviceclasses/")), "{second:?}");
    // The params change once: our classes now exist and are listed as GPU-reaching.
    let (_, params) = second.iter().find(|(p, _)| p == cm_path).expect("params list the new classes");
    assert!(params["data"]["_reaching"].as_str().unwrap().contains("mig-1g.10gb.tessera.dev"));
    let mut cm: ConfigMap = serde_json::from_value(params.clone()).unwrap();
    let again = requests_for(classes.clone(), vec![cm.clone()]).await;
    assert!(!again.iter().any(|(p, _)| p.contains("/deviceclasses/") || p == cm_path), "{again:?}");
    // Params edited by hand are written back.
    cm.data.as_mut().unwrap().insert("b.allowed".into(), "mig.nvidia.com".into());
    let fixed = requests_for(classes, vec![cm]).await;
    assert!(fixed.iter().any(|(p, _)| p == cm_path), "{fixed:?}");
}
