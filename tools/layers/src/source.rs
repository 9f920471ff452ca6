//! Which files of a crate are product code, and their text without test code.

use std::fs;
use std::path::{Path, PathBuf};

/// Whether `path` holds only tests: a `tests.rs`, or a file under a `tests/` folder of `src/`
/// (the crate's own `tests/` folder is not under `src/`).
pub fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name == "tests.rs" || path.components().any(|c| c.as_os_str() == "tests")
}

/// Where the files under `src` break the workspace's one test convention: a module's unit tests
/// are its child module `tests`, inline (`#[cfg(test)] mod tests { .. }`) or in `<module>/tests.rs`,
/// with topics of their own as `<module>/tests/<topic>.rs`. So a reader finds a module's tests in
/// one place, and a file's module path is its file path: no `#[path]`, no `*_tests.rs` beside it,
/// no `#[test]` among the product code.
pub fn test_convention_breaks(src: &Path) -> Vec<String> {
    let mut breaks = Vec::new();
    for file in rust_files(src) {
        let shown = file.strip_prefix(src).unwrap_or(&file).display().to_string();
        if shown.ends_with("_tests.rs") {
            breaks.push(format!("{shown}: a sibling test file (move it to `<module>/tests/<topic>.rs`)"));
        }
        let text = fs::read_to_string(&file).unwrap_or_default();
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("#[path") {
                breaks.push(format!("{shown}:{}: `#[path]` (a file's module path is its file path)", i + 1));
            }
        }
        let in_tests = is_test_file(file.strip_prefix(src).unwrap_or(&file));
        if !in_tests && product_text(&file).lines().any(|l| l.trim() == "#[test]") {
            breaks.push(format!("{shown}: a `#[test]` outside the module's `tests` (move it into `mod tests`)"));
        }
    }
    breaks
}

/// The text of `path` up to its inline test module (`#[cfg(test)]` then `mod tests {`), which by
/// the workspace's convention closes a file.
pub fn product_text(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim_start().starts_with("#[cfg(test)]") && w[1].starts_with("mod tests {"))
        .unwrap_or(lines.len());
    lines[..end].join("\n")
}

/// Every `.rs` file under `dir`, sorted.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else { return out };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The product files (not tests) of the crate whose sources are in `src`.
pub fn product_files(src: &Path) -> Vec<PathBuf> {
    rust_files(src).into_iter().filter(|p| !is_test_file(p.strip_prefix(src).unwrap_or(p))).collect()
}
