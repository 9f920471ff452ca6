//! The writer against a fake API server: nothing is sent once the tenure lapsed, each write
//! goes under its field manager, failures are counted only where the caller goes on, writes to
//! remember are remembered; and the typed bodies send the same fields as hand-written ones.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use tessera_crds::gpunode::GpuIntent;
use tessera_crds::{GpuPartitionPlan, GpuPartitionPlanStatus, TenantGpuQuota};

use super::bodies::{StatusApply, condition, gpunode_conditions, intent};
use super::*;

/// One request as the fake API server saw it: method, path with query, content type, body.
type Seen = Arc<Mutex<Vec<(String, String, String, Value)>>>;

/// A fake API server answering each request with `code` and `answer`, recording it.
fn api(code: u16, answer: Value) -> (Client, Seen) {
    let seen = Seen::default();
    let log = seen.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (log, answer) = (log.clone(), answer.clone());
        async move {
            let (parts, body) = req.into_parts();
            let body: Value = serde_json::from_slice(&body.collect_bytes().await.unwrap()).unwrap_or_default();
            let content = parts.headers.get(http::header::CONTENT_TYPE).map_or("", |v| v.to_str().unwrap());
            let uri = parts.uri.path_and_query().map_or("", |p| p.as_str());
            log.lock().unwrap().push((parts.method.to_string(), uri.into(), content.into(), body));
            let bytes = serde_json::to_vec(&answer).unwrap();
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(code).body(kube::client::Body::from(bytes)).unwrap(),
            )
        }
    });
    (Client::new(service, "default"), seen)
}

/// A ConfigMap `c` at resourceVersion 12, as the server answers a write of it.
fn config_map() -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "12"}})
}

/// A failure as the API server answers it.
fn refused() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422, "message": "denied"})
}

fn lapsed() -> Tenure {
    let tenure = Tenure::default();
    tenure.set(Some(SystemTime::now() - Duration::from_secs(1)));
    tenure
}

/// How many failed writes `metrics` counted.
fn counted(metrics: &Metrics) -> bool {
    metrics.render().contains("tessera_operator_reconcile_errors_total{kind=\"kube\"} 1")
}

#[tokio::test]
async fn once_the_tenure_lapsed_no_kind_of_write_is_sent() {
    let (client, seen) = api(200, config_map());
    let (metrics, tenure) = (Metrics::default(), lapsed());
    let writer = Writer::new(&client, Some(&tenure), &metrics);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    let body = json!({"data": {"k": "v"}});

    assert!(matches!(writer.send(&cms, "c", Write::apply(Manager::Operator, &body)).await, Err(Error::NotLeader)));
    assert!(matches!(writer.send_counted(&cms, "c", Write::merge(&body)).await, Err(Error::NotLeader)));
    assert!(matches!(writer.delete(&cms, "c", &DeleteParams::default()).await, Err(Error::NotLeader)));
    assert!(matches!(writer.delete_counted(&cms, "c", &DeleteParams::default()).await, Err(Error::NotLeader)));
    let polled = AtomicBool::new(false);
    let call = async {
        polled.store(true, Ordering::SeqCst);
        Ok(())
    };
    assert!(matches!(writer.guarded(call).await, Err(Error::NotLeader)));
    assert!(!polled.load(Ordering::SeqCst), "a guarded call is not started");
    assert_eq!(seen.lock().unwrap().len(), 0, "nothing was sent");
    assert!(!counted(&metrics), "a refusal of our own is not an API failure");
}

/// A fake API server that answers only after `delay` (an overloaded server, or the client's
/// retries of its 429s), counting the requests it got.
fn slow_api(delay: Duration) -> (Client, Arc<AtomicU64>) {
    let got = Arc::new(AtomicU64::new(0));
    let count = got.clone();
    let service = tower::service_fn(move |_req: http::Request<kube::client::Body>| {
        let count = count.clone();
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            let bytes = serde_json::to_vec(&config_map()).unwrap();
            Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(200).body(kube::client::Body::from(bytes)).unwrap(),
            )
        }
    });
    (Client::new(service, "default"), got)
}

/// A renewal seen while a write waits extends the wait: a leader that still holds the lease
/// does not give up a slow write.
#[tokio::test]
async fn a_write_waits_on_while_the_tenure_is_renewed() {
    let (client, got) = slow_api(Duration::from_millis(700));
    let metrics = Metrics::default();
    let tenure = Arc::new(Tenure::default());
    tenure.set(Some(SystemTime::now() + Duration::from_millis(300)));
    let renewer = tenure.clone();
    let renewal = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        renewer.set(Some(SystemTime::now() + Duration::from_secs(10)));
    });
    let writer = Writer::new(&client, Some(&tenure), &metrics);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    let body = json!({"data": {"k": "v"}});
    writer.send(&cms, "c", Write::apply(Manager::Operator, &body)).await.expect("renewed: written");
    assert_eq!(got.load(Ordering::SeqCst), 1);
    renewal.await.unwrap();
}

/// A write started under the tenure is not awaited past it: were it answered (or retried) after
/// the lease passed, it would land over what the next leader wrote. It ends `NotLeader`, as a
/// write refused before sending does; without leader election nothing bounds it.
#[tokio::test]
async fn a_write_not_answered_within_the_tenure_is_given_up_as_not_written() {
    let (client, got) = slow_api(Duration::from_secs(30));
    let metrics = Metrics::default();
    let tenure = Tenure::default();
    let writer = Writer::new(&client, Some(&tenure), &metrics);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    let body = json!({"data": {"k": "v"}});
    tenure.set(Some(SystemTime::now() + Duration::from_millis(300)));
    assert!(matches!(writer.send(&cms, "c", Write::apply(Manager::Operator, &body)).await, Err(Error::NotLeader)));
    assert_eq!(got.load(Ordering::SeqCst), 1, "it was sent, under the tenure");
    tenure.set(Some(SystemTime::now() + Duration::from_millis(300)));
    assert!(matches!(writer.delete(&cms, "c", &DeleteParams::default()).await, Err(Error::NotLeader)));
    assert_eq!(got.load(Ordering::SeqCst), 2, "the delete was sent too, under a tenure renewed since");
    assert!(!counted(&metrics), "given up on, not failed at the API server");

    let (client, _) = slow_api(Duration::from_millis(400));
    let writer = Writer::new(&client, None, &metrics);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    writer.send(&cms, "c", Write::apply(Manager::Operator, &body)).await.expect("no tenure, no bound");
}

#[tokio::test]
async fn without_leader_election_every_write_is_sent_under_its_manager() {
    let (client, seen) = api(200, config_map());
    let metrics = Metrics::default();
    let writer = Writer::new(&client, None, &metrics);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    let body = json!({"data": {"k": "v"}});

    writer.send(&cms, "c", Write::apply(Manager::Dra, &body).status()).await.unwrap();
    writer.send(&cms, "c", Write::merge(&body)).await.unwrap();
    writer.send(&cms, "c", Write::merge_as(Manager::Operator, &body).status()).await.unwrap();
    writer.delete(&cms, "c", &DeleteParams::default()).await.unwrap();
    let seen = seen.lock().unwrap();
    let sent: Vec<(&str, &str, &str)> = seen.iter().map(|(m, u, c, _)| (m.as_str(), u.as_str(), c.as_str())).collect();
    let path = "/api/v1/namespaces/ns/configmaps/c";
    assert_eq!(
        sent,
        vec![
            (
                "PATCH",
                &*format!("{path}/status?&force=true&fieldManager=tessera-operator-dra"),
                "application/apply-patch+yaml"
            ),
            ("PATCH", &*format!("{path}?"), "application/merge-patch+json"),
            ("PATCH", &*format!("{path}/status?&fieldManager=tessera-operator"), "application/merge-patch+json"),
            ("DELETE", &*format!("{path}?"), "application/json"),
        ]
    );
    assert!(seen.iter().take(3).all(|(_, _, _, b)| *b == body), "the body as given");
}

#[tokio::test]
async fn a_failure_is_counted_only_where_the_caller_goes_on_from_it() {
    let (client, _) = api(422, refused());
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    let body = json!({});

    let metrics = Metrics::default();
    let writer = Writer::new(&client, None, &metrics);
    let e = writer.send(&cms, "c", Write::merge(&body)).await.unwrap_err();
    assert_eq!(e.kind(), "api", "propagated: the pass counts it by kind");
    assert!(!counted(&metrics));

    let sent = writer.send_counted(&cms, "c", Write::merge(&body)).await.expect("the tenure holds");
    assert!(sent.unwrap_err().to_string().contains("denied"));
    assert!(counted(&metrics), "handed back to report: counted here");

    let metrics = Metrics::default();
    let writer = Writer::new(&client, None, &metrics);
    assert!(writer.delete_counted(&cms, "c", &DeleteParams::default()).await.unwrap().is_err());
    assert!(counted(&metrics));
}

#[tokio::test]
async fn a_delete_of_an_object_already_gone_is_done() {
    let gone = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "message": "not found"});
    let (client, _) = api(404, gone);
    let metrics = Metrics::default();
    let writer = Writer::new(&client, None, &metrics);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    writer.delete(&cms, "c", &DeleteParams::default()).await.unwrap();
    writer.delete_counted(&cms, "c", &DeleteParams::default()).await.unwrap().unwrap();
    assert!(!counted(&metrics));
}

#[tokio::test]
async fn an_expected_write_is_remembered_at_the_version_it_returned_and_others_are_not() {
    let (client, _) = api(200, config_map());
    let metrics = Metrics::default();
    let (expectations, gpunodes_written, nodes_written) = (Mutex::default(), AtomicU64::new(0), AtomicU64::new(0));
    let expecting =
        Expecting { expectations: &expectations, gpunodes_written: &gpunodes_written, nodes_written: &nodes_written };
    let writer = Writer::new(&client, None, &metrics).expecting(expecting);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    let body = json!({});

    writer.send(&cms, "c", Write::merge(&body)).await.unwrap();
    assert!(expectations.lock().unwrap().is_empty(), "not marked: not remembered");
    writer.send(&cms, "c", Write::merge(&body).expected(Written::Node)).await.unwrap();
    assert_eq!(expectations.lock().unwrap().nodes(), vec!["c".to_string()]);
    assert_eq!((nodes_written.load(Ordering::SeqCst), gpunodes_written.load(Ordering::SeqCst)), (12, 0));
}

/// A write given up on at the tenure's end may still be applied by the server: as after a
/// failed write, its version is read back and remembered, so the next pass waits for the caches.
#[tokio::test]
async fn an_expected_write_given_up_on_is_read_back_and_remembered() {
    let service = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
        if req.method() == http::Method::PATCH {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "resourceVersion": "41"}});
        let bytes = serde_json::to_vec(&node).unwrap();
        Ok::<_, std::convert::Infallible>(
            http::Response::builder().status(200).body(kube::client::Body::from(bytes)).unwrap(),
        )
    });
    let client = Client::new(service, "default");
    let metrics = Metrics::default();
    let (expectations, gpunodes_written, nodes_written) = (Mutex::default(), AtomicU64::new(0), AtomicU64::new(0));
    let expecting =
        Expecting { expectations: &expectations, gpunodes_written: &gpunodes_written, nodes_written: &nodes_written };
    let tenure = Tenure::default();
    tenure.set(Some(SystemTime::now() + Duration::from_millis(300)));
    let writer = Writer::new(&client, Some(&tenure), &metrics).expecting(expecting);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let body = json!({"spec": {"unschedulable": true}});
    let sent = writer.send(&nodes, "n", Write::merge(&body).expected(Written::Node)).await;
    assert!(matches!(sent, Err(Error::NotLeader)), "{sent:?}");
    assert_eq!(expectations.lock().unwrap().nodes(), vec!["n".to_string()], "read back and remembered");
    assert_eq!(nodes_written.load(Ordering::SeqCst), 41);
}

#[test]
fn the_field_manager_names_stay_as_the_cluster_records_them() {
    assert_eq!(
        [MANAGER, LIVENESS_MANAGER, DRA_MANAGER, LAYOUTS_MANAGER],
        ["tessera-operator", "tessera-operator-liveness", "tessera-operator-dra", "tessera-operator-layouts"]
    );
}

#[test]
fn typed_bodies_send_the_fields_of_the_hand_written_ones_and_no_more() {
    let gpus = vec![GpuIntent { index: 0, mig_enabled: true, profiles: [("1g.10gb".to_string(), 7)].into() }];
    assert_eq!(
        value(intent("n1", "p".into(), gpus.clone())),
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": "n1"},
               "spec": {"plan": "p", "gpus": gpus}})
    );

    let at = Time("2026-06-01T00:00:00Z".parse().unwrap());
    let ready = condition("Ready", "Unknown", "AgentNotResponding", "silent".into(), at.clone());
    let hand = json!({"type": "Ready", "status": "Unknown", "reason": "AgentNotResponding", "message": "silent",
                      "lastTransitionTime": at});
    assert_eq!(
        value(gpunode_conditions(vec![ready.clone()])),
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "status": {"conditions": [hand]}})
    );
    assert_eq!(
        value(gpunode_conditions(vec![]).named("n1")),
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": "n1"},
               "status": {"conditions": []}}),
        "an empty list removes the manager's condition"
    );

    let plan = GpuPartitionPlanStatus { observed_generation: Some(2), matched_nodes: 3, ..Default::default() };
    assert_eq!(
        value(StatusApply::of::<GpuPartitionPlan>(&plan)),
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuPartitionPlan", "status": plan})
    );
    let quota = tessera_crds::quota::TenantGpuQuotaStatus::default();
    assert_eq!(
        value(StatusApply::of::<TenantGpuQuota>(&quota)),
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota", "status": quota})
    );
}

/// A body as the JSON it sends.
fn value(body: impl serde::Serialize) -> Value {
    serde_json::to_value(body).unwrap()
}
