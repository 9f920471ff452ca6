use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};

use super::{Charges, claim_charges, pod_charges};

fn pod(spec: Value, phase: Option<&str>) -> Pod {
    let mut v = json!({"metadata": {"name": "p", "namespace": "a"}, "spec": spec});
    if let Some(p) = phase {
        v["status"] = json!({"phase": p});
    }
    serde_json::from_value(v).unwrap()
}

fn gpus(name: &str, n: i64) -> Value {
    json!({"name": name, "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": n.to_string()}}})
}

fn charged(pairs: &[(&str, i64)]) -> Charges {
    pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect()
}

const KEY: &str = "requests.nvidia.com/mig-1g.10gb";

#[test]
fn a_pod_is_charged_as_the_evaluator_charges_it() {
    let app = |n| gpus("app", n);
    let sidecar = |n: i64| {
        let mut c = gpus("side", n);
        c["restartPolicy"] = json!("Always");
        c
    };
    // (what, spec, phase, charged)
    let table: Vec<(&str, Value, Option<&str>, Charges)> = vec![
        ("two app containers add up", json!({"containers": [app(1), app(2)]}), Some("Running"), charged(&[(KEY, 3)])),
        (
            "a bigger init step is the peak",
            json!({"initContainers": [gpus("init", 4)], "containers": [app(1)]}),
            None,
            charged(&[(KEY, 4)]),
        ),
        (
            "a smaller init step is not",
            json!({"initContainers": [gpus("init", 1)], "containers": [app(2)]}),
            None,
            charged(&[(KEY, 2)]),
        ),
        (
            "sidecars run beside the app",
            json!({"initContainers": [sidecar(1)], "containers": [app(2)]}),
            Some("Pending"),
            charged(&[(KEY, 3)]),
        ),
        (
            "a plain init step after a sidecar counts the sidecar",
            json!({"initContainers": [sidecar(2), gpus("init", 3)], "containers": [app(1)]}),
            None,
            charged(&[(KEY, 5)]),
        ),
        (
            "a plain init step before a sidecar does not",
            json!({"initContainers": [gpus("init", 3), sidecar(2)], "containers": [app(1)]}),
            None,
            charged(&[(KEY, 3)]),
        ),
        ("a succeeded pod holds nothing", json!({"containers": [app(2)]}), Some("Succeeded"), charged(&[])),
        ("a failed pod holds nothing", json!({"containers": [app(2)]}), Some("Failed"), charged(&[])),
        (
            "non-GPU resources are not counted",
            json!({"containers": [{"name": "c", "image": "x", "resources": {"limits": {"cpu": "2", "nvidia.com/hostdev": "1"}}}]}),
            None,
            charged(&[]),
        ),
        (
            "requests win over limits, and nvidia.com/gpu is its own key",
            json!({"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2"}}}]}),
            None,
            charged(&[("requests.nvidia.com/gpu", 2)]),
        ),
    ];
    for (what, spec, phase, want) in table {
        assert_eq!(pod_charges(&pod(spec, phase)), want, "{what}");
    }
}

#[test]
fn a_pod_being_deleted_stays_charged() {
    let mut p = pod(json!({"containers": [gpus("app", 1)]}), Some("Running"));
    p.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-12-01T00:00:00Z".parse().unwrap()));
    assert_eq!(pod_charges(&p), charged(&[(KEY, 1)]));
}

fn claim(requests: Value) -> ResourceClaim {
    serde_json::from_value(
        json!({"metadata": {"name": "c", "namespace": "a"}, "spec": {"devices": {"requests": requests}}}),
    )
    .unwrap()
}

#[test]
fn a_claim_is_charged_as_the_evaluator_charges_it() {
    let key = |c: &str| format!("{c}.deviceclass.resource.k8s.io/devices");
    let gpu = |c: &str| c != "fpga.example.com";
    type Row = (&'static str, Value, Vec<(String, i64)>);
    let table: Vec<Row> = vec![
        (
            "one device by default",
            json!([{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com"}}]),
            vec![(key("mig.nvidia.com"), 1)],
        ),
        (
            "ExactCount its count",
            json!([{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 3}}]),
            vec![(key("mig.nvidia.com"), 3)],
        ),
        (
            "All at its upper bound",
            json!([{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]),
            vec![(key("gpu.nvidia.com"), 32)],
        ),
        (
            "firstAvailable: each class its largest alternative",
            json!([{"name": "r", "firstAvailable": [
                {"name": "a", "deviceClassName": "mig.nvidia.com", "count": 1},
                {"name": "b", "deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 2},
                {"name": "c", "deviceClassName": "gpu.nvidia.com"}]}]),
            vec![(key("mig.nvidia.com"), 2), (key("gpu.nvidia.com"), 1)],
        ),
        (
            "two requests of one class add up",
            json!([{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com"}},
                   {"name": "s", "exactly": {"deviceClassName": "mig.nvidia.com", "count": 2}}]),
            vec![(key("mig.nvidia.com"), 3)],
        ),
        (
            "admin access is charged",
            json!([{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com", "adminAccess": true}}]),
            vec![(key("mig.nvidia.com"), 1)],
        ),
        (
            "classes off GPUs are not counted",
            json!([{"name": "r", "exactly": {"deviceClassName": "fpga.example.com"}}]),
            vec![],
        ),
    ];
    for (what, requests, want) in table {
        let want: Charges = want.into_iter().collect();
        assert_eq!(claim_charges(&claim(requests), gpu), want, "{what}");
    }
}
