//! Allocated versus used: what each MIG instance (or whole GPU) of a node did lately, as its node
//! agent measured it, summarised for `GpuNode.status.activity`. The agent samples often and
//! serves every figure on its `/metrics`; this summary is written at most every few minutes and
//! only on a meaningful change, so the API server is not flooded. The operator joins it with the
//! holders it knows (pods, claims, tenants) to report idle slices per tenant.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The summary of one node's devices.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeActivity {
    /// When the agent last measured (the figures cover the windows ending here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_at: Option<Time>,
    /// Every MIG instance, and every whole GPU with MIG off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 512))]
    pub devices: Vec<DeviceActivity>,
}

/// How activity was measured on a device.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ActivitySource {
    /// GPU Performance Monitoring (Hopper and later): the share of time SMs were active, per
    /// MIG instance.
    #[default]
    Gpm,
    /// No GPM (A100, A30, or GPM unavailable): only compute processes and memory are seen; a
    /// process that holds a context and computes nothing looks busy.
    ProcessesAndMemory,
}

/// One device's recent activity.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DeviceActivity {
    /// The GPU's index on the node (`status.gpus[].index`).
    pub gpu_index: i32,
    /// The MIG instance's UUID; absent for a whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The instance's profile (`3g.40gb`); absent for a whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The instance's first memory slot; absent for a whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<i32>,
    pub source: ActivitySource,
    /// Mean SM activity over the last hour, in percent (0-100); absent without GPM or before
    /// any sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_percent_1h: Option<i32>,
    /// Mean SM activity over the last 24 hours (or since the agent started), in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_percent_24h: Option<i32>,
    /// Since when the device has been idle without a break; absent while it is active. GPM: idle
    /// once SM activity is under 1%, and active again only at 5% or more (a figure between
    /// keeps the stretch, and does not start one); without GPM: no compute process. A stretch
    /// never spans more than 10 minutes the agent did not observe (stopped, hung, or restarted
    /// without reading its devices): it starts over after. A clock stepped back moves it back by
    /// the step (never in the future), across a restart too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<Time>,
    /// GPU memory in use on the device, MiB, as of the last write: a change alone is not
    /// written. Without a compute process, memory rising over 256 MiB (held: a leak) is
    /// written, and once written held, falling to 128 MiB or less; amounts that only move are
    /// not (read it against 256 MiB).
    #[serde(default)]
    pub memory_used_mib: i64,
    /// Compute processes running on the device, as of the last write: processes appearing or
    /// all going is written, a count that only moves is not.
    #[serde(default)]
    pub processes: i32,
    /// The pod all of the device's compute processes run in (the agent finds it from their
    /// cgroups); absent with no process, processes of several pods or outside any pod, or
    /// without the host PID namespace. The API does not say which device the device plugin gave
    /// which pod; this names the holder of a device with processes exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<DevicePod>,
}

/// A pod running processes on a device. The UID tells a pod from a later one of the same name
/// (a StatefulSet's), which may hold another device.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct DevicePod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for DevicePod {
    /// `namespace/name`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Memory in use on a device with no compute process above this many MiB is held (a leak, or a
/// context left open). Not measured: an idle MIG device shows tens of MiB in use on real
/// hardware (11 MiB in NVIDIA's examples), a CUDA context several hundred. Shared by the node
/// agent (reports, write rule) and the operator (idle rule) so both draw the line at one place.
pub const LEAK_THRESHOLD_MIB: u64 = 256;

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use crate::GpuNode;

    /// The description of `status.activity.devices[].<field>` in the GpuNode CRD.
    fn description(field: &str) -> String {
        let crd = serde_json::to_value(GpuNode::crd()).unwrap();
        let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
        let device = &status["properties"]["activity"]["properties"]["devices"]["items"]["properties"];
        device[field]["description"].as_str().unwrap_or_default().to_string()
    }

    #[test]
    fn the_crd_says_when_an_idle_device_is_active_again_and_which_figures_are_as_written() {
        let idle = description("idleSince");
        // The agent's hysteresis: idle under 1%, active again only from 5%; and its gap rule.
        assert!(idle.contains("under 1%") && idle.contains("at 5% or more"), "idleSince: {idle}");
        assert!(idle.contains("10 minutes"), "idleSince, the gap rule: {idle}");
        // Written only when a leak begins or ends: the stored figures may lag the device.
        for field in ["memoryUsedMib", "processes"] {
            let d = description(field);
            assert!(d.contains("as of the last write"), "{field}: {d}");
        }
    }
}
