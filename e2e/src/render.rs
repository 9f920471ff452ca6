//! Rendering the shipped manifests with the real tools: `kubectl kustomize` from the pinned
//! control-plane build, and `helm template` from the pinned Helm build (`tools/build.sh helm`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `kubectl` of the pinned control plane (`TESSERA_CONTROLPLANE_BIN`, which `make test` sets).
pub fn kubectl() -> PathBuf {
    PathBuf::from(std::env::var("TESSERA_CONTROLPLANE_BIN").expect("make test sets TESSERA_CONTROLPLANE_BIN"))
        .join("kubectl")
}

/// The pinned Helm (`TESSERA_HELM`, which `make test` sets to `tools/build.sh helm`'s output).
pub fn helm() -> PathBuf {
    PathBuf::from(std::env::var("TESSERA_HELM").expect("make test sets TESSERA_HELM (`tools/build.sh helm` prints it)"))
}

/// Runs a command in the repository root; its stdout, or a panic with its stderr.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.current_dir(repo()).output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Every non-empty document of multi-document YAML.
pub fn documents(text: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}"))
}

/// `kubectl kustomize DIR`, one value per object.
pub fn kustomize(dir: &str) -> Vec<serde_json::Value> {
    documents(&run(Command::new(kubectl()).args(["kustomize", dir])))
}

/// `helm template tessera config/helm/tessera --namespace tessera-system --include-crds ARGS`.
pub fn helm_template(args: &[&str]) -> Vec<serde_json::Value> {
    documents(&run(Command::new(helm()).args(HELM_TEMPLATE).args(args)))
}

/// What `helm_template` runs, before its extra arguments.
pub const HELM_TEMPLATE: [&str; 6] =
    ["template", "tessera", "config/helm/tessera", "--namespace", "tessera-system", "--include-crds"];

/// The object of that kind and name (panics naming both when there is none).
pub fn object<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered manifests"))
}
