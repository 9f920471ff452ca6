//! The quota passes do not wait for the unbound-pod cache: an upgrade that replaces the image but
//! not the ClusterRole (without `watch pods`) would hold every pass forever: no ResourceQuota for
//! a namespace added to a quota, lowered limits never written, nothing on the status.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};
use tessera_crds::TenantGpuQuota;
use tessera_crds::conditions::{READY, find};

use super::super::pending_pods::{POD_WATCH_FAILING, POD_WATCH_MESSAGE};
use super::super::*;
use crate::quota_controller::test_support::{Requests, store_of};

/// The last body written to `path` with PATCH.
fn patched(requests: &Requests, path: &str) -> Value {
    let requests = requests.lock().unwrap();
    let (_, _, body) = requests.iter().rev().find(|(m, p, _)| m == "PATCH" && p == path).expect(path);
    body.clone()
}

fn ready(requests: &Requests) -> Condition {
    let body = patched(requests, "/apis/tessera.dev/v1alpha1/tenantgpuquotas/team-a/status");
    let st: TenantGpuQuotaStatus = serde_json::from_value(body["status"].clone()).unwrap();
    find(&st.conditions, READY).expect("Ready").clone()
}

/// Not listed: the pass writes `x`'s ResourceQuota, carries the stored `x.pods` (the cache's
/// pods unknown: not listed; `gone` no tenant any more), and `Ready` names `watch pods` and the
/// ClusterRole. Listed: `x.pods` is computed from the cache and `Ready` says nothing of it.
#[tokio::test]
async fn passes_go_on_while_pods_are_not_listed_carrying_the_stored_pods_and_saying_so() {
    let q: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "team-a", "uid": "uid-a", "generation": 1},
        "spec": {"namespaces": ["x"], "hard": {"nvidia.com/gpu": 2}}}))
    .unwrap();
    let x: Namespace = serde_json::from_value(json!({"metadata": {"name": "x", "uid": "uid-x"}})).unwrap();
    let stored: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "tessera-claim-classes",
        "namespace": "tessera-system"}, "data": {"x.quota": "team-a", "x.pods": "hoard", "gone.pods": "old"}}))
    .unwrap();
    let early: Pod = serde_json::from_value(json!({"metadata": {"name": "made-later", "namespace": "x",
        "creationTimestamp": "2026-01-01T00:00:00Z"}}))
    .unwrap();
    let (client, requests) = crate::quota_controller::test_support::recording_api(|_, _, _| None);
    let mut c = QuotaController::from_stores(client, store_of(vec![q]), store_of(vec![]), store_of(vec![x]))
        .with_dra(store_of(vec![]), store_of(vec![stored]));
    let (pods, mut writer) = kube::runtime::reflector::store::<Pod>();
    writer.apply_watcher_event(&Event::Apply(early.clone()));
    c.pods = pods;

    let _ = c.reconcile().await;
    assert!(
        requests
            .lock()
            .unwrap()
            .iter()
            .any(|(m, p, _)| m == "PATCH" && p.starts_with("/api/v1/namespaces/x/resourcequotas/")),
        "x's ResourceQuota is written"
    );
    let params = patched(&requests, "/api/v1/namespaces/tessera-system/configmaps/tessera-claim-classes");
    assert_eq!(params["data"]["x.pods"], "hoard", "{params}");
    assert_eq!(params["data"].get("gone.pods"), None, "{params}");
    let r = ready(&requests);
    assert_eq!((r.status.as_str(), r.reason.as_str()), ("False", POD_WATCH_FAILING));
    assert_eq!(r.message, POD_WATCH_MESSAGE);
    assert!(r.message.contains("`watch pods`") && r.message.contains("apply the ClusterRole"), "{}", r.message);

    for ev in [Event::Init, Event::InitApply(early), Event::InitDone] {
        writer.apply_watcher_event(&ev);
    }
    requests.lock().unwrap().clear();
    let _ = c.reconcile().await;
    let params = patched(&requests, "/api/v1/namespaces/tessera-system/configmaps/tessera-claim-classes");
    assert_eq!(params["data"]["x.pods"], "made-later", "{params}");
    let r = ready(&requests);
    assert!(r.reason != POD_WATCH_FAILING && !r.message.contains(POD_WATCH_MESSAGE), "{r:?}");
}

/// Where `Ready` is already `False` for another reason, that reason stays and the message adds
/// the pod watch's.
#[test]
fn an_earlier_ready_problem_keeps_its_reason() {
    use tessera_crds::conditions::set_condition;
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let mut st = TenantGpuQuotaStatus::default();
    set_condition(&mut st.conditions, READY, false, "WriteFailed", "retrying: denied", Some(1), now.clone());
    pending_pods::report_pod_watch(&mut st, false, Some(1), &now);
    let r = find(&st.conditions, READY).unwrap();
    assert_eq!(
        (r.reason.as_str(), r.message.clone()),
        ("WriteFailed", format!("retrying: denied; {POD_WATCH_MESSAGE}"))
    );
    let before = st.clone();
    pending_pods::report_pod_watch(&mut st, true, Some(1), &now);
    assert_eq!(st, before, "listed: nothing changes");
}
