//! The import graph between a crate's top-level modules, from the `crate::` paths of its
//! product code, and its cycles.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use crate::source::{is_test_file, product_text, rust_files};

/// Top-level module -> the top-level modules its product code names through `crate::`.
pub type ModuleGraph = BTreeMap<String, BTreeSet<String>>;

/// The graph of the crate whose sources are in `src` (`lib.rs`/`main.rs` and `bin/` are roots,
/// not modules: they may name every module).
pub fn module_graph(src: &Path) -> ModuleGraph {
    let mut modules = BTreeSet::new();
    for entry in fs::read_dir(src).unwrap_or_else(|e| panic!("cannot list {}: {e}", src.display())).flatten() {
        let path = entry.path();
        let name = path.file_stem().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let module = if path.is_dir() { name != "bin" } else { path.extension().is_some_and(|e| e == "rs") };
        let relative = path.strip_prefix(src).unwrap_or(&path);
        if module && !matches!(name.as_str(), "lib" | "main") && !is_test_file(relative) {
            modules.insert(name);
        }
    }
    let mut graph = ModuleGraph::new();
    for module in &modules {
        let mut files = vec![src.join(format!("{module}.rs"))];
        files.extend(rust_files(&src.join(module)));
        let mut named = BTreeSet::new();
        for file in files.iter().filter(|f| f.exists() && !is_test_file(f.strip_prefix(src).unwrap_or(f))) {
            let text = product_text(file);
            let mut paths = crate_paths(&text);
            paths.extend(paths_from(&text, &root_from(file.strip_prefix(src).unwrap_or(file))));
            named.extend(paths.into_iter().filter(|m| m != module && modules.contains(m)));
        }
        graph.insert(module.clone(), named);
    }
    graph
}

/// The path that names the crate root from the file at `relative` (to `src/`): `super::` in a
/// top-level module (`x.rs`, `x/mod.rs`), `super::super::` one level down, and so on.
pub fn root_from(relative: &Path) -> String {
    let components = relative.components().count();
    let depth = if relative.file_name().is_some_and(|n| n == "mod.rs") { components - 1 } else { components };
    "super::".repeat(depth.max(1))
}

/// The first segment of every `crate::` path in `text`, including each name of a grouped import
/// (`use crate::{a::X, b};` names `a` and `b`).
pub fn crate_paths(text: &str) -> BTreeSet<String> {
    paths_from(text, "crate::")
}

/// As [`crate_paths`], for paths that start with `root` (`crate::`, or the `super::` chain that
/// reaches the crate root from a file: [`root_from`]).
pub fn paths_from(text: &str, root: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(root) {
        let preceded_by_word =
            rest[..at].chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':');
        rest = &rest[at + root.len()..];
        if preceded_by_word {
            continue; // `tessera_crate::` or `$crate::`-like names are not this crate
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = matching_brace(group);
            out.extend(top_level_names(&group[..end]));
        } else {
            out.insert(leading_ident(rest));
        }
    }
    out.remove("");
    out
}

fn leading_ident(s: &str) -> String {
    s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// The index of the `}` closing a group whose `{` was just before `s`.
fn matching_brace(s: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    s.len()
}

/// The first segment of each comma-separated item of a `{...}` group, nested groups skipped.
fn top_level_names(group: &str) -> Vec<String> {
    let (mut names, mut depth, mut item) = (Vec::new(), 0usize, String::new());
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => names.push(leading_ident(std::mem::take(&mut item).trim_start())),
            _ if depth == 0 => item.push(c),
            _ => {}
        }
    }
    names.push(leading_ident(item.trim_start()));
    names
}

/// Every cycle of `graph` (its strongly connected components of more than one module), each
/// sorted; empty for a DAG.
pub fn cycles(graph: &ModuleGraph) -> Vec<Vec<String>> {
    let names: Vec<&String> = graph.keys().collect();
    let reach = |from: &String| -> BTreeSet<String> {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from.clone()]);
        while let Some(m) = todo.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> = names.iter().map(|m| (*m, reach(m))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for m in &names {
        let mut component: Vec<String> = names
            .iter()
            .filter(|n| reachable[*m].contains(**n) && reachable[**n].contains(*m))
            .map(|n| n.to_string())
            .collect();
        if component.len() > 1 && !out.iter().any(|c| c.contains(&m.to_string())) {
            component.sort();
            out.push(component);
        }
    }
    out
}
