//! Every command in the README works as written, where it can run here: the offline CLI commands
//! run against the built binaries (from the repository root, with `target/debug` first on `PATH`),
//! file commands run, `make` targets exist, and a binary installed from `target/<profile>/` is
//! built for that profile by a command of the same block. Commands that need a cluster, a registry
//! or a GPU are skipped by name, and the test says which.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One `$ ` command of a ```console block, continuation lines joined, its comment removed.
#[derive(Debug)]
struct ReadmeCommand {
    line: usize,
    block: usize,
    text: String,
    /// The README's output lines after it say `# exit N`.
    exit: i32,
}

fn console_commands(readme: &str) -> Vec<ReadmeCommand> {
    let mut out: Vec<ReadmeCommand> = Vec::new();
    let (mut in_block, mut block) = (false, 0);
    let mut lines = readme.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        if line.starts_with("```") {
            in_block = line == "```console";
            block += usize::from(in_block);
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(cmd) = line.strip_prefix("$ ") {
            let mut text = cmd.to_string();
            while text.trim_end().ends_with('\\') {
                let Some((_, next)) = lines.next() else { break };
                text = format!("{} {}", text.trim_end().trim_end_matches('\\').trim_end(), next.trim());
            }
            let text = strip_comment(&text);
            if !text.is_empty() {
                out.push(ReadmeCommand { line: i + 1, block, text, exit: 0 });
            }
        } else if let (Some(last), Some(code)) = (out.last_mut(), line.split("# exit ").nth(1))
            && last.block == block
        {
            last.exit = code.split(|c: char| !c.is_ascii_digit()).next().unwrap_or("0").parse().unwrap_or(0);
        }
    }
    out
}

/// The command without its trailing `# comment` (a `#` outside quotes after a space).
fn strip_comment(text: &str) -> String {
    let mut quote = None;
    let bytes: Vec<char> = text.chars().collect();
    for (i, &c) in bytes.iter().enumerate() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if i == 0 || bytes[i - 1] == ' ' => return bytes[..i].iter().collect::<String>().trim().into(),
            _ => {}
        }
    }
    text.trim().into()
}

/// The program a command runs: its first word after `VAR=value` assignments.
fn program(text: &str) -> &str {
    text.split_whitespace().find(|w| !w.contains('=') || w.starts_with('-')).unwrap_or("")
}

/// Why a command cannot run here, or `None` if it runs.
fn cannot_run(text: &str) -> Option<&'static str> {
    let placeholder = ["plans/", "bad.yaml", "[", "FILE", " cluster.yaml", "registry.example.com"];
    if placeholder.iter().any(|p| text.contains(p)) {
        return Some("a placeholder the reader fills in");
    }
    match program(text) {
        "tessera-operator" => {
            let offline = text.contains(" validate ")
                || text.contains(" mig ")
                || (text.contains(" plan ") && text.contains("--from"));
            (!offline).then_some("needs a cluster")
        }
        "node-agent" if text.contains(" probe ") && text.contains("--nvml-library") => None,
        "node-agent" => Some("needs a GPU or runs until stopped"),
        "mkdir" | "cp" => None,
        // Checked below, not run: a build, an install into the user's PATH, make targets.
        "cargo" | "install" | "make" => Some("checked, not run"),
        _ => Some("needs a cluster, a registry or a network"),
    }
}

/// Whether `make TARGET` names a target of the Makefile.
fn make_target_exists(makefile: &str, target: &str) -> bool {
    makefile.lines().any(|l| l.split(':').next() == Some(target) && l.contains(':') && !l.starts_with('\t'))
}

#[test]
fn the_readmes_commands_work_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let makefile = std::fs::read_to_string(repo().join("Makefile")).unwrap();
    let commands = console_commands(&readme);
    assert!(commands.len() > 30, "the README's console blocks hold its commands ({} found)", commands.len());
    let bin_dir =
        std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| repo().join("target")).join("debug");
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let (mut ran, mut skipped, mut failures) = (0, Vec::new(), Vec::new());
    for c in &commands {
        // A binary installed from target/<profile>/ must be built for that profile in its block.
        let installs = matches!(program(&c.text), "install" | "cp");
        for profile in ["release", "debug"] {
            let wanted = format!("target/{profile}/");
            if !installs || !c.text.contains(&wanted) {
                continue;
            }
            let builds = |b: &&ReadmeCommand| match profile {
                "release" => b.text.contains("--release") || b.text.starts_with("make images"),
                _ => (b.text.contains("cargo build") && !b.text.contains("--release")) || b.text == "make build",
            };
            if !commands.iter().filter(|b| b.block == c.block && b.line < c.line).any(|b| builds(&b)) {
                failures.push(format!(
                    "README:{}: `{}` takes {wanted} but no command before it in its block builds it",
                    c.line, c.text
                ));
            }
        }
        if program(&c.text) == "make" {
            for target in c.text.split_whitespace().skip(1).filter(|w| !w.contains('=') && !w.starts_with('-')) {
                if !make_target_exists(&makefile, target) {
                    failures.push(format!("README:{}: `make {target}`: no such Makefile target", c.line));
                }
            }
        }
        if let Some(why) = cannot_run(&c.text) {
            skipped.push(format!("README:{} ({why}): {}", c.line, c.text));
            continue;
        }
        let out = Command::new("bash")
            .args(["-o", "pipefail", "-c", &c.text])
            .current_dir(repo())
            .env("PATH", &path)
            .output()
            .unwrap();
        ran += 1;
        let code = out.status.code().unwrap_or(-1);
        if code != c.exit {
            failures.push(format!(
                "README:{}: `{}` exited {code}, the README says {}:\n{}{}",
                c.line,
                c.text,
                c.exit,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    eprintln!("ran {ran} README commands; skipped:\n{}", skipped.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(ran >= 6, "the offline commands ran ({ran})");
}

#[test]
fn commands_are_read_with_their_continuations_comments_and_exit_codes() {
    let text = "x\n```console\n$ tessera-operator validate a.yaml   # offline\nout\n2 errors   # exit 1\n$ kustomize edit \\\n    set image a=b\n```\n$ not in a block\n```console\n$ make demo\n```\n";
    let c = console_commands(text);
    assert_eq!(c.len(), 3, "{c:?}");
    assert_eq!((c[0].text.as_str(), c[0].exit, c[0].block), ("tessera-operator validate a.yaml", 1, 1));
    assert_eq!(c[1].text, "kustomize edit set image a=b");
    assert_eq!((c[2].text.as_str(), c[2].block), ("make demo", 2));
    assert_eq!(program("TESSERA_SIM_GPUS=A node-agent probe"), "node-agent");
    assert_eq!(strip_comment(r#"mig profiles --gpu "a # b"   # why"#), r#"mig profiles --gpu "a # b""#);
    assert!(make_target_exists("demo-down:\n\t@x\n", "demo-down"));
    assert!(!make_target_exists("demo-down:\n\t@x\n", "demo"));
}
