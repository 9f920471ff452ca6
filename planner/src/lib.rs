//! Tessera's planning layer: everything the controllers and the CLI decide, as pure functions of
//! what they observed. Nothing here talks to the API server or waits on a clock: this crate has no
//! API client and no async runtime among its dependencies (`cargo tree -p tessera-planner`), so a
//! function here can only read its arguments and return its answer. The runtime crate
//! (`tessera-operator`) observes, calls in here, and acts; the CLI crate (`tessera-cli`) does the
//! same for one-shot commands.

pub mod automatic_layouts;
pub mod coverage;
pub mod dra;
pub mod dra_slices;
pub mod drain;
pub mod events;
pub mod fleet;
pub mod fleet_status;
pub mod gpu_use;
pub mod idle;
pub mod liveness;
pub mod quota;
pub mod resource_version;
pub mod rollout;
pub mod selector;
pub mod status;
pub mod supply;
pub mod trimmed;

/// Hash maps of a planning pass: keyed by node and product names, looked up several times per
/// node per pass. foldhash (seeded per process) hashes such short keys several times faster than
/// the standard SipHash.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
