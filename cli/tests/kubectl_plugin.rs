//! Drives the real `kubectl-tessera` binary offline (`--from` files, an unreachable server); the
//! e2e test `kubectl_plugin` runs it against a real control plane.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Exit status, stdout, stderr. Stdout is a pipe here, so colour is off unless asked for.
fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-tessera"))
        .args(args)
        .current_dir(repo())
        .env_remove("NO_COLOR")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const FLEET: &str = "config/examples/fleet/cluster.yaml";

#[test]
fn status_of_the_example_fleet_as_plain_text() {
    let (code, out, err) = run(&["status", "--from", FLEET]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains('\x1b'), "a pipe gets no colour: {out}");
    assert!(
        out.contains("  training  ready False  1/2 updated, 1 in progress  RollingOut: 1 of 2 nodes updated"),
        "{out}"
    );
    assert!(out.contains("dev-1  phase -  ready Unknown"), "{out}");
    assert!(out.contains("  gpu0  A30-24GB  [AABC]   A 2g.12gb  B 1g.6gb  C 1g.6gb  (1/3 busy)"), "{out}");
    assert!(out.contains("B~ team-a  team-a-batch/eval-0"), "{out}");
    assert!(out.contains("  gpu1  A30-24GB  whole GPU  free"), "{out}");
    assert!(out.contains("infer-2  phase -  ready Unknown\n  (no GPUs reported)"), "{out}");
    assert!(out.contains("train-1  phase Draining  ready True  plan training\n  evicting 1 pod"), "{out}");
    assert!(out.contains("  gpu7  H100-80GB  whole GPU  free"), "{out}");
    assert!(out.contains("A~ (no quota)  research/sweep-0"), "{out}");
    assert!(out.contains("  team-b      nvidia.com/gpu=4"), "{out}");
    assert!(!out.contains("old-job"), "a finished pod holds nothing: {out}");
}

#[test]
fn status_json_and_colour() {
    let (code, out, _) = run(&["status", "-o", "json", "--from", FLEET]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = v["nodes"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["dev-1", "infer-1", "infer-2", "train-1", "train-2"]);
    assert_eq!(v["nodes"][0]["gpus"][0]["slots"], "AABC");
    assert_eq!(v["nodes"][1]["gpus"][0]["instances"][1]["holder"]["pod"], "team-a/notebook");
    assert_eq!(v["tenants"]["team-a"]["nvidia.com/mig-1g.10gb"], 2);
    let train1 = &v["nodes"][3]["gpus"];
    assert_eq!(train1[0]["holder"]["pod"], "team-b/trainer-0");
    assert_eq!(train1[0]["exact"], false, "4 of 8 whole GPUs held: which 4 is not known");

    let (code, out, _) = run(&["status", "--color", "always", "--from", FLEET]);
    assert_eq!(code, 0);
    assert!(out.contains("\x1b[33mDraining\x1b[0m"), "{out}");
    let (_, out, _) = run(&["status", "--color", "never", "--from", FLEET]);
    assert!(!out.contains('\x1b'));
}

/// A kubeconfig for `http://127.0.0.1:PORT` in a fresh directory.
fn kubeconfig_for(port: u16, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-plugin-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster: {{server: \"http://127.0.0.1:{port}\"}}\n\
             contexts:\n- name: c\n  context: {{cluster: c, user: u}}\nusers:\n- name: u\n  user: {{token: t}}\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn status_against_a_dead_server_says_what_it_could_not_read_and_exits_1() {
    // A port nothing listens on: connections are refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let kubeconfig = kubeconfig_for(port, "dead");
    let k = kubeconfig.to_str().unwrap();
    let (code, out, err) = run(&["--kubeconfig", k, "--request-timeout", "5", "status"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("NODES\n  (GpuNodes could not be read)"), "the report is still printed: {out}");
    for r in ["gpunodes.tessera.dev", "gpupartitionplans.tessera.dev", "tenantgpuquotas.tessera.dev", "pods"] {
        assert!(err.contains(&format!("error: cannot read {r}: ")), "{r}: {err}");
    }
    assert!(err.contains("Connection refused"), "the cause, not only kube's \"client error (Connect)\": {err}");
    let (code, _, err) = run(&["--kubeconfig", k, "--context", "nope", "status"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("nope"), "{err}");
    // The preview needs every list: it fails instead of understating what changes.
    let (code, out, err) = run(&["--kubeconfig", k, "preview", "config/samples/gpupartitionplan-training.yaml"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.is_empty(), "{out}");
}

#[test]
fn a_server_that_never_answers_is_given_up_on_after_the_request_timeout() {
    // Accepts connections (the kernel's backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let kubeconfig = kubeconfig_for(silent.local_addr().unwrap().port(), "silent");
    let started = std::time::Instant::now();
    let (code, _, err) = run(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--request-timeout", "1", "status"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("error: cannot read pods: "), "{err}");
    // Not a speed goal: a bound on hanging (the four lists run at once, each cut after 1 s).
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "took {:?}", started.elapsed());
    drop(silent);
}

#[test]
fn a_malformed_object_in_a_from_file_is_named() {
    let dir = std::env::temp_dir().join(format!("tessera-plugin-from-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("list.yaml");
    std::fs::write(
        &f,
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: tessera.dev/v1alpha1\n  kind: GpuNode\n  metadata: {name: ok}\n  spec: {}\n\
         - apiVersion: tessera.dev/v1alpha1\n  kind: GpuNode\n  metadata: {name: bad}\n  spec: {}\n  status: {gpus: [{index: zero}]}\n",
    )
    .unwrap();
    let (code, _, err) = run(&["status", "--from", f.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("list.yaml:doc 1: items[1]: status.gpus[0].index: invalid type"), "{err}");
}

#[test]
fn preview_validate_and_mig_are_the_operators_commands() {
    let (code, out, _) =
        run(&["preview", "-o", "markdown", "--from", FLEET, "config/samples/gpupartitionplan-training.yaml"]);
    assert_eq!(code, 0);
    assert!(out.contains("| train-1 | gpu0-6=whole gpu7=7x1g.10gb | team-b/trainer-0 | - |"), "{out}");
    let (code, out, _) = run(&["validate", "config/samples/tenantgpuquota-team-a.yaml"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(", 0 errors"), "{out}");
    let (code, out, _) = run(&["mig", "fit", "--gpu", "A100-40GB", "2g.10gb=2", "3g.20gb=1"]);
    assert_eq!(code, 0);
    assert!(out.contains("memory slots: [AABBCCCC]"), "{out}");
    let (code, _, err) = run(&["status", "-o", "markdown", "--from", FLEET]);
    assert_eq!(code, 2);
    assert!(err.contains("-o markdown is for `plan preview` only; `status` writes text or json"), "{err}");
}

#[test]
fn a_server_that_trickles_its_answer_is_cut_after_the_whole_request_timeout() {
    use std::io::{Read, Write};
    // Answers with headers, then one byte of body every 500 ms: every socket read succeeds within
    // any per-read timeout, so only a limit on the whole request ends it.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in server.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n";
                if conn.write_all(head.as_bytes()).is_err() {
                    return;
                }
                // At most 60 s, so a client without a limit fails the timing below, not hangs.
                for _ in 0..120 {
                    std::thread::sleep(std::time::Duration::from_millis(500));
                    if conn.write_all(b" ").is_err() {
                        return;
                    }
                }
            });
        }
    });
    let kubeconfig = kubeconfig_for(port, "trickle");
    let started = std::time::Instant::now();
    let (code, _, err) = run(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--request-timeout", "1s", "status"]);
    let took = started.elapsed();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("error: cannot read pods: ") && err.contains("within --request-timeout 1s"), "{err}");
    // Not a speed goal: the four lists run at once, each cut after 1 s.
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
    let (code, _, err) = run(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--request-timeout", "1x", "status"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is not a duration"), "{err}");
}

#[test]
fn status_into_a_pipe_closed_early_exits_0_without_a_panic() {
    // More output than a pipe buffers (64 KiB), so the writer meets the closed pipe for sure.
    let dir = std::env::temp_dir().join(format!("tessera-plugin-epipe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("many.yaml");
    let mut yaml = String::from("apiVersion: v1\nkind: List\nitems:\n");
    for i in 0..3000 {
        yaml.push_str(&format!(
            "- {{apiVersion: tessera.dev/v1alpha1, kind: GpuNode, metadata: {{name: gpu-node-{i:05}}}, spec: {{}}}}\n"
        ));
    }
    std::fs::write(&f, yaml).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubectl-tessera"))
        .args(["status", "--from", f.to_str().unwrap()])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // `| head` that has read enough
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
}

/// A pod holding a GPU through a ResourceClaim is shown as its exact holder, by the
/// ResourceSlice's `uuid`, for the drivers `--gpu-dra-drivers` names (and only those).
#[test]
fn status_from_files_shows_the_exact_holder_of_a_device_allocated_through_a_claim() {
    let dir = std::env::temp_dir().join(format!("tessera-plugin-dra-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("dra.yaml");
    std::fs::write(
        &f,
        "apiVersion: tessera.dev/v1alpha1\nkind: GpuNode\nmetadata: {name: node-1}\nspec: {}\n\
         status: {gpus: [{index: 0, uuid: GPU-a, product: NVIDIA H100 80GB HBM3, migCapable: true}]}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: trainer, namespace: ml}\n\
         spec: {nodeName: node-1, containers: [{name: c}], resourceClaims: [{name: gpu, resourceClaimName: c1}]}\n\
         status: {phase: Running}\n---\n\
         apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c1, namespace: ml}\nspec: {}\n\
         status: {allocation: {devices: {results: [{request: r, driver: gpu.example.com, pool: node-1, device: dev-a}]}}}\n---\n\
         apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\n\
         spec: {driver: gpu.example.com, nodeName: node-1, pool: {name: node-1, generation: 1, resourceSliceCount: 1}, \
         devices: [{name: dev-a, attributes: {uuid: {string: GPU-a}}}]}\n",
    )
    .unwrap();
    let file = f.to_str().unwrap();
    let (code, out, err) = run(&["status", "--from", file]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("whole GPU  free"), "not a GPU driver by default: {out}");
    let (code, out, err) = run(&["status", "--gpu-dra-drivers", "gpu.example.com", "--from", file]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("whole GPU  busy  (no quota)  ml/trainer (claim c1)"), "{out}");
    assert!(!out.contains('~'), "exact: {out}");
    let (_, out, _) = run(&["status", "-o", "json", "--gpu-dra-drivers", "gpu.example.com", "--from", file]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["nodes"][0]["gpus"][0]["holder"], serde_json::json!({"pod": "ml/trainer", "claim": "c1"}));
    assert_eq!(v["nodes"][0]["gpus"][0]["exact"], true);
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

/// The operator's commands under `kubectl tessera` end like `cat` on a closed stdout: killed by
/// SIGPIPE, not a panic (`tessera-operator`'s own: the operator crate's tests/cli.rs).
#[test]
fn a_closed_stdout_ends_the_operators_commands_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    let kt = env!("CARGO_BIN_EXE_kubectl-tessera");
    let plan = "config/samples/gpupartitionplan-training.yaml";
    let cases: Vec<Vec<&str>> = vec![
        vec!["mig", "layouts", "--gpu", "H100-80GB"],
        vec!["preview", "--from", FLEET, plan],
        vec!["validate", plan],
    ];
    for args in cases {
        let (status, stderr) = run_into_closed_pipe(kt, &args);
        assert_ne!(status.code(), Some(101), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
        assert_eq!(status.signal(), Some(SIGPIPE), "{args:?}: {status:?} {stderr}");
    }
}

/// `kubectl tessera status 2>&1 | true`: its errors go to a closed stderr. It keeps SIGPIPE
/// ignored (its exit status is documented), so a write must not panic.
#[test]
fn a_closed_stderr_ends_error_paths_quietly() {
    let kt = env!("CARGO_BIN_EXE_kubectl-tessera");
    let cases: [&[&str]; 2] =
        [&["status", "--from", "/nonexistent/cluster.yaml"], &["validate", "/nonexistent/plan.yaml"]];
    for args in cases {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let status = Command::new(kt)
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
