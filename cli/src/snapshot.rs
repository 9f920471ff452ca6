//! Cluster objects read from YAML files instead of the API (`--from`), for CI jobs without
//! cluster access and for tests: what `kubectl get nodes,pods,gpunodes,gpupartitionplans,
//! tenantgpuquotas,poddisruptionbudgets,daemonsets,resourceclaims,resourceslices -A -o yaml`
//! prints (a `List`) or plain multi-document YAML.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde::de::DeserializeOwned;
use tessera_crds::{GpuNode, GpuPartitionPlan, TenantGpuQuota};

use super::validate::{documents, field_of};
use crate::Error;

/// The objects of the kinds Tessera's commands read; other kinds are ignored.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub nodes: Vec<Node>,
    pub gpunodes: Vec<GpuNode>,
    pub plans: Vec<GpuPartitionPlan>,
    pub quotas: Vec<TenantGpuQuota>,
    pub pods: Vec<Pod>,
    pub budgets: Vec<PodDisruptionBudget>,
    /// `None` when not read (files holding no DaemonSet): unknown, not "none exist".
    pub daemonsets: Option<Vec<DaemonSet>>,
    /// ResourceClaims (`resource.k8s.io/v1`). A pod naming a claim the files lack counts as
    /// using a GPU of unknown device (`gpu_use`), never as using none.
    pub claims: Vec<ResourceClaim>,
    /// ResourceSlices: the attributes (`uuid`, `parentUUID`, `profile`) of allocated devices.
    pub slices: Vec<ResourceSlice>,
    /// The agents' heartbeat Leases; `None` when the files hold none (not judged, see
    /// `idle::stale`).
    pub leases: Option<Vec<Lease>>,
}

impl Snapshot {
    /// Reads every file; an object of a known kind that does not parse is an error naming the
    /// file, the document and the field.
    pub fn read(files: &[String]) -> Result<Self, Error> {
        let mut s = Snapshot::default();
        for file in files {
            let text =
                std::fs::read_to_string(file).map_err(|source| Error::ReadFile { path: file.clone(), source })?;
            for (i, doc) in documents(&text).enumerate() {
                let doc = doc.map_err(|e| Error::Usage(format!("{file}:doc {}: {e}", i + 1)))?;
                s.add(doc, &format!("{file}:doc {}", i + 1))?;
            }
        }
        Ok(s)
    }

    fn add(&mut self, v: serde_json::Value, at: &str) -> Result<(), Error> {
        let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_string();
        match kind.as_str() {
            "List" => {
                let items = v.get("items").and_then(|i| i.as_array()).cloned().unwrap_or_default();
                for (n, item) in items.into_iter().enumerate() {
                    self.add(item, &format!("{at}: items[{n}]"))?;
                }
            }
            "Node" => self.nodes.push(parse(&kind, v, at)?),
            "GpuNode" => self.gpunodes.push(parse(&kind, v, at)?),
            "GpuPartitionPlan" => self.plans.push(parse(&kind, v, at)?),
            "TenantGpuQuota" => self.quotas.push(parse(&kind, v, at)?),
            "Pod" => self.pods.push(parse(&kind, v, at)?),
            "PodDisruptionBudget" => self.budgets.push(parse(&kind, v, at)?),
            "DaemonSet" => self.daemonsets.get_or_insert_default().push(parse(&kind, v, at)?),
            "ResourceClaim" => self.claims.push(parse(&kind, v, at)?),
            "ResourceSlice" => self.slices.push(parse(&kind, v, at)?),
            "Lease" => self.leases.get_or_insert_default().push(parse(&kind, v, at)?),
            _ => {}
        }
        Ok(())
    }
}

fn parse<K: DeserializeOwned>(kind: &str, v: serde_json::Value, at: &str) -> Result<K, Error> {
    serde_path_to_error::deserialize(v)
        .map_err(|e| Error::Usage(format!("{at}: {}: {}", field_of(kind, None, e.path()), e.inner())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Snapshot, Error> {
        let dir = std::env::temp_dir().join(format!("tessera-snapshot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{}.yaml", text.len()));
        std::fs::write(&file, text).unwrap();
        Snapshot::read(&[file.to_string_lossy().into_owned()])
    }

    #[test]
    fn budgets_and_daemonsets_are_read_and_daemonsets_unread_stay_unknown() {
        let s = read(
            "kind: List\nitems:\n- {apiVersion: policy/v1, kind: PodDisruptionBudget, metadata: {name: web, namespace: ml},\n   \
             spec: {maxUnavailable: 0, selector: {matchLabels: {app: web}}}, status: {disruptionsAllowed: 0, \
             currentHealthy: 2, desiredHealthy: 2, expectedPods: 2}}\n- {apiVersion: apps/v1, kind: DaemonSet, \
             metadata: {name: agent, namespace: kube-system}}\n",
        )
        .unwrap();
        assert_eq!(s.budgets.len(), 1);
        assert_eq!(s.budgets[0].status.as_ref().and_then(|st| st.disruptions_allowed), Some(0));
        assert_eq!(s.daemonsets.as_ref().map(Vec::len), Some(1));
        let s = read("apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n").unwrap();
        assert!(s.daemonsets.is_none(), "no DaemonSet in the files: unknown, not none");
        let err = read("kind: PodDisruptionBudget\nmetadata: {name: web}\nstatus: {disruptionsAllowed: many}\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("doc 1: status.disruptionsAllowed"), "{err}");
    }

    #[test]
    fn resource_claims_and_slices_are_read_and_bad_ones_named() {
        let s = read(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c, namespace: ml}\nspec: {}\n\
             status: {allocation: {devices: {results: [{request: r, driver: gpu.nvidia.com, pool: n1, device: gpu-0}]}}}\n\
             ---\napiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\n\
             spec: {driver: gpu.nvidia.com, nodeName: n1, pool: {name: n1, generation: 1, resourceSliceCount: 1}, \
             devices: [{name: gpu-0, attributes: {uuid: {string: GPU-a}}}]}\n",
        )
        .unwrap();
        assert_eq!(s.claims.len(), 1);
        assert_eq!(s.slices.len(), 1);
        let err =
            read("kind: ResourceClaim\nmetadata: {name: c}\nspec: {devices: {requests: 3}}\n").unwrap_err().to_string();
        assert!(err.contains("doc 1: spec.devices.requests"), "{err}");
    }
}
