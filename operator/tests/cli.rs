//! Drives the real `tessera-operator` binary: exit codes, text and JSON output.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera-operator")).args(args).current_dir(repo()).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

fn yaml_files(dir: &str) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(repo().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| p.strip_prefix(repo()).unwrap().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML in {dir}");
    files
}

#[test]
fn every_sample_validates() {
    for f in yaml_files("config/samples").into_iter().chain(yaml_files("config/examples")) {
        let (code, out) = run(&["validate", &f]);
        assert_eq!(code, 0, "{f}: {out}");
        assert!(out.contains(", 0 errors"), "{out}");
    }
}

#[test]
fn every_broken_sample_fails_naming_each_expected_field() {
    for f in yaml_files("config/samples-invalid") {
        let text = std::fs::read_to_string(repo().join(&f)).unwrap();
        let expected: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# expect: ")).collect();
        assert!(!expected.is_empty(), "{f} has no # expect: lines");
        let (code, out) = run(&["validate", &f]);
        assert_eq!(code, 1, "{f}: {out}");
        for e in expected {
            assert!(out.contains(e), "{f}: expected {e:?} in:\n{out}");
        }
    }
}

#[test]
fn validate_json_lists_documents_and_errors() {
    let (code, out) = run(&["validate", "--output", "json", "config/samples-invalid/plan-wrong-type.yaml"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["documents"].as_array().unwrap().len(), 2);
    assert_eq!(v["errors"][1]["doc"], 2);
    assert_eq!(v["errors"][1]["field"], "metadata.name");
}

#[test]
fn other_kinds_in_a_gitops_file_are_skipped_not_failed() {
    let dir = std::env::temp_dir().join(format!("tessera-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("mixed.yaml");
    std::fs::write(
        &f,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\n\
         apiVersion: tessera.dev/v1alpha1\nkind: GpuPartitionPlan\nmetadata: {name: p}\n\
         spec: {layouts: [{gpuProduct: A30, profiles: {4g.24gb: 1}}]}\n---\n\
         apiVersion: tessera.dev/v1beta9\nkind: GpuPartitionPlan\nmetadata: {name: q, namespace: x}\n\
         spec: {layouts: [{gpuProduct: A30, profiles: {4g.24gb: 1}}]}\n",
    )
    .unwrap();
    let (code, out) = run(&["validate", f.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("doc 3: apiVersion: \"tessera.dev/v1beta9\" is not served"), "{out}");
    assert!(out.contains("doc 3: metadata.namespace: Tessera kinds are cluster-scoped"), "{out}");
    assert!(!out.contains("doc 1:") && !out.contains("doc 2:"), "{out}");
    assert!(out.contains("3 documents, 2 valid, 2 errors"), "{out}");
}

#[test]
fn junk_and_documents_that_are_not_objects_fail_the_check() {
    let dir = std::env::temp_dir().join(format!("tessera-cli-junk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // About 2 MB of pseudo-random words: YAML reads it as one string.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut junk = String::new();
    while junk.len() < 2_000_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let word: String = (0..(x % 9 + 1)).map(|i| char::from(b'a' + ((x >> (i * 5)) % 26) as u8)).collect();
        junk.push_str(&word);
        junk.push(if x.is_multiple_of(11) { '\n' } else { ' ' });
    }
    let f = dir.join("junk.yaml");
    std::fs::write(&f, junk).unwrap();
    let (code, out) = run(&["validate", f.to_str().unwrap()]);
    assert_eq!(code, 1, "{}", &out[..out.len().min(500)]);
    assert!(out.contains("junk.yaml:doc 1: (document): a YAML string is not a Kubernetes object"), "{out}");
    assert!(out.contains("\n1 document, 0 valid, 1 error\n"), "{out}");

    let f = dir.join("list.yaml");
    std::fs::write(
        &f,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\n- a\n- b\n---\nmetadata: {name: y}\n",
    )
    .unwrap();
    let (code, out) = run(&["validate", f.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("list.yaml:doc 2: (document): a YAML list is not a Kubernetes object"), "{out}");
    assert!(
        out.contains("list.yaml:doc 3: apiVersion: is required") && out.contains("doc 3: kind: is required"),
        "{out}"
    );
    assert!(out.contains("3 documents, 1 valid, 3 errors"), "{out}");
}

/// `validate DIR` reads the YAML files in it (as `kubectl apply -f DIR`), and over a set of
/// files two quotas claiming one namespace are an error, as they conflict once applied.
#[test]
fn validate_reads_directories_and_finds_quota_conflicts_across_files() {
    let (code, out) = run(&["validate", "config/samples/"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "4 documents, 4 valid, 0 errors\n");

    let dir = std::env::temp_dir().join(format!("tessera-cli-dir-{}", std::process::id()));
    let empty = dir.join("empty");
    std::fs::create_dir_all(empty.join("sub.yaml")).unwrap();
    std::fs::write(empty.join("notes.txt"), "not YAML").unwrap();
    let (code, out) = run(&["validate", empty.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("empty is a directory without YAML files"), "{out}");

    let quotas = dir.join("quotas");
    std::fs::create_dir_all(&quotas).unwrap();
    let quota = |name: &str| {
        format!(
            "apiVersion: tessera.dev/v1alpha1\nkind: TenantGpuQuota\nmetadata: {{name: {name}}}\n\
             spec: {{namespaces: [ml], hard: {{nvidia.com/gpu: 1}}}}\n"
        )
    };
    std::fs::write(quotas.join("a.yaml"), quota("team-a")).unwrap();
    std::fs::write(quotas.join("b.yml"), quota("team-b")).unwrap();
    let (code, out) = run(&["validate", quotas.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(r#"a.yaml:doc 1: spec.namespaces[0]: namespace "ml" is also claimed by TenantGpuQuota "team-b""#),
        "{out}"
    );
    assert!(
        out.contains(r#"b.yml:doc 1: spec.namespaces[0]: namespace "ml" is also claimed by TenantGpuQuota "team-a""#)
    );
    assert!(out.ends_with("2 documents, 0 valid, 2 errors\n"), "{out}");
    // Each file alone is valid: the conflict is between them.
    let (code, out) = run(&["validate", quotas.join("a.yaml").to_str().unwrap()]);
    assert_eq!((code, out.as_str()), (0, "1 document, 1 valid, 0 errors\n"));
}

#[test]
fn unreadable_file_is_a_usage_error() {
    let (code, out) = run(&["validate", "does/not/exist.yaml"]);
    assert_eq!(code, 2);
    assert!(out.contains("cannot read does/not/exist.yaml"), "{out}");
}

#[test]
fn mig_fit_exit_codes() {
    let (code, out) = run(&["mig", "fit", "--gpu", "A100-40GB", "2g.10gb=2", "3g.20gb=1"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("3g.20gb      start 4 size 4"), "{out}");
    assert!(out.contains("memory slots: [AABBCCCC]"), "{out}");

    let (code, out) = run(&["mig", "fit", "--gpu", "A100-40GB", "3g.20gb=2", "1g.5gb=1"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("does not fit: the layout needs 9 memory slices, but one A100-40GB has 8"), "{out}");

    let (code, out) = run(&["mig", "fit", "--gpu", "A100-40GB", "1g.10gb+me=1"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("profile \"1g.10gb+me\" does not exist on A100-40GB"), "{out}");

    let (code, out) = run(&["mig", "fit", "--gpu", "Z100", "1g.5gb=1"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("unknown GPU product \"Z100\""), "{out}");

    let (code, _) = run(&["mig", "fit", "--gpu", "A100-40GB", "1g.5gb"]);
    assert_eq!(code, 2);
    let (code, _) = run(&["mig", "fit", "--gpu", "A100-40GB"]);
    assert_eq!(code, 2, "clap refuses a missing PROFILE=COUNT");
}

#[test]
fn mig_fit_json_for_machines() {
    let (code, out) = run(&["mig", "fit", "-o", "json", "--gpu", "NVIDIA H100 80GB HBM3", "3g.40gb=1", "2g.20gb=2"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["fits"], true);
    assert_eq!(v["product"], "H100-80GB");
    assert_eq!(v["placements"][2], serde_json::json!({"start": 4, "size": 4, "profile": "3g.40gb"}));

    let (code, out) = run(&["mig", "fit", "-o", "json", "--gpu", "A30", "1g.6gb+me=1", "2g.12gb+me=1"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["fits"], false);
    assert!(v["reason"].as_str().unwrap().contains("at most one"));
}

#[test]
fn mig_profiles_and_layouts() {
    let (code, out) = run(&["mig", "profiles", "--gpu", "a30", "-o", "json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["memorySlots"], 4);
    assert_eq!(v["profiles"][1]["resource"], "nvidia.com/mig-1g.6gb.me");

    let only = ["--only", "1g.5gb", "--only", "2g.10gb", "--only", "3g.20gb", "--only", "4g.20gb", "--only", "7g.40gb"];
    let mut args = vec!["mig", "layouts", "--gpu", "A100-40GB"];
    args.extend(only);
    let (code, out) = run(&args);
    assert_eq!(code, 0);
    assert!(out.contains("19 maximal layouts on A100-40GB"), "{out}");

    let (code, _) = run(&["mig", "profiles", "--gpu", "nope"]);
    assert_eq!(code, 2);
}

const FLEET: &str = "config/examples/fleet/cluster.yaml";
const SAMPLE_PLANS: [&str; 2] =
    ["config/samples/gpupartitionplan-training.yaml", "config/samples/gpupartitionplan-inference.yaml"];

#[test]
fn plan_preview_markdown_on_the_examples() {
    let mut args = vec!["plan", "preview", "-o", "markdown", "--from", FLEET];
    args.extend(SAMPLE_PLANS);
    let (code, md) = run(&args);
    assert_eq!(code, 0, "{md}");
    assert!(md.starts_with("<!-- tessera-plan-preview -->\n### Tessera plan preview"), "{md}");
    assert!(md.contains("| training | 1 | 1 | 0 | 0 | 1 | 0 |"), "{md}");
    assert!(md.contains("| inference | 1 | 1 | 1 | 0 | 0 | 1 |"), "{md}");
    assert!(md.contains("| nvidia.com/gpu | 15 | 14 | -1 |"), "{md}");
    assert!(md.contains("| nvidia.com/mig-1g.10gb | 7 | 14 | +7 |"), "{md}");
    assert!(md.contains("| train-1 | gpu0-6=whole gpu7=7x1g.10gb | team-b/trainer-0 | - |"), "{md}");
    assert!(
        md.contains("| infer-1 | gpu0-1=2x2g.20gb+1x3g.40gb | team-a/chat-0 | pod team-a/notebook has no controller"),
        "{md}"
    );
    assert!(md.contains("| infer-2 | no GPU inventory reported by a node agent |"), "{md}");
    assert!(md.contains("**Warning:** 1 pod(s) would block the drain"), "{md}");
    assert!(!md.contains("kube-system/dcgm-exporter"), "DaemonSet pods are not evicted: {md}");
}

#[test]
fn plan_preview_text_and_json_from_files() {
    let (code, out) = run(&["plan", "preview", "--from", FLEET, SAMPLE_PLANS[0]]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("plan training: 1 node(s) change, 1 unchanged, 0 skipped"), "{out}");
    assert!(out.contains("  change train-1: gpu0-6=whole gpu7=7x1g.10gb"), "{out}");
    let (code, out) = run(&["plan", "preview", "-o", "json", "--from", FLEET, SAMPLE_PLANS[1]]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["changes"][0]["evict"], serde_json::json!(["team-a/chat-0"]));
    assert_eq!(v[0]["capacity_after"]["nvidia.com/mig-3g.40gb"], 2);
}

/// Budgets, DaemonSets and quotas read with `--from` reach the preview: a budget
/// that allows no disruption and a pod of a deleted DaemonSet block the drain, and the quotas
/// the inference layouts leave short are named.
#[test]
fn plan_preview_names_budget_blockers_and_quotas_left_short_from_files() {
    let dir = std::env::temp_dir().join(format!("tessera-cli-pdb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let extra = dir.join("more.yaml");
    std::fs::write(
        &extra,
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: trainers, namespace: team-b}\n\
         spec: {minAvailable: 1, selector: {}}\n\
         status: {disruptionsAllowed: 0, currentHealthy: 1, desiredHealthy: 1, expectedPods: 1}\n---\n\
         apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: other, namespace: kube-system}\n---\n\
         apiVersion: tessera.dev/v1alpha1\nkind: TenantGpuQuota\nmetadata: {name: team-c}\n\
         spec: {namespaces: [team-c], hard: {nvidia.com/mig-1g.10gb: 6}}\n",
    )
    .unwrap();
    let extra = extra.to_string_lossy().into_owned();
    let mut args = vec!["plan", "preview", "-o", "markdown", "--from", FLEET, "--from", &extra];
    args.extend(SAMPLE_PLANS);
    let (code, md) = run(&args);
    assert_eq!(code, 0, "{md}");
    assert!(md.contains("| training | 1 | 1 | 2 | 0 | 1 | 0 |"), "{md}");
    assert!(md.contains("| inference | 1 | 1 | 1 | 3 | 0 | 1 |"), "{md}");
    assert!(md.contains("pod team-b/trainer-0: PodDisruptionBudget team-b/trainers allows 0 disruptions"), "{md}");
    assert!(md.contains("pod kube-system/dcgm-exporter-x1 belongs to DaemonSet dcgm-exporter"), "{md}");
    assert!(md.contains("| team-c | nvidia.com/mig-1g.10gb | 10 | 14 -> 7 | 3 |"), "{md}");
    let (code, out) = run(&["plan", "preview", "-o", "json", "--from", FLEET, "--from", &extra, SAMPLE_PLANS[1]]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["quotas_short"][2]["quota"], "team-c", "{out}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plan_preview_refuses_an_invalid_plan_before_reading_the_cluster() {
    let (code, out) = run(&[
        "plan",
        "preview",
        "-o",
        "markdown",
        "--kubeconfig",
        "does/not/exist",
        "config/samples-invalid/plan-does-not-fit.yaml",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(!out.contains("tessera-plan-preview"), "no comment for an invalid plan: {out}");
}

/// A typo'd selector must not preview as a plan that matches every node (the missing selector
/// matches all): the preview refuses the file as `validate` does.
#[test]
fn plan_preview_refuses_unknown_fields() {
    let dir = std::env::temp_dir().join(format!("tessera-cli-typo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("typo.yaml");
    let plan = std::fs::read_to_string(repo().join(SAMPLE_PLANS[0])).unwrap();
    std::fs::write(&f, plan.replace("nodeSelector:", "nodeSelectr:")).unwrap();
    assert!(std::fs::read_to_string(&f).unwrap().contains("nodeSelectr:"), "the sample has a nodeSelector");
    let (code, out) = run(&["plan", "preview", "--from", FLEET, f.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("typo.yaml: training: spec.nodeSelectr: unknown field"), "{out}");
    assert!(!out.contains("node(s) change"), "nothing is previewed: {out}");
    let (code, out) = run(&["validate", f.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("typo.yaml:doc 1: spec.nodeSelectr: unknown field"), "{out}");
}

#[test]
fn plan_preview_without_a_cluster_is_a_usage_error() {
    let (code, out) = run(&["plan", "preview", "--kubeconfig", "does/not/exist", SAMPLE_PLANS[0]]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--kubeconfig does/not/exist:"), "{out}");
    let (code, out) = run(&["plan", "preview", "--from", "does/not/exist.yaml", SAMPLE_PLANS[0]]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("cannot read does/not/exist.yaml"), "{out}");
}

#[test]
fn markdown_is_only_for_the_preview() {
    let (code, out) = run(&["validate", "-o", "markdown", SAMPLE_PLANS[0]]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("-o markdown is for `plan preview` only; `validate` writes text or json"), "{out}");
    let (code, _) = run(&["mig", "profiles", "--gpu", "A30", "-o", "markdown"]);
    assert_eq!(code, 2);
}

#[test]
fn the_ci_examples_are_valid_yaml_run_the_checks_and_are_in_the_readme() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    for f in ["config/ci/github-actions.yaml", "config/ci/gitlab-ci.yaml"] {
        let text = std::fs::read_to_string(repo().join(f)).unwrap();
        let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(doc.is_object(), "{f}");
        assert!(text.contains("tessera-operator validate plans/*.yaml"), "{f}");
        assert!(text.contains("tessera-operator plan preview -o markdown"), "{f}");
        assert!(text.contains("<!-- tessera-plan-preview -->"), "{f} finds its earlier comment by the marker");
        assert!(
            text.contains(r#".user.login == "github-actions[bot]""#) || text.contains(".author.id == $me"),
            "{f} updates only a comment its own bot user wrote"
        );
        assert!(text.contains("set -o pipefail"), "{f}: a failing API call in a pipe fails the job");
        assert!(text.contains("validated only"), "{f}: a fork's pull request (no secrets) is validated only");
        assert!(readme.contains(&format!("```yaml\n{text}```")), "README must show {f} verbatim");
    }
}

/// Runs `bin` with its stdout a pipe whose reader is already gone (`cmd | head -0`): every write
/// fails with EPIPE. Returns the exit status and stderr.
fn run_into_closed_pipe(bin: &str, args: &[&str]) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(bin)
        .args(args)
        .current_dir(repo())
        .env("RUST_BACKTRACE", "1")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// SIGPIPE's number on Linux and macOS.
const SIGPIPE: i32 = 13;

/// `tessera-operator mig layouts | head -1` must end like `cat` does (killed by SIGPIPE, as
/// kubectl is), not with a panic, exit 101 and a backtrace. (`kubectl tessera`: the CLI crate's
/// tests/kubectl_plugin.rs.)
#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    let op = env!("CARGO_BIN_EXE_tessera-operator");
    let preview = ["plan", "preview", "--from", FLEET, SAMPLE_PLANS[0]];
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (op, vec!["mig", "layouts", "--gpu", "H100-80GB"]),
        (op, vec!["mig", "profiles", "--gpu", "A30", "-o", "json"]),
        (op, vec!["validate", "config/samples"]),
        (op, vec!["validate", "config/samples-invalid/plan-bad-fields.yaml"]),
        (op, preview.to_vec()),
        (op, vec!["plan", "preview", "-o", "markdown", "--from", FLEET, SAMPLE_PLANS[1]]),
        (op, vec!["plan", "suggest", "-o", "json", "--from", FLEET]),
        (op, vec!["--help"]),
    ];
    for (bin, args) in cases {
        let (status, stderr) = run_into_closed_pipe(bin, &args);
        assert_ne!(status.code(), Some(101), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
        // clap writes `--help` itself, ignoring a failed write, and exits 0.
        let want = if args == ["--help"] { None } else { Some(SIGPIPE) };
        assert_eq!(status.signal(), want, "{args:?}: {status:?} {stderr}");
    }
}

/// `kubectl tessera status 2>&1 | true`: its errors go to a closed stderr. It keeps SIGPIPE
/// ignored (its exit status is documented), so a write must not panic. The operator's error
/// paths too, with both streams closed (`kubectl tessera`: the CLI
/// crate's tests/kubectl_plugin.rs).
#[test]
fn a_closed_stderr_ends_error_paths_quietly() {
    let op = env!("CARGO_BIN_EXE_tessera-operator");
    let cases: [(&str, &[&str]); 1] = [(op, &["validate", "/nonexistent/plan.yaml"])];
    for (bin, args) in cases {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let status = Command::new(bin)
            .args(args)
            .current_dir(repo())
            .stdout(writer.try_clone().unwrap())
            .stderr(writer)
            .status()
            .unwrap();
        assert_ne!(status.code(), Some(101), "{args:?}: {status:?}");
        assert!(status.code().is_some_and(|c| c > 0) || status.code().is_none(), "{args:?} failed: {status:?}");
    }
}

/// `plan suggest` takes the same connection flags as `plan preview`: a pipeline that points one
/// at a cluster points both.
#[test]
fn plan_suggest_takes_the_connection_flags_of_plan_preview() {
    let (code, out) = run(&["plan", "suggest", "--kubeconfig", "does/not/exist"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--kubeconfig does/not/exist:"), "{out}");
    let (code, out) = run(&["plan", "suggest", "--request-timeout", "soon"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("\"soon\" is not a duration"), "{out}");
}

/// A pod holding a GPU through a ResourceClaim read with `--from` is evicted by the
/// preview like any GPU pod, for the drivers `--gpu-dra-drivers` names (and only those).
#[test]
fn plan_preview_evicts_a_pod_holding_a_gpu_through_a_claim_from_files() {
    let dir = std::env::temp_dir().join(format!("tessera-cli-dra-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let extra = dir.join("claims.yaml");
    std::fs::write(
        &extra,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: dra-0, namespace: team-a, ownerReferences: \
         [{apiVersion: batch/v1, kind: Job, name: dra, uid: u-dra, controller: true}]}\n\
         spec: {nodeName: infer-1, containers: [{name: c}], resourceClaims: [{name: gpu, resourceClaimName: c1}]}\n\
         status: {phase: Running}\n---\n\
         apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c1, namespace: team-a}\nspec: {}\n\
         status: {allocation: {devices: {results: [{request: r, driver: gpu.nvidia.com, pool: infer-1, device: gpu-0-mig-9-0-4}]}}}\n",
    )
    .unwrap();
    let extra = extra.to_string_lossy().into_owned();
    let evicted = |more: &[&str]| {
        let mut args = vec!["plan", "preview", "-o", "json", "--from", FLEET, "--from", &extra];
        args.extend(more);
        args.push(SAMPLE_PLANS[1]);
        let (code, out) = run(&args);
        assert_eq!(code, 0, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v[0]["changes"][0]["evict"].clone()
    };
    assert_eq!(evicted(&[]), serde_json::json!(["team-a/chat-0", "team-a/dra-0"]));
    assert_eq!(evicted(&["--gpu-dra-drivers", "gpu.example.com"]), serde_json::json!(["team-a/chat-0"]));
    let _ = std::fs::remove_dir_all(dir);
}
