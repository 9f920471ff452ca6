//! Shared steps for end-to-end tests: install Tessera's CRDs, create fake GPU nodes that kwok
//! keeps Ready, and wait for conditions without sleeping blindly.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_crds::GpuPartitionPlan;
use tessera_crds::conditions::{READY, find};

use crate::Error;
use crate::controlplane::KWOK_NODE_LABEL;

/// Field manager for everything the harness writes.
pub const MANAGER: &str = "tessera-e2e";

/// Polls `check` every 200 ms until it yields `Some`, or fails after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout(what.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Applies every CRD in `config/crd/` and waits until each is Established.
pub async fn install_crds(client: &Client) -> Result<Vec<String>, Error> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/crd");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| Error::io("config/crd", e))?
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".tessera.dev.yaml"))
        .collect();
    files.sort_by_key(|f| f.path());
    for f in files {
        let text = std::fs::read_to_string(f.path()).map_err(|e| Error::io("CRD file", e))?;
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text)?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&crd)).await?;
        names.push(name);
    }
    for name in &names {
        wait_for(&format!("CRD {name} Established"), Duration::from_secs(30), || async {
            let crd = api.get(name).await.ok()?;
            let established = crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True");
            established.then_some(())
        })
        .await?;
    }
    Ok(names)
}

/// A fake GPU node: GPU Feature Discovery-style labels and the extended resources to advertise.
#[derive(Debug, Clone)]
pub struct FakeGpuNode {
    pub name: String,
    /// GFD `nvidia.com/gpu.product` value, e.g. `NVIDIA-H100-80GB-HBM3`.
    pub product: String,
    pub gpus: u32,
    /// Extra allocatable resources, e.g. `nvidia.com/mig-1g.10gb: 7`.
    pub resources: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
}

impl FakeGpuNode {
    pub fn new(name: &str, product: &str, gpus: u32) -> Self {
        Self { name: name.into(), product: product.into(), gpus, resources: BTreeMap::new(), labels: BTreeMap::new() }
    }

    pub fn resource(mut self, name: &str, quantity: u32) -> Self {
        self.resources.insert(name.into(), quantity.to_string());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }
}

/// Creates the nodes (kwok manages them through [`KWOK_NODE_LABEL`]) and waits until each is Ready.
pub async fn create_gpu_nodes(client: &Client, nodes: &[FakeGpuNode]) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client.clone());
    for n in nodes {
        let mut labels: BTreeMap<String, String> = [
            (KWOK_NODE_LABEL, "true"),
            ("type", "kwok"),
            ("kubernetes.io/hostname", n.name.as_str()),
            ("kubernetes.io/os", "linux"),
            ("nvidia.com/gpu.product", n.product.as_str()),
            ("nvidia.com/mig.capable", "true"),
            ("nvidia.com/mig.strategy", "mixed"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        labels.insert("nvidia.com/gpu.count".into(), n.gpus.to_string());
        labels.extend(n.labels.clone());
        let mut resources: BTreeMap<String, String> = [("cpu", "64"), ("memory", "512Gi"), ("pods", "110")]
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        resources.extend(n.resources.clone());
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": n.name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {},
            "status": {"capacity": resources, "allocatable": resources},
        }))
        .expect("a valid Node");
        api.create(&PostParams::default(), &node).await?;
        set_node_resources(client, &n.name, &resources).await?;
    }
    for n in nodes {
        wait_node_ready(client, &n.name).await?;
    }
    Ok(())
}

/// Sets a node's capacity and allocatable (what a device plugin would advertise).
pub async fn set_node_resources(
    client: &Client,
    node: &str,
    resources: &BTreeMap<String, String>,
) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client.clone());
    let patch = json!({"status": {"capacity": resources, "allocatable": resources}});
    api.patch_status(node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// Waits until kwok reports the node Ready.
pub async fn wait_node_ready(client: &Client, name: &str) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client.clone());
    wait_for(&format!("node {name} Ready"), Duration::from_secs(60), || async {
        let node = api.get(name).await.ok()?;
        let ready = node.status?.conditions?.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(())
    })
    .await
}

/// Waits until plan `name` is Ready (reason Applied) for its current generation.
pub async fn wait_plan_ready(client: &Client, name: &str, timeout: Duration) -> Result<(), Error> {
    let api: Api<GpuPartitionPlan> = Api::all(client.clone());
    wait_for(&format!("{name} Ready"), timeout, || async {
        let p = api.get(name).await.ok()?;
        let st = p.status?;
        let ok = find(&st.conditions, READY).is_some_and(|c| c.status == "True" && c.reason == "Applied");
        (ok && st.observed_generation == p.metadata.generation).then_some(())
    })
    .await
}

/// Creates a namespace and waits for it to be usable.
pub async fn create_namespace(client: &Client, name: &str) -> Result<(), Error> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
        .expect("a valid Namespace");
    api.create(&PostParams::default(), &ns).await?;
    Ok(())
}

/// Server-side-applies every object of a multi-document YAML file (path relative to the repo).
pub async fn apply_file(client: &Client, relative: &str) -> Result<usize, Error> {
    use kube::api::DynamicObject;
    use kube::discovery::{Discovery, Scope};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(relative);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(relative, e))?;
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut n = 0;
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)?;
    for value in docs {
        let obj: DynamicObject = serde_json::from_value(value.clone()).map_err(|e| Error::Kubeconfig(e.to_string()))?;
        let gvk = obj
            .types
            .as_ref()
            .map(kube::api::GroupVersionKind::try_from)
            .transpose()
            .map_err(|e| Error::Kubeconfig(e.to_string()))?
            .ok_or_else(|| Error::Kubeconfig(format!("{relative}: a document without apiVersion/kind")))?;
        let (ar, caps) = discovery
            .resolve_gvk(&gvk)
            .ok_or_else(|| Error::Kubeconfig(format!("{relative}: unknown kind {gvk:?}")))?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        let api: Api<DynamicObject> = match (caps.scope, obj.metadata.namespace.as_deref()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
            (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &ar),
            (Scope::Cluster, _) => Api::all_with(client.clone(), &ar),
        };
        api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&value)).await?;
        n += 1;
    }
    Ok(n)
}

/// Path of a workspace binary built by `cargo build --bins` (which `make test` runs first), or of
/// the simulated NVML library (`cargo build -p tessera-nvml-sim`, also run by `make test`).
pub fn workspace_binary(name: &str) -> std::path::PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let path = target.join("debug").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --bins` and `cargo build -p tessera-nvml-sim` first (make test does)",
        path.display()
    );
    path
}

/// A kubeconfig for the node agent of `node` holding a service-account token bound to a pod on
/// that node, as the kubelet gives a DaemonSet pod: the token carries the node-name claim that
/// `config/rbac/node-agent-fence.yaml` checks.
pub async fn node_agent_kubeconfig(cp: &crate::ControlPlane, node: &str) -> Result<std::path::PathBuf, Error> {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    let admin = cp.client(crate::Identity::Admin).await?;
    let ns = "tessera-system";
    let pod_name = format!("tessera-node-agent-{node}");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "labels": {"app.kubernetes.io/name": "tessera-node-agent"}},
        "spec": {"nodeName": node, "serviceAccountName": "tessera-node-agent",
                 "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "agent", "image": "tessera/node-agent:dev"}]}}))
    .expect("a valid Pod");
    let pod = match pods.get_opt(&pod_name).await? {
        Some(p) => p,
        None => pods.create(&PostParams::default(), &pod).await?,
    };
    let sa: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    let tr: TokenRequest =
        serde_json::from_value(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": 7200,
                 "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod.metadata.uid}}}))
        .expect("a valid TokenRequest");
    let tr: TokenRequest = sa.create_subresource("token", "tessera-node-agent", &PostParams::default(), &tr).await?;
    let token = tr.status.and_then(|s| s.token).unwrap_or_default();
    let template =
        std::fs::read_to_string(cp.kubeconfig(crate::Identity::NodeAgent)).map_err(|e| Error::io("kubeconfig", e))?;
    let old_token = template.lines().find_map(|l| l.trim().strip_prefix("token: ")).unwrap_or_default().to_string();
    let path = cp.dir.join(format!("node-agent-{node}.kubeconfig"));
    std::fs::write(&path, template.replace(&old_token, &token)).map_err(|e| Error::io("kubeconfig", e))?;
    Ok(path)
}

/// Which GPU backend a spawned node agent drives. Both run on the same simulated GPUs (the state
/// file, `tessera_node_agent::backend::sim::model`): `Sim` through the simulator backend, `Nvml`
/// through the agent's real NVML backend and the simulated `libnvidia-ml.so.1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentBackend {
    Sim,
    Nvml,
}

/// Runs the real `node-agent` binary for `node` on simulated GPUs through the simulator backend,
/// with a pod-bound token of the node-agent service account (see [`node_agent_kubeconfig`]).
pub async fn spawn_node_agent(
    cp: &crate::ControlPlane,
    node: &str,
    state: &Path,
    gpus: &str,
    extra: &[&str],
) -> Result<crate::process::Component, Error> {
    spawn_node_agent_on(cp, AgentBackend::Sim, node, state, gpus, extra).await
}

/// [`spawn_node_agent`] on a chosen backend. `Nvml` loads a copy of the workspace's
/// `libnvidia_ml.so` (`cargo build -p tessera-nvml-sim`) with the state file `state`, and plays
/// the device plugin as the simulator does.
pub async fn spawn_node_agent_on(
    cp: &crate::ControlPlane,
    backend: AgentBackend,
    node: &str,
    state: &Path,
    gpus: &str,
    extra: &[&str],
) -> Result<crate::process::Component, Error> {
    let kubeconfig = node_agent_kubeconfig(cp, node).await?;
    let mut args: Vec<String> =
        ["run", "--node-name", node, "--resync-seconds", "2"].iter().map(|s| s.to_string()).collect();
    let mut env = vec![("KUBECONFIG", kubeconfig.display().to_string()), ("RUST_LOG", "info".to_string())];
    match backend {
        AgentBackend::Sim => {
            args.extend(["--backend", "sim", "--sim-gpus", gpus, "--sim-state"].map(String::from));
            args.push(state.display().to_string());
        }
        AgentBackend::Nvml => {
            let lib = state.with_extension("lib").join("libnvidia-ml.so.1");
            let dir = lib.parent().expect("a directory");
            std::fs::create_dir_all(dir).map_err(|e| Error::io("library dir", e))?;
            std::fs::copy(workspace_binary("libnvidia_ml.so"), &lib).map_err(|e| Error::io("copy library", e))?;
            args.extend(["--backend", "nvml", "--advertise-resources", "true", "--nvml-library"].map(String::from));
            args.push(lib.display().to_string());
            env.push(("TESSERA_NVML_SIM_STATE", state.display().to_string()));
            env.push(("TESSERA_SIM_GPUS", gpus.to_string()));
        }
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    crate::process::Component::spawn_with_env(
        &format!("node-agent-{node}"),
        &workspace_binary("node-agent"),
        &args,
        &env,
        &cp.dir.join("logs"),
    )
}

/// Runs the real `tessera-operator run` as the operator identity; returns it and its HTTP port.
pub fn spawn_operator(cp: &crate::ControlPlane, tag: &str) -> Result<(crate::process::Component, u16), Error> {
    spawn_operator_with(cp, tag, &[])
}

/// [`spawn_operator`] with more environment (`TESSERA_QUOTA_ADMISSION=gates`).
pub fn spawn_operator_with(
    cp: &crate::ControlPlane,
    tag: &str,
    extra: &[(&str, &str)],
) -> Result<(crate::process::Component, u16), Error> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error::io("port", e))?;
    let args: Vec<String> = ["run", "--leader-elect", "--listen", &format!("127.0.0.1:{port}"), "--identity", tag]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut env = vec![
        ("KUBECONFIG", cp.kubeconfig(crate::Identity::Operator).display().to_string()),
        ("RUST_LOG", "info".to_string()),
        ("POD_NAMESPACE", "tessera-system".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let c = crate::process::Component::spawn_with_env(
        &format!("operator-{tag}"),
        &workspace_binary("tessera-operator"),
        &args,
        &env,
        &cp.dir.join("logs"),
    )?;
    Ok((c, port))
}

/// A plain HTTP GET on loopback (probes and metrics).
pub fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}
