//! Writes Tessera's CRDs to a directory (default `config/crd`).

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "config/crd".into()));
    std::fs::create_dir_all(&dir)?;
    for (name, yaml) in tessera_crds::crdgen::rendered_crds() {
        std::fs::write(dir.join(&name), yaml)?;
        println!("wrote {}", dir.join(name).display());
    }
    Ok(())
}
