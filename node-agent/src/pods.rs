//! Which pod a process belongs to, from its cgroup (the agent runs in the host PID namespace):
//! a blocked change names the pods to stop, not only PIDs.

use std::collections::BTreeMap;
use std::path::Path;

/// The pod UID in a `/proc/PID/cgroup` text, for both cgroup drivers: cgroupfs
/// (`/kubepods/besteffort/pod<uid>/<ctr>`) and systemd
/// (`/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_with_underscores>.slice/...`).
pub fn pod_uid_from_cgroup(text: &str) -> Option<String> {
    for segment in text.lines().flat_map(|l| l.rsplit(':').next()).flat_map(|path| path.split('/')) {
        for (i, _) in segment.match_indices("pod") {
            let rest = &segment[i + 3..];
            let uid: String = rest.chars().take_while(|c| c.is_ascii_hexdigit() || *c == '-' || *c == '_').collect();
            let uid = uid.replace('_', "-");
            if uid.len() == 36 && uid.matches('-').count() == 4 {
                return Some(uid);
            }
        }
    }
    None
}

/// The pod per PID, for the PIDs whose cgroup (`<proc>/<pid>/cgroup`) names a pod in
/// `pods_by_uid`.
pub fn pods_of<T: Clone>(pids: &[u32], pods_by_uid: &BTreeMap<String, T>, proc: &Path) -> BTreeMap<u32, T> {
    pids.iter()
        .filter_map(|pid| {
            let text = std::fs::read_to_string(proc.join(pid.to_string()).join("cgroup")).ok()?;
            let uid = pod_uid_from_cgroup(&text)?;
            Some((*pid, pods_by_uid.get(&uid)?.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_uids_are_found_for_both_cgroup_drivers() {
        let uid = "0f3c1e9a-5b7d-4c2e-9a1b-2d3e4f5a6b7c";
        let cgroupfs = format!("0::/kubepods/besteffort/pod{uid}/4a5b6c7d8e9f");
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-4a5b.scope",
            uid.replace('-', "_")
        );
        let v1 = format!("12:memory:/kubepods/pod{uid}/abc\n11:cpu:/kubepods/pod{uid}/abc");
        for text in [cgroupfs, systemd, v1] {
            assert_eq!(pod_uid_from_cgroup(&text).as_deref(), Some(uid), "{text}");
        }
        assert_eq!(pod_uid_from_cgroup("0::/user.slice/user-0.slice/session-1.scope"), None);
        assert_eq!(pod_uid_from_cgroup("0::/kubepods/podnot-a-uid/x"), None);
    }
}
