//! Writes Tessera's CRDs to a directory (default `config/crd`).

use std::io::Write as _;
use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "config/crd".into()));
    std::fs::create_dir_all(&dir)?;
    for (name, yaml) in tessera_crds::crdgen::rendered_crds() {
        std::fs::write(dir.join(&name), yaml)?;
        // `crdgen | head -1`: a reader that went away is no reason to stop writing files.
        match writeln!(std::io::stdout(), "wrote {}", dir.join(name).display()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e),
            _ => {}
        }
    }
    Ok(())
}
