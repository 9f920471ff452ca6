use std::collections::BTreeMap;

use super::*;

const DP: &str = "nvidia.com/gpu.deploy.device-plugin";
const GFD: &str = "nvidia.com/gpu.deploy.gpu-feature-discovery";
const EXPORTER: &str = "nvidia.com/gpu.deploy.dcgm-exporter";
const DCGM: &str = "nvidia.com/gpu.deploy.dcgm";

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap()
}

#[test]
fn a_pause_changes_and_records_only_labels_neither_false_absent_nor_paused() {
    let node = labels(&[(DP, "true"), (GFD, "false"), (EXPORTER, "custom"), ("app", "x"), (DCGM, PAUSED)]);
    assert_eq!(pause_patch(&node), labels(&[(DP, PAUSED), (EXPORTER, PAUSED)]));
    let record = Record::of(&node, at(10)).unwrap();
    assert_eq!(record.labels, labels(&[(DP, "true"), (EXPORTER, "custom")]), "false, absent, paused: not recorded");
    assert_eq!(Record::parse(&record.to_json()), Ok(record));
    // Nothing to pause (no GPU Operator labels, or all false): no record, no write, no wait.
    for node in [labels(&[("app", "x")]), labels(&[(DP, "false"), (GFD, "false")])] {
        assert!(pause_patch(&node).is_empty(), "{node:?}");
        assert_eq!(Record::of(&node, at(10)), None, "{node:?}");
    }
}

#[test]
fn a_restore_gives_paused_labels_their_recorded_value_and_leaves_the_rest_untouched() {
    let record = Record { since: at(0), labels: labels(&[(DP, "true"), (EXPORTER, "custom")]) };
    // (Node labels now, record) -> writes
    let table = [
        // Paused by us: back to what they were; a `false` (set before or meanwhile) stays.
        (
            labels(&[(DP, PAUSED), (GFD, "false"), (EXPORTER, PAUSED)]),
            Some(&record),
            labels(&[(DP, "true"), (EXPORTER, "custom")]),
        ),
        (labels(&[(DP, "false"), (EXPORTER, PAUSED)]), Some(&record), labels(&[(EXPORTER, "custom")])),
        // Removed or changed by someone else meanwhile: not ours any more.
        (labels(&[(EXPORTER, "true")]), Some(&record), labels(&[])),
        // Paused but missing from the record (or the record unreadable): `true`, as NVIDIA does.
        (labels(&[(DCGM, PAUSED)]), Some(&record), labels(&[(DCGM, "true")])),
        (labels(&[(DP, PAUSED)]), None, labels(&[(DP, "true")])),
    ];
    for (node, record, want) in table {
        assert_eq!(restore_patch(record, &node), want, "{node:?}");
    }
}

#[test]
fn a_bad_record_is_an_error_naming_the_annotation() {
    for text in ["", "{", r#"{"labels": {}}"#, r#"{"since": "yesterday", "labels": {}}"#] {
        let e = Record::parse(text).unwrap_err();
        assert!(e.starts_with("annotation tessera.dev/paused-gpu-clients: "), "{e}");
    }
}

fn gpu(index: u32, capable: bool, enabled: bool, pending: Option<bool>) -> GpuInfo {
    GpuInfo {
        index,
        uuid: format!("GPU-{index}"),
        product: "NVIDIA H100 80GB HBM3".into(),
        memory_mib: 81559,
        mig_capable: capable,
        mig_enabled: enabled,
        mig_pending: pending,
    }
}

fn want(index: i32, mig: bool) -> GpuIntent {
    GpuIntent { index, mig_enabled: mig, profiles: Default::default() }
}

#[test]
fn only_a_mig_mode_change_the_intent_asks_for_is_pending() {
    // (inventory, intent) -> pending
    let table = [
        (vec![gpu(0, true, false, None)], vec![want(0, true)], true),
        (vec![gpu(0, true, true, None)], vec![want(0, false)], true),
        (vec![gpu(0, true, true, None)], vec![want(0, true)], false),
        // An opposite mode pending (to clear) or the wanted one pending (set again, the driver says).
        (vec![gpu(0, true, true, Some(false))], vec![want(0, true)], true),
        (vec![gpu(0, true, false, Some(true))], vec![want(0, true)], true),
        // Not MIG capable, a GPU the node lacks, a GPU the intent does not name: no change.
        (vec![gpu(0, false, false, None)], vec![want(0, true)], false),
        (vec![gpu(0, true, true, None)], vec![want(1, false)], false),
        (vec![gpu(0, true, true, None), gpu(1, true, false, None)], vec![want(0, true)], false),
        (vec![gpu(0, true, true, None), gpu(1, true, false, None)], vec![want(0, true), want(1, true)], true),
    ];
    for (inventory, intent, pending) in table {
        assert_eq!(mode_change_pending(&inventory, &intent), pending, "{inventory:?} {intent:?}");
    }
}

#[test]
fn the_mode_change_waits_for_client_pods_only_up_to_the_limit() {
    let limit = WAIT_LIMIT.as_secs() as i64;
    assert!(must_wait(1, at(0), at(limit - 1)));
    assert!(!must_wait(1, at(0), at(limit)), "waited long enough: tried anyway");
    assert!(!must_wait(0, at(0), at(1)), "no pod left");
}

mod agent {
    //! A pass of the agent against a mock API server for node `test`, on a simulated H100.

    use std::sync::{Arc, Mutex};

    use kube::Client;
    use serde_json::{Value, json};

    use super::*;
    use crate::agent::Agent;
    use crate::backend::GpuBackend;
    use crate::backend::sim::SimBackend;
    use crate::gpu_clients::{RESTARTED_FOR, fingerprint};
    use crate::report::GpuOutcome;
    use crate::testutil::temp_dir;

    /// The Node's labels, the GpuNode's annotations and hand-over, the GPU client pods on the node
    /// (namespace `gpu`), and the writes in order.
    #[derive(Default)]
    struct Cluster {
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
        applying: bool,
        pods: Vec<String>,
        writes: Vec<String>,
    }

    fn merge(into: &mut BTreeMap<String, String>, patch: &Value) {
        for (k, v) in patch.as_object().into_iter().flatten() {
            match v.as_str() {
                Some(v) => into.insert(k.clone(), v.to_string()),
                None => into.remove(k),
            };
        }
    }

    fn client(cluster: Arc<Mutex<Cluster>>) -> Client {
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let cluster = cluster.clone();
            async move {
                let (method, path) = (req.method().clone(), req.uri().path().to_string());
                let body = req.into_body().collect_bytes().await.map_err(|e| std::io::Error::other(e.to_string()))?;
                let mut c = cluster.lock().unwrap();
                let patch: Value =
                    if method == http::Method::PATCH { serde_json::from_slice(&body).unwrap() } else { json!({}) };
                let out = if path.ends_with("/gpunodes/test") || path.ends_with("/gpunodes/test/status") {
                    if method == http::Method::PATCH && path.ends_with("/test") {
                        let annotations = &patch["metadata"]["annotations"];
                        if annotations.get(PAUSED_FOR).is_some() {
                            c.writes.push(format!("record {}", annotations[PAUSED_FOR]));
                        }
                        merge(&mut c.annotations, annotations);
                    }
                    let rollout = c.applying.then(|| json!({"phase": "Applying", "plan": "test"}));
                    json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                        "metadata": {"name": "test", "generation": 1, "annotations": c.annotations},
                        "spec": {"gpus": [{"index": 0, "migEnabled": true, "profiles": {"7g.80gb": 1}}]},
                        "status": {"rollout": rollout}})
                } else if path == "/api/v1/nodes/test" {
                    if method == http::Method::PATCH {
                        c.writes.push(format!("labels {}", patch["metadata"]["labels"]));
                        merge(&mut c.labels, &patch["metadata"]["labels"]);
                    }
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "test", "labels": c.labels},
                           "spec": {"unschedulable": true}})
                } else if path == "/api/v1/pods" {
                    let items: Vec<Value> =
                        c.pods.iter().map(|p| json!({"metadata": {"name": p, "namespace": "gpu"}})).collect();
                    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
                } else if let Some(name) = path.strip_prefix("/api/v1/namespaces/gpu/pods/")
                    && method == http::Method::DELETE
                {
                    c.pods.retain(|p| p != name);
                    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "gpu"}})
                } else {
                    return Err(std::io::Error::other(format!("no {method} {path} in this test")));
                };
                Ok(http::Response::new(kube::client::Body::from(out.to_string().into_bytes())))
            }
        });
        Client::new(svc, "default")
    }

    /// An agent on a simulated H100 (MIG `mig_on`, with the wanted 7g.80gb when on) whose clients
    /// were last restarted for what the GPU holds, so only the pause makes it act on them.
    fn setup(mig_on: bool, cluster: Cluster) -> (Agent<SimBackend>, Arc<Mutex<Cluster>>, SimBackend) {
        let state = temp_dir("pause").join("sim.json");
        let mut sim = SimBackend::open(&state, &["H100-80GB".into()]).unwrap();
        if mig_on {
            sim.set_mig_mode(0, true).unwrap();
            sim.create_instance(0, "7g.80gb", 0).unwrap();
        }
        let gpus = vec![(sim.inventory().unwrap()[0].clone(), sim.instances(0).unwrap_or_default())];
        let cluster = Arc::new(Mutex::new(cluster));
        cluster.lock().unwrap().annotations.insert(RESTARTED_FOR.into(), fingerprint(&gpus));
        let agent = Agent {
            backend: SimBackend::at(&state),
            client: client(cluster.clone()),
            node: "test".into(),
            advertise_resources: false,
            gpu_client_selector: Some("app in (nvidia-device-plugin-daemonset,nvidia-dcgm-exporter)".into()),
            dra_plugin_selector: None,
            lease_duration: std::time::Duration::from_secs(40),
            activity: Default::default(),
        };
        (agent, cluster, sim)
    }

    /// A mode change waits until the GPU clients are paused (changed at once, their DaemonSets
    /// would be free to restart them onto the GPU), and their labels are restored after.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mode_change_waits_for_paused_clients_and_restores_their_labels_after() {
        let cluster = Cluster {
            labels: labels(&[(DP, "true"), (GFD, "false"), (EXPORTER, "true"), ("other", "x")]),
            applying: true,
            pods: vec!["dp".into(), "exporter".into()],
            ..Default::default()
        };
        let (mut agent, cluster, mut sim) = setup(false, cluster);
        let outcomes = agent.reconcile().await.unwrap();
        assert!(
            matches!(&outcomes[0].1, GpuOutcome::Waiting { reason: "StoppingGpuClients", message } if message.contains("gpu/dp, gpu/exporter left")),
            "{outcomes:?}"
        );
        assert!(!sim.inventory().unwrap()[0].mig_enabled, "the mode waits for the clients");
        {
            let c = cluster.lock().unwrap();
            assert_eq!(
                c.labels,
                labels(&[(DP, PAUSED), (GFD, "false"), (EXPORTER, PAUSED), ("other", "x")]),
                "false and other labels untouched"
            );
            let record = Record::parse(&c.annotations[PAUSED_FOR]).unwrap();
            assert_eq!(record.labels, labels(&[(DP, "true"), (EXPORTER, "true")]));
            assert_eq!(c.writes.len(), 2, "{:?}", c.writes);
            assert!(
                c.writes[0].starts_with("record ") && c.writes[1].starts_with("labels "),
                "record first: {:?}",
                c.writes
            );
        }
        // The DaemonSet controller removes the paused clients' pods.
        cluster.lock().unwrap().pods.clear();
        let outcomes = agent.reconcile().await.unwrap();
        assert_eq!(outcomes[0].1, GpuOutcome::InSync);
        assert!(sim.inventory().unwrap()[0].mig_enabled);
        assert_eq!(sim.instances(0).unwrap().len(), 1);
        let c = cluster.lock().unwrap();
        assert_eq!(c.labels, labels(&[(DP, "true"), (GFD, "false"), (EXPORTER, "true"), ("other", "x")]), "restored");
        assert!(!c.annotations.contains_key(PAUSED_FOR), "record removed: {:?}", c.annotations);
    }

    /// A restarted agent (or one whose hand-over was withdrawn) finds a pause and no mode change
    /// to make: it restores the labels still paused, which nothing else would.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pause_found_with_no_mode_change_to_make_is_undone() {
        let record = Record { since: Timestamp::now(), labels: labels(&[(DP, "true"), (EXPORTER, "custom")]) };
        // (MIG already on, handed over): done; or the mode change left, hand-over withdrawn.
        for (mig_on, applying) in [(true, true), (true, false), (false, false)] {
            let cluster = Cluster {
                labels: labels(&[(DP, PAUSED), (GFD, "false"), (EXPORTER, PAUSED), (DCGM, PAUSED)]),
                annotations: [(PAUSED_FOR.to_string(), record.to_json())].into(),
                applying,
                ..Default::default()
            };
            let (mut agent, cluster, mut sim) = setup(mig_on, cluster);
            agent.reconcile().await.unwrap();
            assert_eq!(sim.inventory().unwrap()[0].mig_enabled, mig_on, "no mode change without the hand-over");
            let c = cluster.lock().unwrap();
            assert_eq!(
                c.labels,
                labels(&[(DP, "true"), (GFD, "false"), (EXPORTER, "custom"), (DCGM, "true")]),
                "{mig_on} {applying}"
            );
            assert!(!c.annotations.contains_key(PAUSED_FOR), "{mig_on} {applying}");
        }
    }

    /// Clients that do not stop (not steered by the labels) hold the change only up to the limit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_mode_change_goes_ahead_when_the_clients_do_not_stop_in_time() {
        let since = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(WAIT_LIMIT.as_secs() as i64 + 1);
        let record = Record { since, labels: labels(&[(DP, "true")]) };
        let cluster = Cluster {
            labels: labels(&[(DP, PAUSED)]),
            annotations: [(PAUSED_FOR.to_string(), record.to_json())].into(),
            applying: true,
            pods: vec!["unmanaged".into()],
            ..Default::default()
        };
        let (mut agent, cluster, mut sim) = setup(false, cluster);
        let outcomes = agent.reconcile().await.unwrap();
        assert_eq!(outcomes[0].1, GpuOutcome::InSync);
        assert!(sim.inventory().unwrap()[0].mig_enabled);
        assert_eq!(cluster.lock().unwrap().labels, labels(&[(DP, "true")]), "restored after the change");
    }
}
