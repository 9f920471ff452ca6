//! When a guessed holder is idle for sure. The placement guesses which of a node's devices of one
//! profile each extended-resource pod holds, but each such pod holds some device of that
//! profile's guessed group (claims' and the agent's named devices are someone else's). So when
//! every device of the group is measured idle, each guessed pod's devices are idle, since no
//! later than the latest `idleSince` of the group: its idle time, counted from there, is certain,
//! though which device it holds is not.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use tessera_crds::activity::DeviceActivity;

use super::{Placed, matches};

/// Per profile (`whole` for whole GPUs) of the node's guessed devices: the latest `idleSince`
/// of the group when every device in it (held or free) is measured idle; profiles with a device
/// busy or not measured are absent.
pub(super) fn idle_groups(placed: &[Placed], devices: &[DeviceActivity]) -> BTreeMap<String, Timestamp> {
    let mut groups: BTreeMap<&str, Option<Timestamp>> = BTreeMap::new();
    for p in placed.iter().filter(|p| !p.exact) {
        let since = devices.iter().find(|d| matches(d, p)).and_then(|d| d.idle_since.as_ref()).map(|t| t.0);
        let g = groups.entry(&p.profile).or_insert(since);
        *g = match (*g, since) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }
    groups.into_iter().filter_map(|(k, v)| Some((k.to_string(), v?))).collect()
}
