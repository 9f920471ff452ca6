//! Dynamic Resource Allocation (DRA): which drivers hand out GPUs, and the names Tessera and
//! NVIDIA's DRA driver give things. GPUs reach pods two ways: extended resources from the device
//! plugin (`nvidia.com/gpu`, `nvidia.com/mig-*`) and ResourceClaims allocated from the
//! ResourceSlices a DRA driver publishes. Everything that asks "does this pod use a GPU" or
//! "how many devices of a profile does this tenant hold" must see both.

/// NVIDIA's DRA driver for GPUs (`k8s-dra-driver-gpu`): its driver name and attribute domain.
pub const NVIDIA_GPU_DRIVER: &str = "gpu.nvidia.com";

/// The DRA drivers whose devices are GPUs (the operator's `--gpu-dra-drivers`). A claim
/// allocated devices of one of these drivers makes its pods GPU pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDrivers(Vec<String>);

impl Default for GpuDrivers {
    fn default() -> Self {
        GpuDrivers(vec![NVIDIA_GPU_DRIVER.to_string()])
    }
}

impl GpuDrivers {
    /// The drivers in `list` (empty entries and duplicates dropped; the order kept).
    pub fn new<S: AsRef<str>>(list: impl IntoIterator<Item = S>) -> Self {
        let mut out: Vec<String> = Vec::new();
        for d in list {
            let d = d.as_ref().trim();
            if !d.is_empty() && !out.iter().any(|o| o == d) {
                out.push(d.to_string());
            }
        }
        GpuDrivers(out)
    }

    /// Whether devices of `driver` are GPUs.
    pub fn contains(&self, driver: &str) -> bool {
        self.0.iter().any(|d| d == driver)
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_nvidias_driver_and_lists_are_cleaned() {
        assert!(GpuDrivers::default().contains("gpu.nvidia.com"));
        assert!(!GpuDrivers::default().contains("gpu.example.com"));
        let d = GpuDrivers::new(["a.example", " ", "b.example", "a.example"]);
        assert_eq!(d.iter().collect::<Vec<_>>(), ["a.example", "b.example"]);
        assert!(!d.contains(""));
    }
}
