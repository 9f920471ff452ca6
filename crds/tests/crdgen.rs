//! `crdgen | head -1`: the CRDs are all written and the tool exits 0, with no panic on the
//! closed pipe.

use std::process::Command;

#[test]
fn crdgen_into_a_closed_pipe_still_writes_every_crd() {
    let dir = std::env::temp_dir().join(format!("tessera-crdgen-{}", std::process::id()));
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_crdgen")).arg(&dir).stdout(writer).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    for (name, yaml) in tessera_crds::crdgen::rendered_crds() {
        assert_eq!(std::fs::read_to_string(dir.join(&name)).unwrap(), yaml, "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
