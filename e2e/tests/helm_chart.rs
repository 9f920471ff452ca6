//! The Helm chart `config/helm/tessera`: with its default values it renders exactly what
//! `kubectl kustomize config/default` renders (less the release namespace's Namespace, which
//! `helm install --create-namespace` makes); each value does what values.yaml says; and `helm
//! install` on the real control plane brings Tessera up, `helm upgrade` changes it and `helm
//! uninstall` leaves the CRDs and the tenants' objects.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tessera_crds::TenantGpuQuota;
use tessera_e2e::fixtures::{FakeGpuNode, create_gpu_nodes, wait_for};
use tessera_e2e::render::{HELM_TEMPLATE, helm, helm_template, kustomize, object, repo, run};
use tessera_e2e::{ControlPlane, Identity};

/// (kind, namespace, name) of a rendered object.
fn key(v: &Value) -> (String, String, String) {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (s(&v["kind"]), s(&v["metadata"]["namespace"]), s(&v["metadata"]["name"]))
}

/// Numbers by value: kustomize re-encodes the CRDs' `minimum: 0.0` as `0`, Helm copies them as
/// written, and the API server reads both as the same number.
fn normalized(v: Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => json!(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(normalized).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, normalized(v))).collect()),
        other => other,
    }
}

fn by_key(docs: Vec<Value>) -> BTreeMap<(String, String, String), Value> {
    let n = docs.len();
    let map: BTreeMap<_, _> = docs.into_iter().map(|d| (key(&d), normalized(d))).collect();
    assert_eq!(map.len(), n, "two rendered objects share a kind, namespace and name");
    map
}

#[test]
fn the_chart_with_default_values_renders_what_config_default_renders() {
    let mut kustomized = by_key(kustomize("config/default"));
    let helm = by_key(helm_template(&[]));
    // The one documented difference: the release namespace comes from `--create-namespace`.
    let release_ns = ("Namespace".to_string(), String::new(), "tessera-system".to_string());
    assert!(kustomized.remove(&release_ns).is_some(), "config/default creates tessera-system");
    assert!(!helm.contains_key(&release_ns), "the chart must not render its own release namespace");
    let only = |a: &BTreeMap<_, Value>, b: &BTreeMap<_, Value>| -> Vec<_> {
        a.keys().filter(|k| !b.contains_key(*k)).cloned().collect()
    };
    assert_eq!(only(&kustomized, &helm), vec![], "objects config/default renders and the chart does not");
    assert_eq!(only(&helm, &kustomized), vec![], "objects the chart renders and config/default does not");
    for (k, want) in &kustomized {
        let got = &helm[k];
        assert!(
            got == want,
            "{k:?} differs:\nkustomize:\n{}\nhelm:\n{}",
            serde_json::to_string_pretty(want).unwrap(),
            serde_json::to_string_pretty(got).unwrap()
        );
    }
    assert!(kustomized.len() >= 20, "{} objects", kustomized.len());
}

/// (The chart's crds/ are checked against the Rust types with config/crd, by `crds/tests/crd_drift.rs`.)
#[test]
fn the_chart_is_versioned_with_the_workspace() {
    let chart: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(repo().join("config/helm/tessera/Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(chart["version"].as_str(), Some(env!("CARGO_PKG_VERSION")));
    assert_eq!(chart["appVersion"].as_str(), Some(env!("CARGO_PKG_VERSION")));
}

#[test]
fn helm_lint_passes_strictly_and_bad_values_are_refused_naming_the_value() {
    run(Command::new(helm()).args(["lint", "--strict", "config/helm/tessera"]));
    for (set, want) in [
        (vec!["--set", "operator.replica=3"], "replica"),
        (vec!["--set", "agent.image.pullPolicy=Sometimes"], "pullPolicy"),
        (vec!["--set", "agent.gpuClients.values[0]=has space"], "gpuClients"),
        (vec!["--set", "agent.gpuClients.labelKey=bad key'"], "labelKey"),
        (vec!["--set", "gpuOperator.enabled=false"], "agent.nodeSelector"),
        (vec!["--set", "draDrivers[0]=Not_A_Driver"], "draDrivers"),
    ] {
        let out = Command::new(helm()).args(HELM_TEMPLATE).args(&set).current_dir(repo()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set:?} rendered");
        assert!(err.contains(want), "{set:?}: the error should name {want}: {err}");
    }
}

fn pod_spec<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    &object(docs, kind, name)["spec"]["template"]["spec"]
}

#[test]
fn values_set_images_resources_and_placement_of_both_workloads() {
    let values = std::env::temp_dir().join(format!("tessera-helm-values-{}.yaml", std::process::id()));
    std::fs::write(
        &values,
        r#"
imagePullSecrets: [{name: regcred}]
operator:
  image: {repository: registry.example.com/tessera/operator, tag: v9.9.9, pullPolicy: Always}
  replicas: 3
  resources: {requests: {cpu: 100m}, limits: {memory: 1Gi}}
  nodeSelector: {node-role.kubernetes.io/control-plane: ""}
  tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]
  affinity: {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app.kubernetes.io/name: tessera-operator}}}]}}
agent:
  image: {repository: registry.example.com/tessera/node-agent, pullPolicy: IfNotPresent}
  resources: {limits: {memory: 128Mi}}
  nodeSelector: {pool: gpu}
  tolerations: [{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}]
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a]}]}]}}}
  priorityClassName: ""
"#,
    )
    .unwrap();
    let docs = helm_template(&["--values", values.to_str().unwrap()]);
    let op = pod_spec(&docs, "Deployment", "tessera-operator");
    assert_eq!(object(&docs, "Deployment", "tessera-operator")["spec"]["replicas"], json!(3));
    assert_eq!(op["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(op["containers"][0]["image"], json!("registry.example.com/tessera/operator:v9.9.9"));
    assert_eq!(op["containers"][0]["imagePullPolicy"], json!("Always"));
    // Helm merges maps with the defaults: the memory request stays, the cpu request is replaced.
    assert_eq!(
        op["containers"][0]["resources"],
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}})
    );
    assert_eq!(op["nodeSelector"], json!({"node-role.kubernetes.io/control-plane": ""}));
    assert_eq!(op["tolerations"][0]["key"], json!("node-role.kubernetes.io/control-plane"));
    assert!(op["affinity"]["podAntiAffinity"].is_object(), "{op}");

    let agent = pod_spec(&docs, "DaemonSet", "tessera-node-agent");
    let tag = format!("v{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(agent["containers"][0]["image"], json!(format!("registry.example.com/tessera/node-agent:{tag}")));
    assert_eq!(agent["containers"][0]["imagePullPolicy"], json!("IfNotPresent"));
    assert_eq!(agent["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(agent["containers"][0]["resources"]["limits"], json!({"memory": "128Mi"}));
    // The GPU Operator's label stays (gpuOperator.enabled); agent.nodeSelector adds to it.
    assert_eq!(agent["nodeSelector"], json!({"nvidia.com/mig.capable": "true", "pool": "gpu"}));
    assert_eq!(
        agent["tolerations"],
        json!([{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}])
    );
    assert!(agent["affinity"]["nodeAffinity"].is_object(), "{agent}");
    assert!(agent.get("priorityClassName").is_none(), "an empty priorityClassName is left out: {agent}");
    assert_eq!(agent["runtimeClassName"], json!("nvidia"));
}

/// The operator's `--gpu-dra-drivers` argument.
fn dra_drivers_arg(docs: &[Value]) -> Option<String> {
    let args = pod_spec(docs, "Deployment", "tessera-operator")["containers"][0]["args"].as_array().unwrap().clone();
    args.iter().filter_map(|a| a.as_str()?.strip_prefix("--gpu-dra-drivers=").map(String::from)).next()
}

#[test]
fn the_dra_driver_list_is_the_operators_flag() {
    assert_eq!(dra_drivers_arg(&helm_template(&[])).as_deref(), Some("gpu.nvidia.com"));
    let two = helm_template(&["--set", "draDrivers={gpu.nvidia.com,gpu.example.com}"]);
    assert_eq!(dra_drivers_arg(&two).as_deref(), Some("gpu.nvidia.com,gpu.example.com"));
    // Empty: no driver's devices are GPUs (the operator drops the empty name).
    assert_eq!(dra_drivers_arg(&helm_template(&["--set-json", "draDrivers=[]"])).as_deref(), Some(""));
}

/// With `quotaAdmission: gates` the chart renders config/rbac/quota-gates.yaml's objects as they
/// are (the operator's service account from the release namespace) and passes the mode and the
/// open list to the operator; by default it renders none of them.
#[test]
fn quota_admission_gates_renders_the_gate_policies_and_the_operators_flags() {
    let shipped =
        tessera_e2e::render::documents(&std::fs::read_to_string(repo().join("config/rbac/quota-gates.yaml")).unwrap());
    assert!(shipped.len() >= 12, "{} objects", shipped.len());
    let args = |docs: &[Value]| -> Vec<String> {
        let c = &pod_spec(docs, "Deployment", "tessera-operator")["containers"][0]["args"];
        c.as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
    };
    let default = by_key(helm_template(&[]));
    for d in &shipped {
        assert!(!default.contains_key(&key(d)), "{:?} rendered by default", key(d));
    }
    assert!(!args(&helm_template(&[])).iter().any(|a| a.starts_with("--quota-admission")));
    let gates =
        helm_template(&["--set", "quotaAdmission=gates", "--set", "gpuOpenNamespaces={kube-system,gpu-operator}"]);
    let rendered = by_key(gates.clone());
    for d in shipped {
        let k = key(&d);
        assert_eq!(rendered.get(&k), Some(&normalized(d)), "{k:?} differs from config/rbac/quota-gates.yaml");
    }
    // The params mode's policies are not rendered with gates (their ConfigMap is not written there).
    for name in ["tessera-claim-classes", "tessera-gpu-pods", "tessera-gpu-bindings", "tessera-quota-names"] {
        assert!(
            default.contains_key(&("ValidatingAdmissionPolicy".to_string(), String::new(), name.to_string())),
            "{name}"
        );
        assert!(
            !rendered.contains_key(&("ValidatingAdmissionPolicy".to_string(), String::new(), name.to_string())),
            "{name}"
        );
    }
    let a = args(&gates);
    assert!(a.contains(&"--quota-admission=gates".to_string()), "{a:?}");
    assert!(a.contains(&"--gpu-open-namespaces=kube-system,gpu-operator".to_string()), "{a:?}");
    // Another release namespace: the guard and the binding name the operator there.
    let elsewhere = helm_template(&["--set", "quotaAdmission=gates", "--namespace", "gpu-platform"]);
    let guard =
        serde_json::to_string(object(&elsewhere, "ValidatingAdmissionPolicy", "tessera-gpu-gate-guard")).unwrap();
    assert!(guard.contains("system:serviceaccount:gpu-platform:tessera-operator"), "{guard}");
    let binding = object(&elsewhere, "ClusterRoleBinding", "tessera-operator-gates");
    assert_eq!(binding["subjects"][0]["namespace"], json!("gpu-platform"));
}

/// The agent's `--gpu-client-selector` argument, if any.
fn selector_arg(docs: &[Value]) -> Option<String> {
    let args = pod_spec(docs, "DaemonSet", "tessera-node-agent")["containers"][0]["args"].as_array().unwrap().clone();
    args.iter().filter_map(|a| a.as_str()?.strip_prefix("--gpu-client-selector=").map(String::from)).next()
}

/// The pod fence's GPU-client rule: (CEL expression, message expression).
fn fence_rule(docs: &[Value]) -> (String, String) {
    let v = &object(docs, "ValidatingAdmissionPolicy", "tessera-node-agent-pod-fence")["spec"]["validations"][1];
    (v["expression"].as_str().unwrap().to_string(), v["messageExpression"].as_str().unwrap().to_string())
}

#[test]
fn the_gpu_client_selector_and_the_pod_fence_come_from_one_list() {
    let docs = helm_template(&[
        "--set",
        "agent.gpuClients.labelKey=app.kubernetes.io/name",
        "--set",
        "agent.gpuClients.values={my-device-plugin,my-exporter}",
    ]);
    assert_eq!(selector_arg(&docs).as_deref(), Some("app.kubernetes.io/name in (my-device-plugin,my-exporter)"));
    let (expr, msg) = fence_rule(&docs);
    assert_eq!(
        expr,
        "has(oldObject.metadata.labels) && (('app.kubernetes.io/name' in oldObject.metadata.labels && \
         oldObject.metadata.labels['app.kubernetes.io/name'] in ['my-device-plugin', 'my-exporter']) || \
         ('nvidia-dra-driver-gpu-component' in oldObject.metadata.labels && \
         oldObject.metadata.labels['nvidia-dra-driver-gpu-component'] == 'kubelet-plugin'))"
    );
    assert!(msg.contains("(label app.kubernetes.io/name: my-device-plugin or my-exporter)"), "{msg}");
}

#[test]
fn without_the_gpu_operator_defaults_the_agent_gets_only_what_its_values_say() {
    let docs = helm_template(&["--set", "gpuOperator.enabled=false", "--set", "agent.nodeSelector.pool=gpu"]);
    let agent = pod_spec(&docs, "DaemonSet", "tessera-node-agent");
    assert_eq!(agent["nodeSelector"], json!({"pool": "gpu"}), "no GFD label without the GPU Operator");
    assert!(agent.get("runtimeClassName").is_none(), "no `nvidia` RuntimeClass without the GPU Operator: {agent}");
    assert_eq!(selector_arg(&docs), None, "no GPU clients named: the agent restarts none");
    let (expr, msg) = fence_rule(&docs);
    // No GPU clients: the fence lets it delete none of them, only NVIDIA's DRA kubelet plugin
    // (agent.draKubeletPlugin, independent of the GPU Operator).
    assert!(
        expr.contains("oldObject.metadata.labels['app'] in []"),
        "and the fence lets it delete no GPU client: {expr}"
    );
    assert!(
        expr.contains("oldObject.metadata.labels['nvidia-dra-driver-gpu-component'] == 'kubelet-plugin'"),
        "{expr}"
    );
    assert!(msg.contains("(label app: none)"), "{msg}");
    // Affinity alone also says where the agent runs; a RuntimeClass can still be named.
    let docs = helm_template(&[
        "--set",
        "gpuOperator.enabled=false",
        "--set-json",
        r#"agent.affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"gpu","operator":"Exists"}]}]}}}"#,
        "--set",
        "agent.runtimeClassName=nvidia-cdi",
    ]);
    let agent = pod_spec(&docs, "DaemonSet", "tessera-node-agent");
    assert!(agent.get("nodeSelector").is_none(), "{agent}");
    assert_eq!(agent["runtimeClassName"], json!("nvidia-cdi"));
}

#[test]
fn the_prometheus_rule_is_off_by_default_and_holds_the_shipped_alerts_when_on() {
    assert!(!helm_template(&[]).iter().any(|d| d["kind"] == "PrometheusRule"), "needs the Prometheus Operator's CRD");
    let docs = helm_template(&["--set", "prometheusRule.enabled=true", "--set", "prometheusRule.labels.release=kps"]);
    let rule = object(&docs, "PrometheusRule", "tessera");
    let alerts: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(repo().join("config/observability/alerts.yaml")).unwrap())
            .unwrap();
    assert!(rule["spec"] == alerts, "the chart's rules differ from config/observability/alerts.yaml:\n{rule}");
    assert_eq!(rule["metadata"]["namespace"], json!("tessera-system"));
    assert_eq!(rule["metadata"]["labels"]["release"], json!("kps"));
}

fn helm_cmd(cp: &ControlPlane, args: &[&str]) -> String {
    run(Command::new(helm())
        .args(args)
        .args(["--namespace", "tessera-system"])
        .env("KUBECONFIG", cp.kubeconfig(Identity::Admin))
        .env("HELM_CACHE_HOME", cp.dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", cp.dir.join("helm/config"))
        .env("HELM_DATA_HOME", cp.dir.join("helm/data")))
}

const T: Duration = Duration::from_secs(60);

/// A client of the agent DaemonSet's pod on `node`, with a token bound to that pod as the kubelet
/// would mount it (so it carries the node claim the fences check).
async fn agent_client(cp: &ControlPlane, admin: &Client, node: &str) -> Client {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "tessera-system");
    let lp = ListParams::default()
        .labels("app.kubernetes.io/name=tessera-node-agent")
        .fields(&format!("spec.nodeName={node}"));
    let pod = pods.list(&lp).await.unwrap().items.pop().unwrap_or_else(|| panic!("no agent pod on {node}"));
    let tr: TokenRequest = serde_json::from_value(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": 3600,
                 "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.metadata.uid}}}))
    .unwrap();
    let sa: Api<ServiceAccount> = Api::namespaced(admin.clone(), "tessera-system");
    let tr: TokenRequest =
        sa.create_subresource("token", "tessera-node-agent", &PostParams::default(), &tr).await.unwrap();
    let token = tr.status.unwrap().token.unwrap();
    // The node agent's kubeconfig with this token in place of its static one.
    let template = std::fs::read_to_string(cp.kubeconfig(Identity::NodeAgent)).unwrap();
    let old = template.lines().find_map(|l| l.trim().strip_prefix("token: ")).unwrap().to_string();
    let path = cp.dir.join(format!("agent-pod-{node}.kubeconfig"));
    std::fs::write(&path, template.replace(&old, &token)).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    Client::try_from(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_brings_tessera_up_upgrade_changes_the_fence_and_uninstall_keeps_the_crds() {
    let cp = ControlPlane::start().await.unwrap();
    let admin = cp.client(Identity::Admin).await.unwrap();
    let plain = FakeGpuNode::new("cpu-0", "none", 0).label("nvidia.com/mig.capable", "false");
    create_gpu_nodes(
        &admin,
        &[
            FakeGpuNode::new("gpu-0", "NVIDIA-H100-80GB-HBM3", 8),
            FakeGpuNode::new("gpu-1", "NVIDIA-A100-SXM4-40GB", 8),
            plain,
        ],
    )
    .await
    .unwrap();
    // The GPU Operator provides the `nvidia` RuntimeClass on a real cluster.
    let rc: k8s_openapi::api::node::v1::RuntimeClass =
        serde_json::from_value(json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}))
            .unwrap();
    Api::all(admin.clone()).create(&PostParams::default(), &rc).await.unwrap();

    helm_cmd(&cp, &["install", "tessera", "config/helm/tessera", "--create-namespace"]);

    // What the API server holds: the CRDs (from the chart's crds/), established.
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for name in ["gpunodes.tessera.dev", "gpupartitionplans.tessera.dev", "tenantgpuquotas.tessera.dev"] {
        wait_for(&format!("CRD {name} Established"), T, || async {
            let c = crds.get(name).await.ok()?;
            c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        })
        .await
        .unwrap();
    }
    // RBAC, namespaces, the fences.
    Api::<Namespace>::all(admin.clone()).get("tessera-node-leases").await.unwrap();
    for sa in ["tessera-operator", "tessera-node-agent"] {
        Api::<ServiceAccount>::namespaced(admin.clone(), "tessera-system").get(sa).await.unwrap();
    }
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    for name in ["tessera-operator", "tessera-node-agent", "tessera-view"] {
        roles.get(name).await.unwrap();
    }
    for name in ["tessera-operator", "tessera-node-agent"] {
        let b = Api::<ClusterRoleBinding>::all(admin.clone()).get(name).await.unwrap();
        assert_eq!(b.subjects.unwrap()[0].namespace.as_deref(), Some("tessera-system"));
    }
    Api::<Role>::namespaced(admin.clone(), "tessera-system").get("tessera-operator-leader-election").await.unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "tessera-node-leases")
        .get("tessera-node-agent-heartbeat")
        .await
        .unwrap();
    let vaps: Api<kube::api::DynamicObject> = Api::all_with(
        admin.clone(),
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy",
        )),
    );
    for name in ["tessera-node-agent-fence", "tessera-node-agent-pod-fence"] {
        let vap = vaps.get(name).await.unwrap();
        let labels = vap.labels();
        assert_eq!(labels.get("app.kubernetes.io/managed-by").map(String::as_str), Some("Helm"), "{name}: {labels:?}");
    }

    // The workloads: the operator's two pods scheduled and running (kwok plays the kubelet), the
    // agent on the two MIG-capable nodes only.
    let deploy: Api<Deployment> = Api::namespaced(admin.clone(), "tessera-system");
    wait_for("operator Deployment ready", T, || async {
        let s = deploy.get("tessera-operator").await.ok()?.status?;
        (s.ready_replicas? == 2).then_some(())
    })
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "tessera-system");
    let lp = ListParams::default().labels("app.kubernetes.io/name=tessera-operator");
    let operator_pods = pods.list(&lp).await.unwrap().items;
    assert_eq!(operator_pods.len(), 2);
    for p in &operator_pods {
        let spec = p.spec.as_ref().unwrap();
        assert!(spec.node_name.is_some(), "{} not scheduled", p.name_any());
        assert_eq!(spec.service_account_name.as_deref(), Some("tessera-operator"));
        assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Running"), "{}", p.name_any());
    }
    let ds: Api<DaemonSet> = Api::namespaced(admin.clone(), "tessera-system");
    let status = wait_for("agent DaemonSet scheduled", T, || async {
        let s = ds.get("tessera-node-agent").await.ok()?.status?;
        (s.desired_number_scheduled == 2 && s.number_ready == 2).then_some(s)
    })
    .await
    .unwrap();
    assert_eq!(status.desired_number_scheduled, 2, "GPU nodes only, not cpu-0");

    // A tenant's quota: it must outlive an uninstall.
    let quotas: Api<TenantGpuQuota> = Api::all(admin.clone());
    let q: TenantGpuQuota =
        serde_json::from_value(json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "TenantGpuQuota",
        "metadata": {"name": "team-a"}, "spec": {"namespaces": ["team-a"], "hard": {"nvidia.com/gpu": 2}}}))
        .unwrap();
    quotas.create(&PostParams::default(), &q).await.unwrap();

    // An upgrade that names other GPU clients changes the agent's selector and its fence together.
    // It also moves quota admission to gates: the gate policies are installed and the params
    // mode's are still rendered while their params ConfigMap (the operator's) exists, in force
    // until the operator, once the gates hold, deletes them and then it (quota_upgrade.rs).
    for name in PARAMS_POLICIES {
        vaps.get(name).await.unwrap();
    }
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin.clone(), "tessera-system");
    let params: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({"metadata":
        {"name": "tessera-claim-classes"}, "data": {"team-a.quota": "team-a"}}))
    .unwrap();
    cms.create(&PostParams::default(), &params).await.unwrap();
    helm_cmd(
        &cp,
        &[
            "upgrade",
            "tessera",
            "config/helm/tessera",
            "--reuse-values",
            "--set",
            "agent.gpuClients.labelKey=app.kubernetes.io/name",
            "--set",
            "agent.gpuClients.values={my-device-plugin}",
            "--set",
            "quotaAdmission=gates",
        ],
    );
    for name in PARAMS_POLICIES {
        assert!(vaps.get_opt(name).await.unwrap().is_some(), "{name}: dropped by the upgrade before the gates hold");
    }
    vaps.get("tessera-gpu-gate-guard").await.unwrap();
    // Retired as the operator retires them: the next upgrade does not make them again.
    let bindings: Api<kube::api::DynamicObject> = Api::all_with(
        admin.clone(),
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
        )),
    );
    for name in PARAMS_POLICIES {
        bindings.delete(name, &DeleteParams::default()).await.unwrap();
        vaps.delete(name, &DeleteParams::default()).await.unwrap();
    }
    cms.delete("tessera-claim-classes", &DeleteParams::default()).await.unwrap();
    helm_cmd(&cp, &["upgrade", "tessera", "config/helm/tessera", "--reuse-values"]);
    for name in PARAMS_POLICIES {
        assert!(vaps.get_opt(name).await.unwrap().is_none(), "{name}: made again once retired");
    }
    let args =
        ds.get("tessera-node-agent").await.unwrap().spec.template.spec.unwrap().containers[0].args.clone().unwrap();
    assert!(
        args.contains(&"--gpu-client-selector=app.kubernetes.io/name in (my-device-plugin)".to_string()),
        "{args:?}"
    );
    let system: Api<Pod> = Api::namespaced(admin.clone(), "kube-system");
    let client_pod = |name: &str, labels: Value| -> Pod {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": "gpu-0", "containers": [{"name": "c", "image": "example/c"}]}}))
        .unwrap()
    };
    system
        .create(&PostParams::default(), &client_pod("mine", json!({"app.kubernetes.io/name": "my-device-plugin"})))
        .await
        .unwrap();
    system
        .create(&PostParams::default(), &client_pod("operators", json!({"app": "nvidia-device-plugin-daemonset"})))
        .await
        .unwrap();
    let as_agent: Api<Pod> = Api::namespaced(agent_client(&cp, &admin, "gpu-0").await, "kube-system");
    // The updated policy takes effect asynchronously: probe with dry runs until the old GPU client
    // is refused.
    let dry = DeleteParams { dry_run: true, ..Default::default() };
    wait_for("the upgraded pod fence is active", T, || async {
        matches!(as_agent.delete("operators", &dry).await, Err(kube::Error::Api(s)) if s.code == 403).then_some(())
    })
    .await
    .unwrap();
    match as_agent.delete("operators", &DeleteParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {
            assert!(s.message.contains("(label app.kubernetes.io/name: my-device-plugin)"), "{}", s.message)
        }
        other => panic!("the agent deleted a pod that is no longer a GPU client: {other:?}"),
    }
    as_agent.delete("mine", &DeleteParams::default()).await.unwrap();

    // Uninstall: the workloads and RBAC go; the CRDs (Helm's crds/ are never deleted) and so the
    // tenants' quotas stay.
    helm_cmd(&cp, &["uninstall", "tessera"]);
    assert!(deploy.get_opt("tessera-operator").await.unwrap().is_none(), "the Deployment is gone");
    assert!(roles.get_opt("tessera-operator").await.unwrap().is_none(), "the operator's ClusterRole is gone");
    crds.get("tenantgpuquotas.tessera.dev").await.unwrap();
    assert_eq!(quotas.get("team-a").await.unwrap().spec, q.spec, "a tenant's quota outlives the uninstall");
    assert!(vaps.get_opt("tessera-gpu-gate-guard").await.unwrap().is_none(), "the gate policies go");
}

/// The params mode's policies (each with a binding of the same name).
const PARAMS_POLICIES: [&str; 4] =
    ["tessera-claim-classes", "tessera-gpu-pods", "tessera-gpu-bindings", "tessera-quota-names"];
