//! The committed CRD YAML in `config/crd/` (kustomize) and `config/helm/tessera/crds/` (the Helm
//! chart) must equal what the Rust types generate.

use std::path::Path;

#[test]
fn committed_crds_match_the_types() {
    for dir in ["config/crd", "config/helm/tessera/crds"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
        let mut drift = Vec::new();
        for (name, yaml) in tessera_crds::crdgen::rendered_crds() {
            match std::fs::read_to_string(path.join(&name)) {
                Ok(committed) if committed == yaml => {}
                Ok(_) => drift.push(format!("{name} differs")),
                Err(e) => drift.push(format!("{name}: {e}")),
            }
        }
        assert!(drift.is_empty(), "{dir} is stale ({}); run `make crds` and commit", drift.join("; "));
    }
}

#[test]
fn crds_carry_cel_rules_printer_columns_and_status() {
    let all: String = tessera_crds::crdgen::rendered_crds().into_iter().map(|(_, y)| y).collect();
    for needle in [
        "x-kubernetes-validations",
        "maxUnavailable must be an integer >= 1 or a percentage",
        "profiles must be empty when migEnabled is false",
        "does not fit H100-80GB: ",
        "x-kubernetes-list-map-keys",
        "additionalPrinterColumns",
        "- tessera",
        "status: {}",
        "scope: Cluster",
    ] {
        assert!(all.contains(needle), "generated CRDs lack {needle:?}");
    }
    // Every Tessera kind is cluster-scoped but the quota gate, read in the namespace it guards.
    assert_eq!(all.matches("scope: Namespaced").count(), 1, "only GpuQuotaGate is namespaced");
    assert!(all.contains("kind: GpuQuotaGate"));
}
