//! Devices the node agent saw one pod's processes on (`GpuNode.status.activity.devices[].pod`,
//! found from the processes' cgroups): that pod holds the device, so its holder is exact where
//! the API alone leaves a guess (several pods of one profile on a node, device-plugin devices).
//! Placed after claims and before the guesses, which then share out only what is left: with
//! every other pod of the profile named, the last one's device is exact by elimination.
//!
//! A naming is used only while it is still true: the same pod (name and UID: a StatefulSet's
//! next pod of the same name may hold another device) holds that resource on this node, the
//! device is still the one measured (GPU, start, profile; UUID where both say), no claim names
//! it, and the pod is named on no more devices of the resource than it holds (else its
//! processes see devices it was not given, e.g. a privileged pod, and none of its namings count).

use std::collections::{BTreeMap, BTreeSet};

use tessera_crds::activity::NodeActivity;
use tessera_crds::catalog::{mig_resource_name, normalize_profile};
use tessera_crds::gpunode::GpuState;

use super::{Device, GPU_RESOURCE, GpuStatus, PodHolds, set_holder};

/// Sets the holders the agent named on `out` (exact), takes them out of their pods' counts in
/// `pods` (so the guesses share out only the rest) and adds them to `taken`.
pub(super) fn place(
    out: &mut [GpuStatus],
    gpus: &[GpuState],
    activity: Option<&NodeActivity>,
    pods: &mut [PodHolds],
    taken: &mut BTreeSet<Device>,
) {
    let mut named: BTreeMap<(usize, String), Vec<Device>> = BTreeMap::new();
    for d in activity.map(|a| a.devices.as_slice()).unwrap_or_default() {
        let Some(who) = &d.pod else { continue };
        let Some(gi) = gpus.iter().position(|g| g.index == d.gpu_index) else { continue };
        let g = &gpus[gi];
        let (device, resource) = match (g.mig_enabled, d.start, &d.profile) {
            (true, Some(start), Some(profile)) => {
                let Some(i) = g.instances.iter().position(|i| {
                    i.start == start
                        && normalize_profile(&i.profile) == normalize_profile(profile)
                        && (i.uuid.is_none() || d.uuid.is_none() || i.uuid == d.uuid)
                }) else {
                    continue;
                };
                ((gi, Some(i)), mig_resource_name(&g.instances[i].profile))
            }
            (false, None, None) => ((gi, None), GPU_RESOURCE.to_string()),
            _ => continue,
        };
        if taken.contains(&device) {
            continue;
        }
        let key = who.to_string();
        let Some(pi) = pods.iter().position(|(h, _, uid)| h.pod == key && uid.as_deref() == Some(who.uid.as_str()))
        else {
            continue;
        };
        named.entry((pi, resource)).or_default().push(device);
    }
    for ((pi, resource), devices) in named {
        let (holder, held, _) = &mut pods[pi];
        let Some(n) = held.get_mut(&resource) else { continue };
        let count = i64::try_from(devices.len()).unwrap_or(i64::MAX);
        if count > *n {
            continue;
        }
        *n -= count;
        if *n == 0 {
            held.remove(&resource);
        }
        for (gi, inst) in devices {
            set_holder(&mut out[gi], inst, holder.clone());
            taken.insert((gi, inst));
        }
    }
}
