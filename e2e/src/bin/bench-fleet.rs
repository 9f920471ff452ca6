//! `make bench` (fleet part): the fleet solver on N GPUs (default 10,000) of four products with
//! random current layouts (10% with a busy instance) and 30 tenants whose quotas ask 15% more
//! than the fleet supplies of four profiles; reports the time, whether the answer was proven
//! optimal within the per-stage time limit, and the GPUs changed and instances destroyed against
//! the naive answer that re-lays out every GPU.

use std::collections::BTreeMap;
use std::time::Instant;

use tessera_crds::{catalog, solver};
use tessera_planner::fleet::{GpuSlot, solve};

/// A small deterministic generator (no dependency, the same fleet every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![100, 1000, 10_000] } else { sizes };
    tessera_e2e::say!(
        "| GPUs | tenants | solve s | proven optimal | GPUs changed | destroyed | naive: changed | naive: destroyed | shortfall |"
    );
    tessera_e2e::say!("|---:|---:|---:|---|---:|---:|---:|---:|---|");
    for n in sizes {
        bench(n);
    }
}

fn bench(n: usize) {
    let products = ["H100-80GB", "A100-40GB", "A100-80GB", "A30-24GB"];
    let mut rng = Lcg(42);
    // Each product's maximal layouts, computed once (the setup is not what is measured).
    let tables: Vec<_> = products
        .iter()
        .map(|p| {
            let model = catalog::lookup(p).expect("a catalog product");
            (model, solver::maximal_layouts(model, None))
        })
        .collect();
    let mut gpus = Vec::with_capacity(n);
    for i in 0..n {
        let (model, layouts) = &tables[i % products.len()];
        let model = *model;
        let instances = layouts[rng.next(layouts.len())].clone();
        let busy = if rng.next(10) == 0 { instances.iter().take(1).cloned().collect() } else { vec![] };
        gpus.push(GpuSlot {
            node: format!("node-{:05}", i / 8),
            index: (i % 8) as i32,
            model,
            mig_enabled: true,
            instances,
            busy,
            changeable: true,
        });
    }
    let mut supply: BTreeMap<String, i64> = BTreeMap::new();
    for g in &gpus {
        for p in &g.instances {
            *supply.entry(catalog::mig_resource_name(&p.profile)).or_default() += 1;
        }
    }
    let wanted =
        ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.5gb"];
    let per_resource = 30 / wanted.len() as i64 + 1;
    let mut demand: BTreeMap<String, i64> = BTreeMap::new();
    for tenant in 0..30 {
        let r = wanted[tenant % wanted.len()];
        *demand.entry(r.to_string()).or_default() += supply.get(r).copied().unwrap_or(0) * 115 / 100 / per_resource;
    }
    let started = Instant::now();
    let answer = solve(&gpus, &demand).expect("the solver answers");
    let seconds = started.elapsed().as_secs_f64();
    let naive_destroyed: usize = gpus.iter().map(|g| g.instances.len()).sum();
    tessera_e2e::say!(
        "| {n} | 30 | {seconds:.2} | {} | {} | {} | {n} | {naive_destroyed} | {:?} |",
        answer.optimal,
        answer.changed,
        answer.destroyed,
        answer.shortfall
    );
}
