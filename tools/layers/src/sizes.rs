//! Files and functions longer than a person reads in one sitting, and the exceptions their files
//! name with a reason.

use std::path::Path;

use crate::source::product_text;

/// The most lines of product code in one file.
pub const MAX_FILE_LINES: usize = 600;
/// The most lines of one function, from its `fn` line to its closing brace.
pub const MAX_FUNCTION_LINES: usize = 80;
/// A file that must be longer names why, in a line of its own: `// layers: long file: <reason>`.
pub const LONG_FILE_MARKER: &str = "// layers: long file: ";
/// A function that must be longer (a rendering table, say) names why on the line above its `fn`
/// (or above its attributes): `// layers: long function: <reason>`.
pub const LONG_FUNCTION_MARKER: &str = "// layers: long function: ";

/// A function over [`MAX_FUNCTION_LINES`]: its name, first line (1-based) and length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongFunction {
    pub name: String,
    pub line: usize,
    pub lines: usize,
}

/// The product lines of `path` when over [`MAX_FILE_LINES`] and its text names no reason.
pub fn long_file(path: &Path) -> Option<usize> {
    let text = product_text(path);
    let lines = text.lines().count();
    (lines > MAX_FILE_LINES && !text.lines().any(|l| reason_of(l, LONG_FILE_MARKER))).then_some(lines)
}

/// The functions of `path` over [`MAX_FUNCTION_LINES`] that name no reason.
pub fn long_functions(path: &Path) -> Vec<LongFunction> {
    let text = product_text(path);
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some((indent, name)) = fn_item(line) else { continue };
        if line.trim_end().ends_with(';') || line.trim_end().ends_with('}') {
            continue; // a declaration, or a one-line body
        }
        let closing = format!("{indent}}}");
        let Some(end) = lines[i..].iter().position(|l| *l == closing) else { continue };
        if end + 1 > MAX_FUNCTION_LINES && !excused(&lines[..i]) {
            out.push(LongFunction { name, line: i + 1, lines: end + 1 });
        }
    }
    out
}

/// Whether the lines above an item (its doc comment and attributes) carry the reason.
fn excused(above: &[&str]) -> bool {
    above
        .iter()
        .rev()
        .take_while(|l| {
            let t = l.trim_start();
            t.starts_with("//") || t.starts_with("#[")
        })
        .any(|l| reason_of(l, LONG_FUNCTION_MARKER))
}

fn reason_of(line: &str, marker: &str) -> bool {
    line.trim_start().strip_prefix(marker).is_some_and(|reason| !reason.trim().is_empty())
}

/// `(indentation, name)` when `line` starts a function item.
fn fn_item(line: &str) -> Option<(String, String)> {
    let trimmed = line.trim_start();
    let indent = line[..line.len() - trimmed.len()].to_string();
    let mut words = trimmed.split_whitespace().peekable();
    while let Some(w) = words.peek() {
        if w.starts_with("pub") || matches!(*w, "async" | "const" | "unsafe" | "extern" | "\"C\"") {
            words.next();
        } else {
            break;
        }
    }
    if words.next()? != "fn" {
        return None;
    }
    let name: String = words.next()?.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty()).then_some((indent, name))
}
