use proptest::prelude::*;
use tessera_crds::catalog::{self, GpuModel};

use super::*;
use crate::backend::GpuBackend;
use crate::backend::sim::{SimBackend, run_process};
use crate::testutil::temp_dir;

fn model(p: &str) -> &'static GpuModel {
    catalog::lookup(p).unwrap()
}

fn inst(id: u32, profile: &str, start: u8, size: u8) -> Instance {
    Instance {
        gpu_instance_id: id,
        compute_instance_id: Some(0),
        profile: profile.into(),
        start,
        size,
        uuid: format!("MIG-{id}"),
        split_compute: 0,
    }
}

fn target(items: &[(&str, u32)]) -> Target {
    Target { mig_enabled: true, profiles: items.iter().map(|(k, v)| (k.to_string(), *v)).collect() }
}

fn on(instances: Vec<Instance>) -> Observed {
    Observed { mig_enabled: true, instances, ..Default::default() }
}

#[test]
fn a_matching_gpu_needs_no_steps() {
    let obs = on(vec![inst(1, "3g.40gb", 0, 4), inst(2, "3g.40gb", 4, 4)]);
    assert_eq!(plan(model("H100-80GB"), &obs, &target(&[("3g.40gb", 2)])), Ok(vec![]));
}

#[test]
fn only_what_must_go_is_destroyed() {
    // 3g@0 + 3g@4 -> 3g + 2g + 1g: keep one 3g, replace the other.
    let obs = on(vec![inst(1, "3g.40gb", 0, 4), inst(2, "3g.40gb", 4, 4)]);
    let steps = plan(model("H100-80GB"), &obs, &target(&[("3g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 1)])).unwrap();
    assert_eq!(
        steps,
        vec![
            Step::Destroy { gpu_instance_id: 2, profile: "3g.40gb".into(), start: 4 },
            Step::Create { profile: "2g.20gb".into(), start: 4 },
            Step::Create { profile: "1g.10gb".into(), start: 6 },
        ]
    );
}

#[test]
fn the_busy_instance_is_the_one_kept() {
    let mut obs = on(vec![inst(1, "3g.40gb", 0, 4), inst(2, "3g.40gb", 4, 4)]);
    obs.busy.insert(2, vec![4242]);
    let steps = plan(model("H100-80GB"), &obs, &target(&[("3g.40gb", 1), ("2g.20gb", 2)])).unwrap();
    assert_eq!(steps[0], Step::Destroy { gpu_instance_id: 1, profile: "3g.40gb".into(), start: 0 });
    assert!(!steps.iter().any(|s| matches!(s, Step::Destroy { gpu_instance_id: 2, .. })));
}

#[test]
fn a_busy_instance_that_must_go_blocks_and_names_the_pids() {
    let mut obs = on(vec![inst(1, "7g.80gb", 0, 8)]);
    obs.busy.insert(1, vec![4242, 4243]);
    let err = plan(model("H100-80GB"), &obs, &target(&[("1g.10gb", 7)])).unwrap_err();
    assert!(matches!(&err, Blocked::Busy(list) if list.len() == 1));
    assert_eq!(
        err.to_string(),
        "instances that must be destroyed are in use: 7g.80gb@0 (MIG-1) is used by PIDs [4242, 4243]"
    );
}

#[test]
fn enabling_mig_sets_the_mode_then_creates() {
    let obs = Observed::default();
    let steps = plan(model("A100-40GB"), &obs, &target(&[("7g.40gb", 1)])).unwrap();
    assert_eq!(steps, vec![Step::SetMigMode(true), Step::Create { profile: "7g.40gb".into(), start: 0 }]);
}

#[test]
fn disabling_mig_destroys_every_instance_first() {
    let obs = on(vec![inst(1, "4g.20gb", 0, 4), inst(2, "3g.20gb", 4, 4)]);
    let t = Target { mig_enabled: false, profiles: Default::default() };
    let steps = plan(model("A100-40GB"), &obs, &t).unwrap();
    assert_eq!(steps.len(), 3);
    assert_eq!(steps[2], Step::SetMigMode(false));
}

#[test]
fn a_pending_mode_is_set_again_so_the_driver_says_whether_a_reset_is_needed() {
    let obs = Observed { mig_pending: Some(true), ..Default::default() };
    let steps = plan(model("A100-40GB"), &obs, &target(&[("7g.40gb", 1)])).unwrap();
    assert_eq!(steps[0], Step::SetMigMode(true));
}

#[test]
fn a_pending_opposite_mode_is_cleared() {
    let obs = Observed { mig_pending: Some(false), ..on(vec![inst(1, "7g.40gb", 0, 8)]) };
    assert_eq!(plan(model("A100-40GB"), &obs, &target(&[("7g.40gb", 1)])), Ok(vec![Step::SetMigMode(true)]));
}

#[test]
fn a_gpu_instance_without_its_compute_instance_is_remade() {
    let half = Instance { compute_instance_id: None, uuid: String::new(), ..inst(1, "7g.80gb", 0, 8) };
    let steps = plan(model("H100-80GB"), &on(vec![half]), &target(&[("7g.80gb", 1)])).unwrap();
    assert_eq!(
        steps,
        vec![
            Step::DestroyHalfMade { gpu_instance_id: 1, profile: "7g.80gb".into(), start: 0 },
            Step::Create { profile: "7g.80gb".into(), start: 0 }
        ]
    );
    assert!(steps.iter().all(|s| !s.needs_hand_over()), "remaking a half-made instance is no layout change");
}

#[test]
fn only_creates_and_half_made_destroys_go_without_the_hand_over() {
    let whole = Step::Destroy { gpu_instance_id: 1, profile: "7g.80gb".into(), start: 0 };
    let half = Step::DestroyHalfMade { gpu_instance_id: 1, profile: "7g.80gb".into(), start: 0 };
    let create = Step::Create { profile: "7g.80gb".into(), start: 0 };
    let needs: Vec<bool> = [whole, half, create, Step::SetMigMode(true)].iter().map(Step::needs_hand_over).collect();
    assert_eq!(needs, vec![true, false, false, true]);
}

#[test]
fn whole_gpu_processes_block_a_mode_change() {
    let obs = Observed { gpu_processes: vec![7], ..Default::default() };
    assert_eq!(plan(model("H100-80GB"), &obs, &target(&[("7g.80gb", 1)])), Err(Blocked::GpuBusy(vec![7])));
}

#[test]
fn an_impossible_target_is_no_fit() {
    assert!(matches!(
        plan(model("H100-80GB"), &on(vec![]), &target(&[("4g.40gb", 2)])),
        Err(Blocked::NoFit(FitError::OverMaxCount { .. }))
    ));
}

fn arb_case() -> impl Strategy<Value = (&'static str, usize, usize, u8)> {
    prop_oneof![Just("H100-80GB"), Just("A100-40GB"), Just("A30-24GB")]
        .prop_flat_map(|p| (Just(p), 0usize..10_000, 0usize..10_000, any::<u8>()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    /// From any valid layout to any valid layout, with any instances busy: a plan, applied to the
    /// simulator, reaches the target exactly; busy instances are never destroyed; when every
    /// current instance is wanted and fits, none is destroyed.
    #[test]
    fn plans_applied_to_the_simulator_reach_the_target((product, from, to, busy_mask) in arb_case()) {
        let m = model(product);
        let layouts = solver::all_layouts(m, None);
        let from = &layouts[from % layouts.len()];
        let to = solver::counts_of(&layouts[to % layouts.len()]);
        let dir = temp_dir("plan");
        let state = dir.join("sim.json");
        let mut sim = SimBackend::open(&state, &[product.to_string()]).unwrap();
        sim.set_mig_mode(0, true).unwrap();
        if product != "H100-80GB" {
            // Ampere: the simulated reset makes the pending mode real.
            crate::backend::sim::reboot(&state).unwrap();
        }
        for p in from {
            sim.create_instance(0, &p.profile, p.start).unwrap();
        }
        let current = sim.instances(0).unwrap();
        let mut observed = Observed { mig_enabled: true, instances: current.clone(), ..Default::default() };
        for (bit, i) in current.iter().enumerate() {
            if busy_mask & (1 << bit) != 0 {
                run_process(&state, 0, Some(&i.uuid), 1000 + bit as u32, "train", None).unwrap();
                observed.busy.insert(i.gpu_instance_id, vec![1000 + bit as u32]);
            }
        }
        let t = Target { mig_enabled: true, profiles: to.clone() };
        match plan(m, &observed, &t) {
            Ok(steps) => {
                for s in &steps {
                    match s {
                        Step::Destroy { gpu_instance_id, .. } => {
                            prop_assert!(!observed.busy.contains_key(gpu_instance_id), "destroyed a busy instance");
                            sim.destroy_instance(0, *gpu_instance_id).unwrap();
                        }
                        Step::DestroyHalfMade { .. } => prop_assert!(false, "every instance here is whole"),
                        Step::Create { profile, start } => { sim.create_instance(0, profile, *start).unwrap(); }
                        Step::SetMigMode(_) => prop_assert!(false, "mode is already right"),
                    }
                }
                let after = sim.instances(0).unwrap();
                let after_counts = solver::counts_of(&after.iter().map(placement).collect::<Vec<_>>());
                prop_assert_eq!(after_counts, to.clone());
                let current_counts = solver::counts_of(&current.iter().map(placement).collect::<Vec<_>>());
                let all_wanted = current_counts.iter().all(|(p, c)| to.get(p).copied().unwrap_or(0) >= *c);
                let rest: ProfileCounts = to.iter().map(|(p, c)| (p.clone(), c - current_counts.get(p).copied().unwrap_or(0).min(*c))).collect();
                let fits_around = all_wanted && solver::fit_around(m, &current.iter().map(placement).collect::<Vec<_>>(), &rest).is_ok();
                if fits_around {
                    prop_assert!(!steps.iter().any(|s| matches!(s, Step::Destroy { .. })), "touched a matching instance");
                }
            }
            Err(Blocked::Busy(list)) => {
                prop_assert!(!list.is_empty());
                prop_assert!(list.iter().all(|(i, _)| observed.busy.contains_key(&i.gpu_instance_id)));
            }
            Err(other) => prop_assert!(false, "unexpected {other:?}"),
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn processes_not_tied_to_an_instance_block_every_destroy() {
    let mut obs = on(vec![inst(1, "3g.40gb", 0, 4), inst(2, "3g.40gb", 4, 4)]);
    obs.gpu_processes = vec![77];
    assert_eq!(plan(model("H100-80GB"), &obs, &target(&[("1g.10gb", 7)])), Err(Blocked::GpuBusy(vec![77])));
    // Adding into free space destroys nothing and goes ahead.
    let mut obs = on(vec![inst(1, "3g.40gb", 0, 4)]);
    obs.gpu_processes = vec![77];
    assert!(plan(model("H100-80GB"), &obs, &target(&[("3g.40gb", 2)])).is_ok());
}

#[test]
fn a_gpu_instance_split_into_smaller_compute_instances_leaves_the_gpu_alone() {
    // Three 1-slice compute instances in a 3g (an admin's nvidia-smi mig -cci): even a target the
    // rest of the GPU could take, or one without that instance, plans nothing.
    let split =
        Instance { compute_instance_id: None, uuid: String::new(), split_compute: 3, ..inst(1, "3g.40gb", 0, 4) };
    let observed = on(vec![split.clone(), inst(2, "3g.40gb", 4, 4)]);
    for t in [target(&[("3g.40gb", 2)]), target(&[("7g.80gb", 1)]), target(&[])] {
        match plan(model("H100-80GB"), &observed, &t) {
            Err(Blocked::SplitComputeInstances(list)) => assert_eq!(list, vec![split.clone()]),
            other => panic!("expected the GPU left alone, got {other:?}"),
        }
    }
    let message = Blocked::SplitComputeInstances(vec![split]).to_string();
    assert!(message.contains("GPU instance 1 (3g.40gb@0) holds 3 smaller compute instances"), "{message}");
}
