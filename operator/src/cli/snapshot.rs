//! Cluster objects read from YAML files instead of the API (`--from`), for CI jobs without
//! cluster access and for tests: what `kubectl get nodes,pods,gpunodes,gpupartitionplans,
//! tenantgpuquotas -A -o yaml` prints (a `List`) or plain multi-document YAML.

use k8s_openapi::api::core::v1::{Node, Pod};
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
            _ => {}
        }
        Ok(())
    }
}

fn parse<K: DeserializeOwned>(kind: &str, v: serde_json::Value, at: &str) -> Result<K, Error> {
    serde_path_to_error::deserialize(v)
        .map_err(|e| Error::Usage(format!("{at}: {}: {}", field_of(kind, None, e.path()), e.inner())))
}
