//! The NVML backend over the simulated `libnvidia-ml.so.1` (`tessera-nvml-sim`): the real
//! backend code, nvml-wrapper and the raw calls, against the simulator's MIG rules.

use std::path::PathBuf;

use super::*;
use crate::backend::sim;
use crate::testutil::nvml_sim;

fn open(products: &[&str]) -> (NvmlBackend, PathBuf) {
    let (lib, state) = nvml_sim(products);
    (NvmlBackend::init(Some(&lib)).unwrap(), state)
}

#[test]
fn creates_lists_and_destroys_mig_devices_through_the_library() {
    let (mut b, state) = open(&["H100-80GB"]);
    assert_eq!(b.set_mig_mode(0, true).unwrap(), ModeChange::Applied);
    let three = b.create_instance(0, "3g.40gb", 4).unwrap();
    let two = b.create_instance(0, "2g.20gb", 0).unwrap();
    assert!(three.uuid.starts_with("MIG-") && three.compute_instance_id.is_some());
    assert!(matches!(b.create_instance(0, "7g.80gb", 0), Err(Error::InsufficientResources(_))));
    let listed = b.instances(0).unwrap();
    assert_eq!(listed, vec![two.clone(), three.clone()]);
    sim::run_process(&state, 0, Some(&three.uuid), 77, "python", Some(1024)).unwrap();
    let procs = b.processes(0).unwrap();
    assert_eq!((procs[0].pid, procs[0].gpu_instance_id), (77, Some(three.gpu_instance_id)));
    assert_eq!(b.memory_used_mib(0, three.gpu_instance_id).unwrap(), 1024);
    assert!(matches!(b.destroy_instance(0, three.gpu_instance_id), Err(Error::InUse(_))));
    sim::stop_process(&state, 77).unwrap();
    b.destroy_instance(0, three.gpu_instance_id).unwrap();
    b.destroy_instance(0, two.gpu_instance_id).unwrap();
    assert!(b.instances(0).unwrap().is_empty());
    assert_eq!(b.set_mig_mode(0, false).unwrap(), ModeChange::Applied);
}
