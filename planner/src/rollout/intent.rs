//! What a plan asks of a node: the intent its layouts give the GPUs the agent reported, the
//! catalog look-ups and layout fits a pass shares across its nodes, and the plan's own checks.

use std::collections::BTreeMap;
use std::rc::Rc;

use tessera_crds::catalog::GpuModel;
use tessera_crds::gpunode::{GpuIntent, GpuState};
use tessera_crds::plan::{GpuLayout, GpuPartitionPlanSpec};
use tessera_crds::validate::validate_plan_with;
use tessera_crds::{GpuPartitionPlan, catalog, solver};

use super::NodeInput;

/// Product names compared loosely: case, spaces and underscores do not matter.
fn product_key(s: &str) -> String {
    s.trim().to_ascii_lowercase().replace([' ', '_'], "-")
}

/// Catalog look-ups and layout fits of one planning pass, shared by all its nodes: a fleet has a
/// few boards and many nodes, and repeating these per node made them most of a pass's cost.
#[derive(Default)]
pub struct Memo<'a> {
    products: crate::FastMap<&'a str, Option<&'static GpuModel>>,
    same: crate::FastMap<(&'a str, &'a str), bool>,
    /// Keyed by the addresses of a `&'static` model and of a layout borrowed for `'a`.
    fits: crate::FastMap<(usize, usize), Result<(), String>>,
    /// A plan's intent per node shape: keyed by the hash of (plan spec address, each GPU's index,
    /// product and MIG capability), holding those parts to compare (no collision is trusted).
    /// Nodes of a fleet share a few shapes, and building the intent allocated per node.
    desired: crate::FastMap<u64, Vec<DesiredEntry<'a>>>,
}

/// One remembered intent: the plan spec's address, the GPUs' parts, the intent.
type DesiredEntry<'a> = (usize, Vec<(i32, &'a str, bool)>, Result<Rc<Vec<GpuIntent>>, String>);

impl<'a> Memo<'a> {
    pub(super) fn lookup(&mut self, product: &'a str) -> Option<&'static GpuModel> {
        *self.products.entry(product).or_insert_with(|| catalog::lookup(product))
    }

    /// Whether a layout's `gpuProduct` names this GPU's board (catalog names, else loosely).
    fn same_product(&mut self, layout: &'a str, gpu: &'a str) -> bool {
        if let Some(same) = self.same.get(&(layout, gpu)) {
            return *same;
        }
        let same = match (self.lookup(layout), self.lookup(gpu)) {
            (Some(a), Some(b)) => a.name == b.name,
            _ => product_key(layout) == product_key(gpu),
        };
        self.same.insert((layout, gpu), same);
        same
    }

    /// The geometry of a reported GPU: the catalog's, or else the table its agent read from NVML.
    fn model_of(&mut self, g: &'a GpuState) -> Option<&'static GpuModel> {
        self.lookup(&g.product)
            .or_else(|| (!g.profiles.is_empty()).then(|| catalog::model_from_table(&g.product, &g.profiles)))
    }

    /// [`desired_intent_with`], shared by the nodes whose GPUs look the same to the layouts. Only
    /// for boards in the catalog: another board's geometry is read from its own profile table.
    pub(super) fn desired(
        &mut self,
        spec: &'a GpuPartitionPlanSpec,
        gpus: &'a [GpuState],
    ) -> Result<Rc<Vec<GpuIntent>>, String> {
        if !gpus.iter().all(|g| self.lookup(&g.product).is_some()) {
            return desired_intent_with(spec, gpus, self).map(Rc::new);
        }
        let address = std::ptr::from_ref(spec) as usize;
        let key = {
            use std::hash::{BuildHasher, Hash, Hasher};
            let mut h = foldhash::fast::FixedState::default().build_hasher();
            address.hash(&mut h);
            for g in gpus {
                (g.index, g.product.as_str(), g.mig_capable).hash(&mut h);
            }
            h.finish()
        };
        let same = |parts: &[(i32, &str, bool)]| {
            parts.len() == gpus.len()
                && parts.iter().zip(gpus).all(|(p, g)| p.0 == g.index && p.1 == g.product && p.2 == g.mig_capable)
        };
        if let Some((_, _, known)) =
            self.desired.get(&key).and_then(|b| b.iter().find(|(a, parts, _)| *a == address && same(parts)))
        {
            return known.clone();
        }
        let intent = desired_intent_with(spec, gpus, self).map(Rc::new);
        let parts = gpus.iter().map(|g| (g.index, g.product.as_str(), g.mig_capable)).collect();
        self.desired.entry(key).or_default().push((address, parts, intent.clone()));
        intent
    }

    fn fit(&mut self, model: &'static GpuModel, layout: &'a GpuLayout) -> Result<(), String> {
        let key = (std::ptr::from_ref(model) as usize, std::ptr::from_ref(layout) as usize);
        self.fits
            .entry(key)
            .or_insert_with(|| {
                let counts = layout
                    .profiles
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(k, n)| (catalog::normalize_profile(k), *n as u32))
                    .collect();
                solver::fit(model, &counts).map(|_| ()).map_err(|e| e.to_string())
            })
            .clone()
    }
}

/// The intent a plan asks for on a node, from the GPUs its agent reported. `Err` names why the
/// node cannot be acted on (no layout for its product, or a layout that cannot fit it).
pub fn desired_intent(spec: &GpuPartitionPlanSpec, gpus: &[GpuState]) -> Result<Vec<GpuIntent>, String> {
    desired_intent_with(spec, gpus, &mut Memo::default())
}

/// [`desired_intent`] with the look-ups of a pass shared across its nodes.
pub fn desired_intent_with<'a>(
    spec: &'a GpuPartitionPlanSpec,
    gpus: &'a [GpuState],
    memo: &mut Memo<'a>,
) -> Result<Vec<GpuIntent>, String> {
    let mut out = Vec::new();
    for g in gpus {
        let mut chosen = None;
        for l in &spec.layouts {
            if l.gpu_indices.as_ref().is_some_and(|i| i.contains(&g.index))
                && memo.same_product(&l.gpu_product, &g.product)
            {
                chosen = Some(l);
                break;
            }
        }
        if chosen.is_none() {
            for l in &spec.layouts {
                if l.gpu_indices.is_none() && memo.same_product(&l.gpu_product, &g.product) {
                    chosen = Some(l);
                    break;
                }
            }
        }
        let Some(layout) = chosen else { continue };
        if layout.mig_enabled && !g.mig_capable {
            return Err(format!("GPU {} ({}) is not MIG capable", g.index, g.product));
        }
        if let (true, Some(model)) = (layout.mig_enabled, memo.model_of(g))
            && let Err(e) = memo.fit(model, layout)
        {
            return Err(format!("the layout for GPU {} does not fit: {e}", g.index));
        }
        let profiles: BTreeMap<String, i32> =
            layout.profiles.iter().filter(|(_, n)| **n > 0).map(|(k, n)| (k.clone(), *n)).collect();
        out.push(GpuIntent { index: g.index, mig_enabled: layout.mig_enabled, profiles });
    }
    if out.is_empty() {
        let products: Vec<&str> = gpus.iter().map(|g| g.product.as_str()).collect();
        return Err(format!("the plan has no layout for this node's GPUs ({})", products.join(", ")));
    }
    Ok(out)
}

/// Checks a plan as `tessera-operator validate` does; a product missing from the catalog is
/// checked against the profile table an agent of a matched node reports for it.
pub(super) fn validate<'a>(plan: &GpuPartitionPlan, nodes: &[&'a NodeInput<'_>], memo: &mut Memo<'a>) -> Vec<String> {
    let mut reported: BTreeMap<String, &'static GpuModel> = BTreeMap::new();
    for node in nodes {
        let gpus = node.gpunode.as_ref().and_then(|g| g.status.as_ref()).map(|s| s.gpus.as_slice()).unwrap_or(&[]);
        for g in gpus.iter().filter(|g| memo.lookup(&g.product).is_none() && catalog::valid_table(&g.profiles)) {
            reported.insert(product_key(&g.product), catalog::model_from_table(&g.product, &g.profiles));
        }
    }
    validate_plan_with(&plan.spec, &|product| reported.get(&product_key(product)).copied())
        .iter()
        .map(ToString::to_string)
        .collect()
}
