//! The idle figures through a whole quota pass, against a fake API server.

use k8s_openapi::api::core::v1::Namespace;
use serde_json::{Value, json};
use tessera_crds::quota::TenantGpuQuotaStatus;

use super::*;
use crate::quota_controller::test_support::{Requests, store_of};

mod policy_match;

mod binding_policy;
mod claim_policy;
mod deleted;
mod early_claim;
mod gates;
mod leader;
mod pod_policy;
mod pod_watch;
mod stale_params;
mod stamp;
mod start;
mod writer;

/// A client whose API server answers the pod list with `pods` (or a 500 when `None`) and
/// accepts every write, recording each request.
fn api(pods: Option<Value>) -> (Client, Requests) {
    crate::quota_controller::test_support::recording_api(move |method, path, _| match (method, path, &pods) {
        ("GET", "/api/v1/pods", Some(items)) => {
            Some((200, json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})))
        }
        ("GET", "/api/v1/pods", None) => Some((500, json!({"kind": "Status", "apiVersion": "v1", "code": 500}))),
        _ => None,
    })
}

/// [`controller_before_verdicts`] after the rollout pass published its first verdicts (none dead).
fn controller(client: Client, previous: Option<Value>) -> QuotaController {
    let c = controller_before_verdicts(client, previous);
    let verdicts = tessera_planner::idle::gate::Verdicts::default();
    verdicts.publish(std::iter::empty(), k8s_openapi::jiff::Timestamp::now(), up());
    c.with_not_reporting(verdicts)
}

/// A lease watch caught up long ago.
fn up() -> tessera_planner::liveness::LeaseWatch {
    tessera_planner::liveness::LeaseWatch::CaughtUp("2026-01-01T00:00:00Z".parse().unwrap())
}

fn controller_before_verdicts(client: Client, previous: Option<Value>) -> QuotaController {
    let mut q: TenantGpuQuota = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1",
        "kind": "TenantGpuQuota", "metadata": {"name": "ml", "uid": "uid-ml", "generation": 1},
        "spec": {"namespaces": ["ml"], "hard": {"nvidia.com/mig-3g.40gb": 2}, "idleAfter": "30m"}}))
    .unwrap();
    q.status = previous.map(|a| serde_json::from_value(json!({"activity": a})).unwrap());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "ml"}})).unwrap();
    let node: GpuNode = serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "n1"}, "spec": {}, "status": {
            "gpus": [{"index": 0, "uuid": "GPU-0", "product": "NVIDIA H100 80GB HBM3", "migCapable": true,
                      "migEnabled": true, "instances": [{"profile": "3g.40gb", "start": 0, "size": 4}]}],
            "activity": {"devices": [{"gpuIndex": 0, "profile": "3g.40gb", "start": 0, "source": "Gpm",
                                      "idleSince": "2020-01-01T00:00:00Z", "memoryUsedMib": 300, "processes": 1}]}}}))
    .unwrap();
    let mut c = QuotaController::from_stores(client, store_of(vec![q]), store_of(vec![]), store_of(vec![ns]));
    c.gpunodes = store_of(vec![node]);
    c
}

fn written_activity(requests: &Requests) -> Option<Value> {
    let requests = requests.lock().unwrap();
    let path = "/apis/tessera.dev/v1alpha1/tenantgpuquotas/ml/status";
    let (_, _, body) = requests.iter().find(|(m, p, _)| m == "PATCH" && p == path).expect("status written");
    let status: TenantGpuQuotaStatus = serde_json::from_value(body["status"].clone()).unwrap();
    status.activity.map(|a| serde_json::to_value(a).unwrap())
}

#[tokio::test]
async fn the_quota_status_write_carries_the_tenants_idle_slices() {
    let pod = json!({"metadata": {"name": "nb", "namespace": "ml"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c",
                 "resources": {"limits": {"nvidia.com/mig-3g.40gb": 1}}}]},
        "status": {"phase": "Running"}});
    let (client, requests) = api(Some(json!([pod])));
    let c = controller(client, None);
    c.reconcile().await.unwrap();
    let a = written_activity(&requests).expect("activity written");
    assert_eq!((a["idleAfter"].as_str(), a["allocated"].as_i64(), a["idle"].as_i64()), (Some("30m"), Some(1), Some(1)));
    assert_eq!(a["idleHolders"][0]["pod"], "ml/nb");
    assert_eq!(a["idleHolders"][0]["memoryUsedMib"], 300);
    assert!(c.metrics.render().contains("tessera_operator_tenant_slices{tenant=\"ml\",state=\"idle\"} 1"));
}

#[tokio::test]
async fn a_node_whose_agent_the_rollout_judged_dead_is_named_and_its_device_unmeasured() {
    let pod = json!({"metadata": {"name": "nb", "namespace": "ml"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c",
                 "resources": {"limits": {"nvidia.com/mig-3g.40gb": 1}}}]},
        "status": {"phase": "Running"}});
    let (client, requests) = api(Some(json!([pod])));
    let c = controller_before_verdicts(client, None);
    let since: k8s_openapi::jiff::Timestamp = "2026-06-01T11:00:00Z".parse().unwrap();
    let verdicts = tessera_planner::idle::gate::Verdicts::default();
    let dead = tessera_planner::liveness::AgentHealth::NotResponding { since: Some(since) };
    verdicts.publish([("n1", &dead, None)].into_iter(), k8s_openapi::jiff::Timestamp::now(), up());
    let c = c.with_not_reporting(verdicts);
    c.reconcile().await.unwrap();
    let a = written_activity(&requests).expect("activity written");
    assert_eq!((a["allocated"].as_i64(), a["idle"].as_i64(), a["unmeasured"].as_i64()), (Some(1), Some(0), Some(1)));
    assert!(a.get("idleHolders").is_none(), "{a}");
    assert_eq!(a["notReporting"], json!([{"node": "n1", "since": "2026-06-01T11:00:00Z"}]));
    assert!(c.metrics.render().contains("tessera_operator_tenant_slices{tenant=\"ml\",state=\"unmeasured\"} 1"));
}

fn idle_pod() -> Value {
    json!({"metadata": {"name": "nb", "namespace": "ml"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c",
                 "resources": {"limits": {"nvidia.com/mig-3g.40gb": 1}}}]},
        "status": {"phase": "Running"}})
}

const CERTAIN: &str = "tessera_operator_tenant_idle_since_timestamp_seconds{tenant=\"ml\",certain=\"true\"}";

/// The quota gone (or no node measuring any more): its idle series goes too, else
/// `TesseraSlicesIdle` would fire until the operator restarts.
#[tokio::test]
async fn deleting_the_last_quota_or_every_measurement_clears_the_tenants_series() {
    let (client, _) = api(Some(json!([idle_pod()])));
    let mut c = controller(client.clone(), None);
    c.reconcile().await.unwrap();
    assert!(c.metrics.render().contains(CERTAIN), "{}", c.metrics.render());
    c.quotas = store_of(vec![]);
    let _ = c.reconcile().await;
    assert!(!c.metrics.render().contains("tessera_operator_tenant_"), "{}", c.metrics.render());

    let (client, requests) = api(Some(json!([idle_pod()])));
    let mut c = controller(client, None);
    c.reconcile().await.unwrap();
    assert!(c.metrics.render().contains(CERTAIN));
    let mut node = (*c.gpunodes.state()[0]).clone();
    node.status.as_mut().unwrap().activity = None;
    c.gpunodes = store_of(vec![node]);
    requests.lock().unwrap().clear();
    let _ = c.reconcile().await;
    assert!(!c.metrics.render().contains("tessera_operator_tenant_"), "{}", c.metrics.render());
    assert_eq!(written_activity(&requests), None, "the quota lists no idle holder nobody measures");
}

/// After an operator start, before the rollout pass judged the agents, a dead agent's last
/// summary is not read: nothing is reported, the quota keeps its figures.
#[tokio::test]
async fn no_idle_report_before_the_rollout_pass_publishes_its_verdicts() {
    let previous = json!({"idleAfter": "30m", "allocated": 1, "active": 0, "idle": 0, "unmeasured": 1});
    let (client, requests) = api(Some(json!([idle_pod()])));
    let c = controller_before_verdicts(client, Some(previous.clone()));
    let _ = c.reconcile().await;
    let lists = requests.lock().unwrap().iter().filter(|(m, p, _)| m == "GET" && p == "/api/v1/pods").count();
    assert_eq!(lists, 0, "no report computed");
    assert_eq!(written_activity(&requests), Some(previous), "the previous figures stay");
    assert!(!c.metrics.render().contains("tessera_operator_tenant_"), "{}", c.metrics.render());
}

/// Verdicts of rollout passes that stopped (tenure not held) or of a lease watch
/// that is down make no report: the report timestamp stays where it was, so the alert sees it age.
#[tokio::test]
async fn old_verdicts_or_a_lease_watch_down_make_no_report_and_leave_the_timestamp_alone() {
    let previous = json!({"idleAfter": "30m", "allocated": 1, "active": 0, "idle": 0, "unmeasured": 1});
    let now = k8s_openapi::jiff::Timestamp::now();
    let old = now
        .checked_sub(tessera_planner::idle::gate::VERDICTS_MAX_AGE + k8s_openapi::jiff::SignedDuration::from_secs(1));
    for (at, watch) in [(old.unwrap(), up()), (now, tessera_planner::liveness::LeaseWatch::Down)] {
        let (client, requests) = api(Some(json!([idle_pod()])));
        let c = controller_before_verdicts(client, Some(previous.clone()));
        let verdicts = tessera_planner::idle::gate::Verdicts::default();
        verdicts.publish(std::iter::empty(), at, watch);
        let c = c.with_not_reporting(verdicts);
        let _ = c.reconcile().await;
        let lists = requests.lock().unwrap().iter().filter(|(m, p, _)| m == "GET" && p == "/api/v1/pods").count();
        assert_eq!(lists, 0, "no report computed ({watch:?})");
        assert_eq!(written_activity(&requests), Some(previous.clone()), "the previous figures stay");
        let text = c.metrics.render();
        assert!(text.contains("tessera_operator_idle_report_timestamp_seconds 0"), "{text}");
    }
}

#[tokio::test]
async fn pods_that_cannot_be_listed_keep_the_figures_the_quota_had() {
    let previous = json!({"idleAfter": "30m", "allocated": 4, "active": 1, "idle": 3, "unmeasured": 0});
    let (client, requests) = api(None);
    let c = controller(client, Some(previous.clone()));
    let _ = c.reconcile().await;
    assert_eq!(written_activity(&requests), Some(previous), "kept, not dropped or zeroed");
}

#[tokio::test]
async fn a_failed_pod_list_is_not_retried_every_pass() {
    let (client, requests) = api(None);
    let c = controller(client, None);
    let _ = c.reconcile().await;
    let _ = c.reconcile().await;
    let lists = requests.lock().unwrap().iter().filter(|(m, p, _)| m == "GET" && p == "/api/v1/pods").count();
    assert_eq!(lists, 1, "the second pass waits out IDLE_REFRESH");
}

/// The pass reads the claim cache: a device `ml` holds through `mig.nvidia.com` (claimed before
/// it joined) comes off the share its ResourceQuota is written with. No slice lists it, so it
/// counts against every resource of the share.
#[tokio::test]
async fn devices_held_through_other_classes_come_off_the_written_share() {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let claim: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": "old", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0-mig-9-0-4"}]}}}}))
    .unwrap();
    let (client, requests) = api(Some(json!([])));
    let c = controller(client, None);
    let c = c.with_claims(crate::controller::claims::ClaimCache::of(store_of(vec![claim]), GpuDrivers::default()));
    c.reconcile().await.unwrap();
    let body = written_ml_quota(&requests);
    assert_eq!(body["spec"]["hard"]["requests.nvidia.com/mig-3g.40gb"], "1", "share 2 less the 1 held: {body}");
}

/// The pass also counts claims of such classes that are not allocated (made before `ml` joined,
/// a pod may use them later with no quota check): `stash` may take one device of any resource,
/// so it comes off the written share too.
#[tokio::test]
async fn unallocated_claims_of_other_classes_come_off_the_written_share() {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let claim: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": "stash", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}}))
    .unwrap();
    let (client, requests) = api(Some(json!([])));
    let c = controller(client, None);
    let c = c.with_claims(crate::controller::claims::ClaimCache::of(store_of(vec![claim]), GpuDrivers::default()));
    c.reconcile().await.unwrap();
    let body = written_ml_quota(&requests);
    assert_eq!(body["spec"]["hard"]["requests.nvidia.com/mig-3g.40gb"], "1", "share 2 less the 1 claimed: {body}");
}

/// The pass reads the Node cache: a time-sliced `nvidia.com/gpu.shared` a node advertises is
/// held at 0 for a quota with `unlisted: Zero` (in no list of its own, it would be unlimited).
#[tokio::test]
async fn unlisted_zero_holds_what_nodes_advertise_at_zero_in_the_written_share() {
    let (client, requests) = api(Some(json!([])));
    let mut c = controller(client, None);
    c.quotas = store_of(vec![
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
            "metadata": {"name": "ml", "uid": "uid-ml", "generation": 1},
            "spec": {"namespaces": ["ml"], "hard": {"nvidia.com/mig-3g.40gb": 2}, "unlisted": "Zero"}}))
        .unwrap(),
    ]);
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
        "status": {"allocatable": {"nvidia.com/gpu.shared": "8"}}}))
    .unwrap();
    let c = c.with_nodes(store_of(vec![node]));
    c.reconcile().await.unwrap();
    let body = written_ml_quota(&requests);
    assert_eq!(body["spec"]["hard"]["requests.nvidia.com/gpu.shared"], "0", "{body}");
}

/// The time of the last computed report is exported, so figures kept through failed pod lists
/// read as stale (the alert leaves them out); it stays 0 until a list succeeds.
#[tokio::test]
async fn the_idle_report_time_is_exported_and_not_moved_by_a_failed_list() {
    let stamp = |c: &QuotaController| -> i64 {
        let text = c.metrics.render();
        let line = text.lines().find(|l| l.starts_with("tessera_operator_idle_report_timestamp_seconds "));
        line.and_then(|l| l.split(' ').nth(1)?.parse().ok()).unwrap_or_else(|| panic!("no stamp:\n{text}"))
    };
    let (client, _) = api(None);
    let failing = controller(client, None);
    let _ = failing.reconcile().await;
    assert_eq!(stamp(&failing), 0, "no report computed");
    let (client, _) = api(Some(json!([idle_pod()])));
    let c = controller(client, None);
    let before = k8s_openapi::jiff::Timestamp::now().as_second();
    c.reconcile().await.unwrap();
    let at = stamp(&c);
    assert!(at >= before && at <= k8s_openapi::jiff::Timestamp::now().as_second(), "{at}");
    c.metrics.forget_leader_state();
    assert_eq!(stamp(&c), 0, "a follower's stamp would hide staleness");
}

/// The API server stores `1000` as `1k`, so limits compare as quantities: comparing strings
/// would re-apply every pass.
#[test]
fn a_resource_quota_in_canonical_form_is_current() {
    let rq: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "tessera-q", "namespace": "a",
        "annotations": {QUOTA_NAME_ANNOTATION: "q"}},
        "spec": {"hard": {"requests.nvidia.com/gpu": "1k"}}}))
    .unwrap();
    let a = Apply {
        namespace: "a".into(),
        quota: "q".into(),
        name: "tessera-q".into(),
        hard: [("requests.nvidia.com/gpu".to_string(), "1000".to_string())].into(),
        in_force_since: None,
        in_force_keys: None,
    };
    assert!(is_current(&rq, &a, false));
    assert!(!is_current(&rq, &a, true), "gates mode: applied again until it carries the finalizer");
    let b = Apply { hard: [("requests.nvidia.com/gpu".to_string(), "999".to_string())].into(), ..a.clone() };
    assert!(!is_current(&rq, &b, false));
    // Stamps cached but planned away (a scoped ResourceQuota): applied, so they are removed.
    let mut stamped = rq.clone();
    let annotations = stamped.metadata.annotations.get_or_insert_default();
    annotations.insert(tessera_planner::quota::stamp::IN_FORCE_SINCE.into(), "2026-06-01T10:00:02Z".into());
    assert!(!is_current(&stamped, &a, false), "a stamp planned away is removed");
    let mut keyed = rq.clone();
    let annotations = keyed.metadata.annotations.get_or_insert_default();
    annotations.insert(tessera_planner::quota::stamp::keys::IN_FORCE_KEYS.into(), String::new());
    assert!(!is_current(&keyed, &a, false), "a record planned away is removed");
}

/// The body of the pass's server-side apply of `ml`'s ResourceQuota.
fn written_ml_quota(requests: &Requests) -> Value {
    let requests = requests.lock().unwrap();
    let path = "/api/v1/namespaces/ml/resourcequotas/tessera-ml";
    let (_, _, body) = requests.iter().find(|(m, p, _)| m == "PATCH" && p == path).expect("ResourceQuota written");
    body.clone()
}
