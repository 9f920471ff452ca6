//! The workspace's layers, as the compiler and a reader see them: the API crate (`crds`), the
//! planning crate (`planner`: no API client, no async runtime), the runtime (`operator`), the CLI
//! (`cli`: never the runtime), the node agent and its NVML stand-in, the e2e harness. Within each
//! crate the top-level modules form a DAG, and no product file or function is longer than a
//! person reads in one sitting unless it says why.

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera_layers::graph::{crate_paths, cycles, module_graph};
use tessera_layers::sizes::{LONG_FILE_MARKER, LONG_FUNCTION_MARKER, long_file, long_functions};
use tessera_layers::source::{product_files, test_convention_breaks};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The workspace's members, from its manifest.
fn members() -> Vec<String> {
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    let line = manifest.lines().find(|l| l.starts_with("members = [")).expect("a members list on one line");
    line.trim_start_matches("members = [")
        .trim_end_matches(']')
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .collect()
}

#[test]
fn the_members_checked_are_every_member_of_the_workspace() {
    let want = ["crds", "planner", "operator", "cli", "node-agent", "node-agent/nvml-sim", "e2e", "tools/layers"];
    assert_eq!(members(), want, "a new crate must be placed in a layer here and in the README");
}

#[test]
fn no_crate_has_an_import_cycle_between_its_top_level_modules() {
    for member in members() {
        let graph = module_graph(&workspace().join(&member).join("src"));
        assert!(!graph.is_empty() || member == "tools/layers", "{member}: no modules read");
        let found = cycles(&graph);
        let edges: Vec<String> = found
            .iter()
            .flatten()
            .map(|m| {
                format!(
                    "{m} -> {:?}",
                    graph[m].iter().filter(|n| found.iter().flatten().any(|c| c == *n)).collect::<Vec<_>>()
                )
            })
            .collect();
        assert!(found.is_empty(), "{member}: import cycle(s) {found:?}: {edges:#?}");
    }
}

/// `cargo tree -p <package> -e normal`: the packages its product code links, one per line.
fn normal_dependencies(package: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-p", package, "-e", "normal", "--prefix", "none", "--format", "{p}"])
        .current_dir(workspace())
        .output()
        .expect("cargo runs");
    assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

#[test]
fn the_planner_links_no_api_client_and_no_async_runtime() {
    let deps = normal_dependencies("tessera-planner");
    assert!(deps.iter().any(|d| d == "kube-core"), "the tree was read: {deps:?}");
    for banned in ["kube-client", "kube-runtime", "hyper", "tower", "tokio", "tessera-operator", "tessera-cli"] {
        assert!(!deps.iter().any(|d| d == banned), "tessera-planner links {banned}: {deps:?}");
    }
}

#[test]
fn the_cli_does_not_link_the_runtime() {
    let deps = normal_dependencies("tessera-cli");
    assert!(deps.iter().any(|d| d == "tessera-planner"), "the tree was read: {deps:?}");
    for banned in ["tessera-operator", "kube-runtime"] {
        assert!(!deps.iter().any(|d| d == banned), "tessera-cli links the runtime ({banned}): {deps:?}");
    }
}

#[test]
fn the_api_crate_links_neither_the_planner_nor_a_client() {
    let deps = normal_dependencies("tessera-crds");
    for banned in ["kube-client", "kube-runtime", "tokio", "tessera-planner", "tessera-operator"] {
        assert!(!deps.iter().any(|d| d == banned), "tessera-crds links {banned}: {deps:?}");
    }
}

#[test]
fn no_product_file_or_function_is_too_long_to_read_in_one_sitting() {
    let mut long = Vec::new();
    for member in members() {
        let src = workspace().join(&member).join("src");
        for file in product_files(&src) {
            let shown = file.strip_prefix(workspace()).unwrap_or(&file).display().to_string();
            if let Some(lines) = long_file(&file) {
                long.push(format!("{shown}: {lines} lines (split it, or name why: `{LONG_FILE_MARKER}<reason>`)"));
            }
            for f in long_functions(&file) {
                long.push(format!(
                    "{shown}:{} fn {}: {} lines (split it, or name why above it: `{LONG_FUNCTION_MARKER}<reason>`)",
                    f.line, f.name, f.lines
                ));
            }
        }
    }
    assert!(long.is_empty(), "{long:#?}");
}

#[test]
fn every_crate_keeps_its_unit_tests_in_child_modules_named_tests() {
    let breaks: Vec<String> = members()
        .iter()
        .flat_map(|m| {
            test_convention_breaks(&workspace().join(m).join("src")).into_iter().map(move |b| format!("{m}/src/{b}"))
        })
        .collect();
    assert!(breaks.is_empty(), "{breaks:#?}");
}

// The checks above read text; these show they catch what they are for.

#[test]
fn a_sibling_test_file_and_a_path_attribute_break_the_test_convention() {
    let dir = scratch(
        "convention",
        &[
            ("lib.rs", "mod a;\n#[cfg(test)]\n#[path = \"a_more.rs\"]\nmod more;"),
            ("a.rs", "#[cfg(test)]\nmod tests;"),
            ("a/tests.rs", "mod topic;"),
            ("a/tests/topic.rs", ""),
            ("b_tests.rs", ""),
            (
                "c.rs",
                "fn f() {}\n\n#[test]\nfn loose() {}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn kept() {}\n}",
            ),
        ],
    );
    let breaks = test_convention_breaks(&dir);
    assert_eq!(breaks.len(), 3, "{breaks:?}");
    assert!(breaks[0].starts_with("b_tests.rs"), "{breaks:?}");
    assert!(breaks[1].starts_with("c.rs: a `#[test]` outside"), "{breaks:?}");
    assert!(breaks[2].starts_with("lib.rs:3"), "{breaks:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn grouped_and_nested_imports_are_all_read() {
    let text = "use crate::{a::X, b, c::{d, e}};\nlet x = crate::f::g();\nlet y = $crate::h;\nuse super::i;";
    let names: Vec<String> = crate_paths(text).into_iter().collect();
    assert_eq!(names, ["a", "b", "c", "f"]);
}

fn scratch(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-layers-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

#[test]
fn a_cycle_through_a_submodule_is_found_and_test_code_is_not_counted() {
    let dir = scratch(
        "cycle",
        &[
            ("lib.rs", "pub mod a; pub mod b; pub mod c;"),
            ("a.rs", "use crate::b::X;"),
            ("b/mod.rs", "mod deep;"),
            ("b/deep.rs", "fn f() { crate::a::g() }"),
            ("c.rs", "use crate::a::Y;\n#[cfg(test)]\nmod tests {\n    use crate::c::Z;\n}"),
            ("c/tests.rs", "use crate::b::W;"),
            // Through `super::`, the crate root from a top-level file and from one level down.
            ("d.rs", "use super::{e::X, a};"),
            ("e/mod.rs", "mod inner;\nuse super::a::Y;"),
            ("e/inner.rs", "use super::super::d::Z;\nuse super::sibling;"),
        ],
    );
    let graph = module_graph(&dir);
    assert_eq!(cycles(&graph), vec![vec!["a".to_string(), "b".to_string()], vec!["d".to_string(), "e".to_string()]]);
    assert_eq!(graph["e"].iter().collect::<Vec<_>>(), ["a", "d"], "`super::sibling` one level down is e's own");
    assert!(!graph["c"].contains("b"), "a test file's imports are not the module's: {graph:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_long_function_is_found_unless_it_names_why() {
    let body = |name: &str| format!("fn {name}() {{\n{}}}\n", "    let x = 1;\n".repeat(85));
    let dir = scratch(
        "long",
        &[(
            "long.rs",
            &format!(
                "{}\n// layers: long function: a rendering table, one row a line\n{}",
                body("plain"),
                body("table")
            ),
        )],
    );
    let found = long_functions(&dir.join("long.rs"));
    assert_eq!(found.iter().map(|f| (f.name.as_str(), f.lines)).collect::<Vec<_>>(), [("plain", 87)]);
    let _ = std::fs::remove_dir_all(dir);
}
