use super::*;
use crate::testutil::temp_dir;

fn sim(products: &[&str]) -> (SimBackend, PathBuf) {
    let state = temp_dir("sim").join("state.json");
    let p: Vec<String> = products.iter().map(|s| s.to_string()).collect();
    (SimBackend::open(&state, &p).unwrap(), state)
}

#[test]
fn hopper_enables_mig_at_once_and_ampere_needs_a_reset() {
    let (mut s, state) = sim(&["H100-80GB", "A100-40GB"]);
    assert_eq!(s.set_mig_mode(0, true).unwrap(), ModeChange::Applied);
    assert_eq!(s.set_mig_mode(1, true).unwrap(), ModeChange::ResetRequired);
    let inv = s.inventory().unwrap();
    assert!(inv[0].mig_enabled && inv[0].mig_pending.is_none());
    assert!(!inv[1].mig_enabled && inv[1].mig_pending == Some(true));
    assert!(matches!(s.create_instance(1, "7g.40gb", 0), Err(Error::InvalidArgument(_))));
    reboot(&state).unwrap();
    let inv = s.inventory().unwrap();
    assert!(inv[1].mig_enabled, "the pending mode took effect at reboot");
    assert!(!inv[0].mig_enabled, "Hopper's MIG mode does not survive a reboot");
}

#[test]
fn placement_rules_and_nvml_like_errors() {
    let (mut s, _) = sim(&["H100-80GB"]);
    s.set_mig_mode(0, true).unwrap();
    let a = s.create_instance(0, "3g.40gb", 4).unwrap();
    assert!(matches!(s.create_instance(0, "7g.80gb", 0), Err(Error::InsufficientResources(_))), "overlaps 3g@4");
    assert!(matches!(s.create_instance(0, "2g.20gb", 5), Err(Error::InsufficientResources(_))), "5 is no 2g start");
    assert!(matches!(s.create_instance(0, "2g.20gb", 4), Err(Error::InsufficientResources(_))), "overlaps");
    assert!(matches!(s.create_instance(0, "1g.5gb", 0), Err(Error::InvalidArgument(_))), "not an H100 profile");
    s.create_instance(0, "2g.20gb", 0).unwrap();
    assert!(matches!(s.set_mig_mode(0, false), Err(Error::InUse(_))), "instances exist");
    assert!(matches!(s.destroy_instance(0, 99), Err(Error::NotFound(_))));
    s.destroy_instance(0, a.gpu_instance_id).unwrap();
    assert_eq!(s.instances(0).unwrap().len(), 1);
}

#[test]
fn busy_instances_cannot_be_destroyed_and_state_survives_reopen() {
    let (mut s, state) = sim(&["H100-80GB"]);
    s.set_mig_mode(0, true).unwrap();
    let a = s.create_instance(0, "7g.80gb", 0).unwrap();
    run_process(&state, 0, Some(&a.uuid), 77, "python", None).unwrap();
    assert!(matches!(s.destroy_instance(0, a.gpu_instance_id), Err(Error::InUse(_))));
    let mut reopened = SimBackend::open(&state, &[]).unwrap();
    assert_eq!(reopened.instances(0).unwrap(), vec![a.clone()]);
    assert_eq!(reopened.processes(0).unwrap()[0].pid, 77);
    stop_process(&state, 77).unwrap();
    reopened.destroy_instance(0, a.gpu_instance_id).unwrap();
}

#[test]
fn injected_failure_after_k_operations() {
    let (s, _) = sim(&["H100-80GB"]);
    // Mode (1), then a MIG device is two operations: GPU instance (2), compute instance (3).
    let mut s = s.with_fault(Some(Fault::FailAfter(3)));
    s.set_mig_mode(0, true).unwrap();
    s.create_instance(0, "1g.10gb", 0).unwrap();
    assert!(matches!(s.create_instance(0, "1g.10gb", 1), Err(Error::InjectedFault(3))));
    assert_eq!(s.instances(0).unwrap().len(), 1, "a failed operation changes nothing");
}
