//! The NVML backend over the simulated `libnvidia-ml.so.1` (`tessera-nvml-sim`): the real
//! backend code, nvml-wrapper and the raw calls, against the simulator's MIG rules.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tessera_crds::gpunode::GpuIntent;

use super::*;
use crate::agent::Agent;
use crate::backend::sim::{self, CallFault, SimBackend, SimState, model};
use crate::report::GpuOutcome;
use crate::testutil::{nvml_sim, temp_dir};

fn open(products: &[&str]) -> (NvmlBackend, PathBuf) {
    let (lib, state) = nvml_sim(products);
    (NvmlBackend::init(Some(&lib)).unwrap(), state)
}

/// Changes the simulated GPUs behind the library's back (the driver's state).
fn edit(state: &Path, f: impl FnOnce(&mut SimState)) {
    let sim = SimBackend::at(state);
    let mut st = sim.load().unwrap();
    f(&mut st);
    sim.save(&st).unwrap();
}

fn fault(state: &Path, function: &str, code: u32) {
    sim::add_call_fault(state, CallFault { function: function.into(), nth: 1, code, ..Default::default() }).unwrap();
}

fn intent(mig_enabled: bool, profiles: &[(&str, i32)]) -> Vec<GpuIntent> {
    let profiles: BTreeMap<String, i32> = profiles.iter().map(|(p, n)| (p.to_string(), *n)).collect();
    vec![GpuIntent { index: 0, mig_enabled, profiles }]
}

const NVML_ERROR_UNKNOWN: u32 = 999;

/// One agent pass over `intent`, handed over, as the agent runs it (blocking, in the runtime).
fn apply<B: GpuBackend>(agent: &mut Agent<B>, intent: &[GpuIntent]) -> (Vec<(u32, GpuOutcome)>, bool) {
    tokio::task::block_in_place(|| agent.apply(intent, true))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_instance_left_without_its_compute_instance_is_no_mig_device_and_is_remade() {
    let (mut b, state) = open(&["H100-80GB"]);
    b.set_mig_mode(0, true).unwrap();
    // The agent was killed between its two creates: a GPU instance and no compute instance.
    edit(&state, |st| {
        model::create_gpu_instance(st, 0, "7g.80gb", 0).unwrap();
    });
    let half = b.instances(0).unwrap();
    assert_eq!(half.len(), 1);
    assert_eq!((half[0].compute_instance_id, half[0].uuid.as_str()), (None, ""), "not a finished MIG device");

    let mut agent = Agent::offline(b);
    let (outcomes, changed) = apply(&mut agent, &intent(true, &[("7g.80gb", 1)]));
    assert_eq!(outcomes, vec![(0, GpuOutcome::InSync)]);
    assert!(changed);
    let now = agent.backend.instances(0).unwrap();
    assert_eq!(now.len(), 1);
    assert!(now[0].compute_instance_id.is_some() && now[0].uuid.starts_with("MIG-"), "remade whole: {now:?}");
}

/// A half-made GPU instance is no MIG device (no compute instance: no process, no pod can hold
/// it), so remaking it is no layout change: it needs no drain of the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_made_instance_is_remade_without_the_hand_over() {
    let (mut b, state) = open(&["H100-80GB"]);
    b.set_mig_mode(0, true).unwrap();
    let kept = b.create_instance(0, "3g.40gb", 4).unwrap();
    edit(&state, |st| {
        model::create_gpu_instance(st, 0, "4g.40gb", 0).unwrap();
    });
    let mut agent = Agent::offline(b);
    let want = intent(true, &[("4g.40gb", 1), ("3g.40gb", 1)]);
    let (outcomes, changed) = tokio::task::block_in_place(|| agent.apply(&want, false));
    assert_eq!(outcomes, vec![(0, GpuOutcome::InSync)]);
    assert!(changed);
    let now = agent.backend.instances(0).unwrap();
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(now.iter().all(|i| i.compute_instance_id.is_some()), "{now:?}");
    assert!(now.contains(&kept), "the finished instance is untouched: {now:?}");
}

/// A layout change (a finished instance must go) still waits for the hand-over, and then the
/// half-made instance is left alone too: nothing is destroyed before the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_made_instance_beside_a_layout_change_waits_for_the_hand_over() {
    let (mut b, state) = open(&["H100-80GB"]);
    b.set_mig_mode(0, true).unwrap();
    b.create_instance(0, "3g.40gb", 4).unwrap();
    edit(&state, |st| {
        model::create_gpu_instance(st, 0, "4g.40gb", 0).unwrap();
    });
    let before = b.instances(0).unwrap();
    let mut agent = Agent::offline(b);
    let (outcomes, changed) = tokio::task::block_in_place(|| agent.apply(&intent(true, &[("7g.80gb", 1)]), false));
    assert!(matches!(&outcomes[0].1, GpuOutcome::Waiting { reason: "AwaitingDrain", .. }), "{outcomes:?}");
    assert!(!changed);
    assert_eq!(agent.backend.instances(0).unwrap(), before);
}

/// The half-made destroy removes only a GPU instance: if a compute instance appeared since the
/// pass read the GPU (another tool finishing its create), the driver refuses and nothing goes.
#[test]
fn destroying_a_half_made_instance_refuses_one_that_got_its_compute_instance() {
    let (mut b, state) = open(&["H100-80GB"]);
    b.set_mig_mode(0, true).unwrap();
    let whole = b.create_instance(0, "7g.80gb", 0).unwrap();
    assert!(matches!(b.destroy_half_made(0, whole.gpu_instance_id), Err(Error::InUse(_))));
    assert_eq!(b.instances(0).unwrap(), vec![whole.clone()]);
    b.destroy_instance(0, whole.gpu_instance_id).unwrap();
    edit(&state, |st| {
        model::create_gpu_instance(st, 0, "7g.80gb", 0).unwrap();
    });
    let half = b.instances(0).unwrap()[0].gpu_instance_id;
    b.destroy_half_made(0, half).unwrap();
    assert!(b.instances(0).unwrap().is_empty());
}

#[test]
fn mig_mode_in_use_on_hopper_is_a_retry_and_only_a_passed_through_ampere_asks_for_a_reset() {
    let (mut b, state) = open(&["H100-80GB", "A100-40GB:passthrough", "A100-40GB"]);
    // Something holds the whole H100 (a device plugin, a CUDA process): activation is IN_USE.
    sim::run_process(&state, 0, None, 4242, "nvidia-device-plugin", None).unwrap();
    match b.set_mig_mode(0, true) {
        Err(Error::InUse(message)) => assert!(message.contains("stop its clients and retry"), "{message}"),
        other => panic!("an H100 in use needs its clients stopped, not a reset: {other:?}"),
    }
    sim::stop_process(&state, 4242).unwrap();
    assert_eq!(b.set_mig_mode(0, true).unwrap(), ModeChange::Applied, "the retry once idle succeeds");
    assert_eq!(b.set_mig_mode(1, true).unwrap(), ModeChange::ResetRequired, "a VM guest cannot reset an A100");
    assert_eq!(b.set_mig_mode(2, true).unwrap(), ModeChange::Applied, "the driver resets an idle bare-metal A100");
}

/// A copy of the library whose dynamic symbol `name` is renamed, as an older driver lacks it.
fn without_symbol(lib: &Path, name: &str) -> PathBuf {
    let mut bytes = std::fs::read(lib).unwrap();
    let needle = [&[0u8][..], name.as_bytes(), &[0u8][..]].concat();
    let mut hits = 0;
    let mut i = 0;
    while let Some(pos) = bytes[i..].windows(needle.len()).position(|w| w == needle.as_slice()) {
        bytes[i + pos + 1] = b'x';
        hits += 1;
        i += pos + needle.len();
    }
    assert!(hits > 0, "{name} not found in {}", lib.display());
    let out = temp_dir("nvml-old").join("libnvidia-ml.so.1");
    std::fs::write(&out, bytes).unwrap();
    let state = lib.with_file_name("nvml-sim.json");
    std::fs::copy(state, out.with_file_name("nvml-sim.json")).unwrap();
    out
}

#[test]
fn a_symbol_the_driver_lacks_is_an_error_naming_it_not_a_panic() {
    let (lib, _) = nvml_sim(&["H100-80GB"]);
    let old = without_symbol(&lib, "nvmlDeviceGetGpuInstanceProfileInfoV");
    let mut b = NvmlBackend::init(Some(&old)).unwrap();
    assert_eq!(b.inventory().unwrap().len(), 1, "what the library has still works");
    match b.profiles(0) {
        Err(Error::MissingSymbol(name)) => assert_eq!(name, "nvmlDeviceGetGpuInstanceProfileInfoV"),
        other => panic!("expected the missing symbol named, got {other:?}"),
    }
}

#[test]
fn destroy_returns_the_compute_instance_error_instead_of_swallowing_it() {
    let (mut b, state) = open(&["H100-80GB"]);
    b.set_mig_mode(0, true).unwrap();
    let one = b.create_instance(0, "1g.10gb", 0).unwrap();
    // The destroy call itself fails (not the listing before it).
    fault(&state, "nvmlComputeInstanceDestroy", NVML_ERROR_UNKNOWN);
    match b.destroy_instance(0, one.gpu_instance_id) {
        Err(Error::Nvml(message)) => {
            assert!(message.contains("compute instance") && message.contains("999"), "{message}")
        }
        other => panic!("expected the compute-instance call's own error, got {other:?}"),
    }
    b.destroy_instance(0, one.gpu_instance_id).unwrap();
    assert!(b.instances(0).unwrap().is_empty());
}

#[test]
fn a_failure_after_the_gpu_instance_create_does_not_leak_it() {
    let (mut b, state) = open(&["H100-80GB"]);
    b.set_mig_mode(0, true).unwrap();
    // The second of the two driver calls fails: the first one's GPU instance must not leak.
    fault(&state, "nvmlGpuInstanceCreateComputeInstance", NVML_ERROR_UNKNOWN);
    assert!(b.create_instance(0, "3g.40gb", 0).is_err());
    assert_eq!(b.instances(0).unwrap(), vec![], "the GPU instance was destroyed again");
    // And a failure reading the new GPU instance back, after both creates.
    fault(&state, "nvmlGpuInstanceGetInfo", NVML_ERROR_UNKNOWN);
    assert!(b.create_instance(0, "3g.40gb", 0).is_err());
    assert_eq!(b.instances(0).unwrap(), vec![], "destroyed again here too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_through_a100_waits_for_a_reset_and_a_bare_metal_one_is_carved_at_once() {
    let (b, state) = open(&["A100-40GB:passthrough"]);
    let mut agent = Agent::offline(b);
    let (outcomes, _) = apply(&mut agent, &intent(true, &[("3g.20gb", 2)]));
    match &outcomes[0].1 {
        GpuOutcome::Blocked { reason: "ResetRequired", message } => assert!(message.contains("reset"), "{message}"),
        other => panic!("a VM guest's A100 needs a reset: {other:?}"),
    }
    let gpu = &agent.backend.inventory().unwrap()[0];
    assert_eq!((gpu.mig_enabled, gpu.mig_pending), (false, Some(true)), "pending, nothing carved");
    sim::reboot(&state).unwrap();
    let (outcomes, _) = apply(&mut agent, &intent(true, &[("3g.20gb", 2)]));
    assert_eq!(outcomes, vec![(0, GpuOutcome::InSync)], "carved after the reset");
    assert_eq!(agent.backend.instances(0).unwrap().len(), 2);

    let (b, _) = open(&["A100-40GB"]);
    let mut agent = Agent::offline(b);
    let (outcomes, _) = apply(&mut agent, &intent(true, &[("3g.20gb", 2)]));
    assert_eq!(outcomes, vec![(0, GpuOutcome::InSync)], "the driver reset the idle A100 itself");
    let ids: Vec<u32> = agent.backend.instances(0).unwrap().iter().map(|i| i.gpu_instance_id).collect();
    assert_eq!(ids, vec![1, 2], "GPU instance ids follow the placement (0:4 is 1, 4:4 is 2)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_instance_split_into_smaller_compute_instances_is_reported_and_left_alone() {
    let (mut b, state) = open(&["H100-80GB"]);
    b.set_mig_mode(0, true).unwrap();
    let whole = b.create_instance(0, "3g.40gb", 4).unwrap();
    // An admin splits a 3g into three 1-slice compute instances (nvidia-smi mig -cgi 9 -cci 0,0,0).
    edit(&state, |st| {
        let gi = model::create_gpu_instance(st, 0, "3g.40gb", 0).unwrap().gpu_instance_id;
        for _ in 0..3 {
            sim::split::create_split_compute_instance(st, 0, gi, 1).unwrap();
        }
    });
    let listed = b.instances(0).unwrap();
    let split = listed.iter().find(|i| i.start == 0).unwrap();
    assert_eq!(
        (split.compute_instance_id, split.split_compute, split.uuid.as_str()),
        (None, 3, ""),
        "no MIG device of ours"
    );
    assert_eq!(listed.iter().find(|i| i.start == 4), Some(&whole), "the whole one is still a MIG device");
    let reported = crate::report::gpu_state(&b.inventory().unwrap()[0], &listed, &[]);
    assert_eq!(reported.instances.len(), 1, "only the whole MIG device is reported as supply");

    let mut agent = Agent::offline(b);
    for want in [&[("3g.40gb", 2)][..], &[("7g.80gb", 1)][..]] {
        let (outcomes, _) = apply(&mut agent, &intent(true, want));
        match &outcomes[0].1 {
            GpuOutcome::Blocked { reason: "SplitComputeInstances", message } => {
                assert!(
                    message.contains("holds 3 smaller compute instances") && message.contains("3g.40gb@0"),
                    "{message}"
                )
            }
            other => panic!("expected the GPU left alone, got {other:?}"),
        }
    }
    assert_eq!(agent.backend.instances(0).unwrap(), listed, "nothing was touched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_opposite_mig_mode_is_cleared() {
    let (b, state) = open(&["A100-40GB"]);
    // MIG on; a disable was set, then the plan went back to MIG before anyone reset the GPU.
    edit(&state, |st| {
        st.gpus[0].info.mig_enabled = true;
        st.gpus[0].info.mig_pending = Some(false);
    });
    let mut agent = Agent::offline(b);
    let (outcomes, _) = apply(&mut agent, &intent(true, &[("7g.40gb", 1)]));
    assert_eq!(outcomes, vec![(0, GpuOutcome::InSync)]);
    let gpu = &agent.backend.inventory().unwrap()[0];
    assert_eq!((gpu.mig_enabled, gpu.mig_pending), (true, None), "a reset must not turn MIG off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_held_with_no_process_stalls_as_leaked_memory_naming_instance_and_mib() {
    let (mut b, state) = open(&["H100-80GB"]);
    b.set_mig_mode(0, true).unwrap();
    let whole = b.create_instance(0, "7g.80gb", 0).unwrap();
    sim::leak_memory(&state, 0, &whole.uuid, 4096).unwrap();
    let mut agent = Agent::offline(b);
    let (outcomes, _) = apply(&mut agent, &intent(true, &[("3g.40gb", 2)]));
    match &outcomes[0].1 {
        GpuOutcome::Blocked { reason: "LeakedMemory", message } => {
            assert!(message.contains(&whole.uuid) && message.contains("7g.80gb@0"), "{message}");
            assert!(message.contains("4096 MiB") && message.contains("GPU reset"), "{message}");
        }
        other => panic!("expected LeakedMemory, got {other:?}"),
    }
    assert_eq!(agent.backend.instances(0).unwrap(), vec![whole], "nothing was touched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_that_changes_nothing_restarts_no_gpu_client() {
    let (mut b, state) = open(&["H100-80GB", "H100-80GB"]);
    b.set_mig_mode(0, true).unwrap();
    b.set_mig_mode(1, true).unwrap();
    // GPU 1: the instance that must go is busy. GPU 0: every create fails.
    let busy = b.create_instance(1, "7g.80gb", 0).unwrap();
    sim::run_process(&state, 1, Some(&busy.uuid), 7, "train", None).unwrap();
    fault(&state, "nvmlDeviceCreateGpuInstance", NVML_ERROR_UNKNOWN);
    let mut both = intent(true, &[("7g.80gb", 1)]);
    both.push(GpuIntent { index: 1, ..intent(true, &[("3g.40gb", 2)]).remove(0) });
    let mut agent = Agent::offline(b);
    let (outcomes, restart) = apply(&mut agent, &both);
    assert!(matches!(outcomes[0].1, GpuOutcome::Failed { .. }), "{outcomes:?}");
    assert!(matches!(outcomes[1].1, GpuOutcome::Blocked { reason: "InstanceInUse", .. }), "{outcomes:?}");
    assert!(!restart, "nothing changed: the device plugin must not be restarted (MIG resources would flap)");
    // The fault was one call: the next pass creates, and that change restarts the clients once.
    let (outcomes, restart) = apply(&mut agent, &both);
    assert_eq!(outcomes[0].1, GpuOutcome::InSync);
    assert!(restart);
    let (_, restart) = apply(&mut agent, &both);
    assert!(!restart, "in sync (GPU 0) and still blocked (GPU 1): no restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mode_change_the_gpu_clients_block_restarts_them_and_the_retry_applies() {
    let (b, state) = open(&["H100-80GB"]);
    // The device plugin holds the GPU open (no compute process to see): activation is IN_USE.
    sim::hold_device(&state, 0, "nvidia-device-plugin", true).unwrap();
    let mut agent = Agent::offline(b);
    let want = intent(true, &[("7g.80gb", 1)]);
    let (outcomes, restart) = apply(&mut agent, &want);
    match &outcomes[0].1 {
        GpuOutcome::Failed { message } => assert!(message.contains("in use"), "{message}"),
        other => panic!("an H100 in use is retried, not sent to a reset: {other:?}"),
    }
    assert!(restart, "the GPU clients are restarted so they let go of the GPU");
    // They let go (the restarted pod has not opened the GPU yet): the next pass applies.
    sim::hold_device(&state, 0, "nvidia-device-plugin", false).unwrap();
    let (outcomes, _) = apply(&mut agent, &want);
    assert_eq!(outcomes[0].1, GpuOutcome::InSync);
    assert!(agent.backend.inventory().unwrap()[0].mig_enabled);
}

#[test]
fn after_a_driver_restart_the_backend_opens_nvml_again_and_sees_the_gpus_as_they_are() {
    let (mut b, state) = open(&["H100-80GB"]);
    b.set_mig_mode(0, true).unwrap();
    b.create_instance(0, "7g.80gb", 0).unwrap();
    // The driver reloads: instances are gone, Hopper's MIG mode too, and old handles are lost.
    sim::driver_restart(&state).unwrap();
    let gpus = b.inventory().expect("the next pass works without restarting the agent");
    assert!(!gpus[0].mig_enabled, "{gpus:?}");
    assert_eq!(b.set_mig_mode(0, true).unwrap(), ModeChange::Applied);
    assert!(b.instances(0).unwrap().is_empty());
}

#[test]
fn a_mig_device_whose_memory_cannot_be_read_is_left_out_alone() {
    let (mut b, state) = open(&["H100-80GB"]);
    b.set_mig_mode(0, true).unwrap();
    let three = b.create_instance(0, "3g.40gb", 4).unwrap();
    let one = b.create_instance(0, "1g.10gb", 0).unwrap();
    // The pass reads the GPU's memory (inventory), then each MIG device's in start order: the
    // second read is the 1g device's.
    sim::add_call_fault(
        &state,
        CallFault {
            function: "nvmlDeviceGetMemoryInfo".into(),
            nth: 2,
            code: NVML_ERROR_UNKNOWN,
            ..Default::default()
        },
    )
    .unwrap();
    let (got, unread) = crate::activity::sample::observe_all(&mut b).unwrap();
    let keys: Vec<_> = got.iter().map(|o| o.key()).collect();
    assert_eq!(keys, vec![(0, Some(three.uuid.clone()))], "the other device is measured");
    assert_eq!(unread, vec![(0, Some(one.uuid.clone()))], "the failed one is marked unread, not gone");
    // The fault was one call: the next pass measures both.
    let (got, unread) = crate::activity::sample::observe_all(&mut b).unwrap();
    assert_eq!((got.len(), unread.len()), (2, 0));
}
