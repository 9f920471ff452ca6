use super::*;
use crate::testutil::temp_dir;

fn sim(products: &[&str]) -> (SimBackend, PathBuf) {
    let state = temp_dir("sim").join("state.json");
    let p: Vec<String> = products.iter().map(|s| s.to_string()).collect();
    (SimBackend::open(&state, &p).unwrap(), state)
}

#[test]
fn hopper_and_bare_metal_ampere_enable_mig_at_once_and_passthrough_ampere_needs_a_reset() {
    let (mut s, state) = sim(&["H100-80GB", "A100-40GB:passthrough", "A100-40GB", "A30-24GB"]);
    assert_eq!(s.set_mig_mode(0, true).unwrap(), ModeChange::Applied);
    assert_eq!(s.set_mig_mode(1, true).unwrap(), ModeChange::ResetRequired, "a VM guest cannot reset");
    assert_eq!(s.set_mig_mode(2, true).unwrap(), ModeChange::Applied, "the driver resets an idle A100");
    // A held A30 on bare metal: the driver cannot reset it either; stop the clients and retry.
    run_process(&state, 3, None, 9, "dcgm", None).unwrap();
    assert!(matches!(s.set_mig_mode(3, true), Err(Error::InUse(_))));
    stop_process(&state, 9).unwrap();
    assert_eq!(s.set_mig_mode(3, true).unwrap(), ModeChange::Applied);
    let inv = s.inventory().unwrap();
    assert!(inv[0].mig_enabled && inv[0].mig_pending.is_none());
    assert!(!inv[1].mig_enabled && inv[1].mig_pending == Some(true));
    assert!(inv[2].mig_enabled && inv[2].mig_pending.is_none());
    assert!(matches!(s.create_instance(1, "7g.40gb", 0), Err(Error::InvalidArgument(_))));
    reboot(&state).unwrap();
    let inv = s.inventory().unwrap();
    assert!(inv[1].mig_enabled, "the pending mode took effect at reboot");
    assert!(inv[2].mig_enabled, "Ampere keeps MIG mode across reboots");
    assert!(!inv[0].mig_enabled, "Hopper's MIG mode does not survive a reboot");
}

#[test]
fn an_unknown_gpu_option_is_an_error_naming_it() {
    let state = temp_dir("sim-opt").join("state.json");
    match SimBackend::open(&state, &["A100-40GB:vm".to_string()]) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("A100-40GB:vm") && m.contains("passthrough"), "{m}"),
        other => panic!("expected an invalid argument, got {:?}", other.err()),
    }
}

/// `GPU-`/`MIG-` and 8-4-4-4-12 lowercase hex, as NVML prints them.
pub(crate) fn is_nvml_uuid(s: &str, prefix: &str) -> bool {
    let Some(rest) = s.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else { return false };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

#[test]
fn uuids_have_nvmls_form_and_are_stable_per_gpu() {
    let (mut s, state) = sim(&["H100-80GB", "H100-80GB"]);
    let first: Vec<String> = s.inventory().unwrap().into_iter().map(|g| g.uuid).collect();
    assert!(first.iter().all(|u| is_nvml_uuid(u, "GPU")), "{first:?}");
    assert_ne!(first[0], first[1]);
    // The same simulated GPU made again (state file lost) has the same UUID; another node's not.
    std::fs::remove_file(&state).unwrap();
    let again: Vec<String> = SimBackend::open(&state, &["H100-80GB".into()])
        .unwrap()
        .inventory()
        .unwrap()
        .into_iter()
        .map(|g| g.uuid)
        .collect();
    assert_eq!(again[0], first[0]);
    let (mut other, _) = sim(&["H100-80GB"]);
    assert_ne!(other.inventory().unwrap()[0].uuid, first[0]);
    // A MIG device's UUID: NVML's form, the same in every read while it exists.
    let mut s = SimBackend::at(&state);
    s.set_mig_mode(0, true).unwrap();
    let made = s.create_instance(0, "1g.10gb", 0).unwrap();
    assert!(is_nvml_uuid(&made.uuid, "MIG"), "{}", made.uuid);
    assert_eq!(SimBackend::open(&state, &[]).unwrap().instances(0).unwrap()[0].uuid, made.uuid);
    let next = s.create_instance(0, "1g.10gb", 1).unwrap();
    assert_ne!(next.uuid, made.uuid);
}

#[test]
fn gpu_instance_ids_follow_the_placement_and_are_reused() {
    let (mut s, _) = sim(&["H100-80GB", "A30-24GB"]);
    s.set_mig_mode(0, true).unwrap();
    s.set_mig_mode(1, true).unwrap();
    let id = |s: &mut SimBackend, gpu, profile, start| s.create_instance(gpu, profile, start).unwrap().gpu_instance_id;
    // nvidia-smi mig -lgi on the hardware: 1g at 6 is 13, 2g at 4 is 5, 3g at 0 is 1, 7g is 0.
    assert_eq!(id(&mut s, 0, "1g.10gb", 6), 13);
    assert_eq!(id(&mut s, 0, "2g.20gb", 4), 5);
    assert_eq!(id(&mut s, 0, "3g.40gb", 0), 1);
    s.destroy_instance(0, 13).unwrap();
    assert_eq!(id(&mut s, 0, "1g.10gb", 6), 13, "the id comes back with the placement");
    assert_eq!(id(&mut s, 1, "1g.6gb", 2), 5, "A30: four single slots are 3..6");
    assert_eq!(id(&mut s, 1, "2g.12gb", 0), 1);
    for g in s.instances(0).unwrap() {
        s.destroy_instance(0, g.gpu_instance_id).unwrap();
    }
    assert_eq!(id(&mut s, 0, "7g.80gb", 0), 0);
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

#[test]
fn compute_instances_smaller_than_their_gpu_instance_are_counted_and_block_the_whole_one() {
    use super::split::{create_split_compute_instance, split_sizes};
    assert_eq!(split_sizes(3), vec![(1, 3), (2, 1)], "a 3g holds three 1c or one 2c");
    assert_eq!(split_sizes(7), vec![(1, 7), (2, 3), (3, 2), (4, 1)]);
    assert_eq!(split_sizes(1), vec![]);
    let (mut s, state) = sim(&["H100-80GB"]);
    s.set_mig_mode(0, true).unwrap();
    let mut st = s.load().unwrap();
    let gi = model::create_gpu_instance(&mut st, 0, "3g.40gb", 0).unwrap().gpu_instance_id;
    let made: Vec<u8> = (0..3).map(|_| create_split_compute_instance(&mut st, 0, gi, 1).unwrap().start).collect();
    assert_eq!(made, vec![0, 1, 2]);
    assert!(matches!(create_split_compute_instance(&mut st, 0, gi, 1), Err(Error::InsufficientResources(_))));
    assert!(
        matches!(create_split_compute_instance(&mut st, 0, gi, 3), Err(Error::InvalidArgument(_))),
        "3c is the whole"
    );
    assert!(matches!(model::create_compute_instance(&mut st, 0, gi), Err(Error::InsufficientResources(_))));
    assert!(matches!(model::destroy_gpu_instance(&mut st, 0, gi), Err(Error::InUse(_))));
    s.save(&st).unwrap();
    let listed = s.instances(0).unwrap();
    assert_eq!((listed[0].compute_instance_id, listed[0].split_compute, listed[0].uuid.as_str()), (None, 3, ""));
    reboot(&state).unwrap();
    assert!(s.load().unwrap().gpus[0].split.is_empty(), "a reboot clears them with their GPU instance");
}
