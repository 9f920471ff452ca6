//! When the GPU client pods (device plugin, feature discovery, DCGM exporter) must restart to
//! re-enumerate MIG devices. Level-triggered: the GpuNode records (annotation [`RESTARTED_FOR`])
//! the MIG devices the clients were last restarted for, and every pass compares it with what the
//! GPUs hold, so a restart lost to an agent killed right after a driver step is redone by the
//! next agent. Pure; the agent restarts the pods, then writes the record.

use crate::backend::{GpuInfo, Instance};

pub mod pause;

/// GpuNode annotation: the fingerprint of the MIG devices the GPU clients were restarted for.
pub const RESTARTED_FOR: &str = "tessera.dev/gpu-clients-restarted-for";

/// The pods of NVIDIA's DRA driver kubelet plugin (NVIDIA/k8s-dra-driver-gpu): it publishes the
/// node's MIG devices as ResourceSlices and, like the device plugin, enumerates them only when it
/// starts. Its Helm chart (deployments/helm/nvidia-dra-driver-gpu, templates/kubeletplugin.yaml
/// with `nvidia-dra-driver-gpu.selectorLabels` of templates/_helpers.tpl) labels the kubelet
/// plugin DaemonSet's pods `<chart name>-component: kubelet-plugin`, the chart being
/// `nvidia-dra-driver-gpu`. The agent's `--dra-plugin-selector` default.
pub const DRA_KUBELET_PLUGIN_SELECTOR: &str = "nvidia-dra-driver-gpu-component=kubelet-plugin";

/// The label selectors whose pods restart after a change: the GPU clients' and the DRA kubelet
/// plugin's, blank ones dropped (label selectors cannot say "or", so they are listed apart).
pub fn restart_selectors(gpu_clients: Option<&str>, dra_plugin: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in [gpu_clients, dra_plugin].into_iter().flatten().map(str::trim).filter(|s| !s.is_empty()) {
        if !out.iter().any(|o| o == s) {
            out.push(s.to_string());
        }
    }
    out
}

/// What the clients enumerate: per GPU its index, UUID, MIG mode and its MIG devices' UUIDs (a
/// half-made instance is no MIG device). FNV-1a 64 over a canonical text: stable across agent
/// builds and hosts, unlike `std`'s hasher.
pub fn fingerprint(gpus: &[(GpuInfo, Vec<Instance>)]) -> String {
    let mut gpus: Vec<_> = gpus.iter().collect();
    gpus.sort_by_key(|(info, _)| info.index);
    let mut text = String::new();
    for (info, instances) in gpus {
        let mut uuids: Vec<&str> =
            instances.iter().filter(|i| i.compute_instance_id.is_some()).map(|i| i.uuid.as_str()).collect();
        uuids.sort_unstable();
        text.push_str(&format!("{}:{}:{}:{};", info.index, info.uuid, info.mig_enabled, uuids.join(",")));
    }
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")
}

/// Restart when the pass asks (a MIG mode change found the GPU held: they must let go) or the
/// MIG devices differ from those recorded. None recorded (the first agent with this record on
/// the node, a re-created GpuNode) is only recorded: restarting every node's device plugin on
/// an agent upgrade would be a disruption for nothing.
pub fn must_restart(recorded: Option<&str>, now: &str, pass_asks: bool) -> bool {
    pass_asks || recorded.is_some_and(|r| r != now)
}

#[cfg(test)]
mod tests;
