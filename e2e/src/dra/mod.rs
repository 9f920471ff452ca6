//! Dynamic Resource Allocation fixtures playing NVIDIA's DRA driver for GPUs (`gpu.nvidia.com`):
//! its DeviceClasses, a node's ResourceSlice built from the node agent's GpuNode report (as the
//! driver's kubelet plugin would publish it; see [`devices`]), and claims and pods that use them.
//! kwok has no kubelet, so nothing prepares devices: allocation and scheduling are real (the
//! scheduler and the resource-claim controller), running containers are not.

pub mod devices;
pub mod pods;
pub mod slice;
#[cfg(test)]
mod tests;

use k8s_openapi::api::resource::v1::DeviceClass;
use serde_json::json;

pub use devices::{NodeDevices, Skipped, node_devices};
pub use pods::*;
pub use slice::{SliceAction, node_slice, plan, slice_name};

/// NVIDIA's driver name, which is also the domain of its device attributes.
pub const DRIVER: &str = tessera_planner::dra::NVIDIA_GPU_DRIVER;
/// NVIDIA's DeviceClass of whole GPUs.
pub const GPU_CLASS: &str = "gpu.nvidia.com";
/// NVIDIA's DeviceClass of MIG devices.
pub const MIG_CLASS: &str = "mig.nvidia.com";
/// Node label that makes `sim-dra-driver` publish the node's devices (`=true`).
pub const SIM_DRA_LABEL: &str = "tessera.dev/sim-dra";

/// NVIDIA's two DeviceClasses as its Helm chart (`deployments/helm/dra-driver-nvidia-gpu`,
/// `deviceclass-gpu.yaml`, `deviceclass-mig.yaml`) renders them for `resource.k8s.io/v1`,
/// including the whole-GPU class's `extendedResourceName` (a plain `nvidia.com/gpu` request
/// may then be served from DRA devices where the feature is on; 1.35's API server drops it).
pub fn device_classes() -> Vec<DeviceClass> {
    let class = |name: &str, device_type: &str, extra: serde_json::Value| {
        let mut spec = json!({"selectors": [{"cel": {"expression": format!(
            "device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{device_type}'")}}]});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name}, "spec": spec}))
        .expect("a valid DeviceClass")
    };
    vec![class(GPU_CLASS, "gpu", json!({"extendedResourceName": "nvidia.com/gpu"})), class(MIG_CLASS, "mig", json!({}))]
}

/// A CEL selector for MIG devices of one profile, as NVIDIA's examples write it.
pub fn profile_selector(profile: &str) -> String {
    format!("device.attributes['{DRIVER}'].profile == '{profile}'")
}

/// Runs `sim-dra-driver` (built by `cargo build --bins`) as admin against the test cluster.
pub fn spawn_sim_dra_driver(cp: &crate::ControlPlane) -> Result<crate::process::Component, crate::Error> {
    let env = [("KUBECONFIG", cp.kubeconfig(crate::Identity::Admin).display().to_string())];
    crate::process::Component::spawn_with_env(
        "sim-dra-driver",
        &crate::fixtures::workspace_binary("sim-dra-driver"),
        &["--resync-seconds".to_string(), "5".to_string()],
        &env,
        &cp.dir.join("logs"),
    )
}
