//! A real Kubernetes control plane on loopback: etcd, kube-apiserver (RBAC, static tokens,
//! ResourceQuota admission), kube-controller-manager, kube-scheduler and kwok. Dynamic Resource
//! Allocation (`resource.k8s.io/v1`, GA) is on: the scheduler allocates claims, the controller
//! manager's resource-claim controller makes and frees them.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::Error;
use crate::identity::Identity;
use crate::pki::write_pki;
use crate::process::Component;

/// kwok's node lease duration unless a benchmark asks for longer (the kubelet's default).
pub const DEFAULT_NODE_LEASE_SECONDS: u32 = 40;
/// Label that makes kwok manage a node (the harness sets it on every fake node).
pub const KWOK_NODE_LABEL: &str = "tessera.dev/kwok";

/// Where the cluster is: started here, or an existing one from a kubeconfig.
pub struct ControlPlane {
    pub dir: PathBuf,
    kubeconfigs: HashMap<Identity, PathBuf>,
    components: Vec<Component>,
    /// An external cluster: identities other than admin are impersonated.
    external: bool,
    keep_logs: bool,
    /// How kube-apiserver was started, to restart it on the same port.
    apiserver: Option<(PathBuf, Vec<String>)>,
}

impl ControlPlane {
    /// Starts a control plane, or connects to `TESSERA_E2E_KUBECONFIG` when that is set.
    pub async fn start() -> Result<Self, Error> {
        Self::start_with_node_leases(DEFAULT_NODE_LEASE_SECONDS).await
    }

    /// [`ControlPlane::start`] with kwok's node leases lasting `seconds` (renewed every quarter
    /// of that; the node lifecycle controller's grace period follows). Benchmarks of thousands
    /// of nodes lengthen them, so heartbeats do not swamp the API server of a small machine.
    pub async fn start_with_node_leases(seconds: u32) -> Result<Self, Error> {
        if let Ok(path) = std::env::var("TESSERA_E2E_KUBECONFIG") {
            return Ok(Self::external(path));
        }
        let bin = binaries()?;
        let dir = std::env::temp_dir().join(format!("tessera-e2e-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(dir.join("logs")).map_err(|e| Error::io("temp dir", e))?;
        write_pki(&dir)?;
        let tokens = write_tokens(&dir)?;
        let [etcd, etcd_peer, api, kcm, sched, kwok] = free_ports()?;
        let ports = Ports { etcd, etcd_peer, api, kcm, sched, kwok };
        let server = format!("https://127.0.0.1:{}", ports.api);
        let kubeconfigs = write_kubeconfigs(&dir, &server, &tokens)?;
        let mut cp = Self { dir, kubeconfigs, components: vec![], external: false, keep_logs: false, apiserver: None };
        // In dependency order; `Drop` stops them in reverse.
        cp.start_etcd(&bin, &ports)?;
        cp.start_apiserver(&bin, &ports, &server).await?;
        cp.start_controller_manager(&bin, &ports, seconds)?;
        cp.start_scheduler(&bin, &ports)?;
        cp.start_kwok(&bin, &ports, seconds)?;
        Ok(cp)
    }

    /// The cluster of the kubeconfig at `path`, used for every identity (impersonated).
    fn external(path: String) -> Self {
        let kubeconfigs = Identity::ALL.iter().map(|&i| (i, PathBuf::from(&path))).collect();
        Self {
            dir: PathBuf::from(path),
            kubeconfigs,
            components: vec![],
            external: true,
            keep_logs: true,
            apiserver: None,
        }
    }

    /// The path of `file` in the control plane's folder, as a flag value.
    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// etcd on loopback, without fsync: the tests' data need not survive a crash.
    fn start_etcd(&mut self, bin: &Path, ports: &Ports) -> Result<(), Error> {
        let Ports { etcd: client, etcd_peer: peer, .. } = *ports;
        let args = vec![
            format!("--data-dir={}", self.path("etcd")),
            format!("--listen-client-urls=http://127.0.0.1:{client}"),
            format!("--advertise-client-urls=http://127.0.0.1:{client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-cluster=default=http://127.0.0.1:{peer}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        self.spawn(bin, "etcd", args)
    }

    /// kube-apiserver at `server` (RBAC, static tokens), its flags kept for
    /// `restart_apiserver`; returns once it is ready.
    async fn start_apiserver(&mut self, bin: &Path, ports: &Ports, server: &str) -> Result<(), Error> {
        let p = |f: &str| self.path(f);
        let args: Vec<String> = vec![
            format!("--etcd-servers=http://127.0.0.1:{}", ports.etcd),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", ports.api),
            format!("--cert-dir={}", p("certs")),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            // ServiceAccount admission is off (as in envtest): it would refuse pods created before
            // the controller-manager made the namespace's default ServiceAccount.
            "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ResourceQuota,ValidatingAdmissionPolicy,MutatingAdmissionWebhook,ValidatingAdmissionWebhook".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            format!("--service-account-issuer={server}"),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--endpoint-reconciler-type=none".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            "--enable-priority-and-fairness=false".into(),
            // Without priority and fairness these cap concurrent requests: room for thousands of
            // kwok nodes' heartbeats next to the bench's own traffic.
            "--max-requests-inflight=1600".into(),
            "--max-mutating-requests-inflight=800".into(),
            "--v=1".into(),
        ];
        self.spawn(bin, "kube-apiserver", args.clone())?;
        self.apiserver = Some((bin.to_path_buf(), args));
        self.wait_for_apiserver(Duration::from_secs(90)).await
    }

    /// kube-controller-manager with the controllers the tests rely on; its node grace period
    /// follows kwok's lease of `seconds`.
    fn start_controller_manager(&mut self, bin: &Path, ports: &Ports, seconds: u32) -> Result<(), Error> {
        let system = self.path("system.kubeconfig");
        let args = vec![
            format!("--kubeconfig={system}"),
            format!("--authentication-kubeconfig={system}"),
            format!("--authorization-kubeconfig={system}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", ports.kcm),
            "--leader-elect=false".into(),
            // resourceclaim-controller: DRA's claims from templates (one per pod), `reservedFor` cleared
            // when pods go, the delete-protection finalizer removed (see e2e/src/dra.rs).
            // validatingadmissionpolicy-status-controller: the policies' `status.typeChecking`
            // (e2e/tests/quota_params.rs).
            "--controllers=disruption,replicaset,deployment,daemonset,garbagecollector,namespace,resourcequota,job,serviceaccount,nodelifecycle,clusterrole-aggregation,resourceclaim-controller,validatingadmissionpolicy-status-controller".into(),
            "--concurrent-gc-syncs=5".into(),
            // The default 20 requests/s untaints new nodes at about ten a second: minutes for a
            // bench's thousands of kwok nodes, each change a Node event for every watcher.
            "--kube-api-qps=200".into(),
            "--kube-api-burst=400".into(),
            format!("--node-monitor-grace-period={}s", seconds + 10),
            "--v=1".into(),
        ];
        self.spawn(bin, "kube-controller-manager", args)
    }

    /// kube-scheduler (which also allocates DRA claims).
    fn start_scheduler(&mut self, bin: &Path, ports: &Ports) -> Result<(), Error> {
        let sched = self.path("scheduler.kubeconfig");
        let args = vec![
            format!("--kubeconfig={sched}"),
            format!("--authentication-kubeconfig={sched}"),
            format!("--authorization-kubeconfig={sched}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", ports.sched),
            "--leader-elect=false".into(),
            "--v=1".into(),
        ];
        self.spawn(bin, "kube-scheduler", args)
    }

    /// kwok, managing only the nodes labelled [`KWOK_NODE_LABEL`], their leases lasting `seconds`.
    fn start_kwok(&mut self, bin: &Path, ports: &Ports, seconds: u32) -> Result<(), Error> {
        let args = vec![
            format!("--kubeconfig={}", self.path("system.kubeconfig")),
            // kwok's own "fast" stages, written beside the binaries by e2e/controlplane/build.sh.
            format!("--config={}", bin.join("kwok-stages.yaml").display()),
            "--manage-all-nodes=false".into(),
            format!("--manage-nodes-with-label-selector={KWOK_NODE_LABEL}=true"),
            format!("--server-address=127.0.0.1:{}", ports.kwok),
            "--cidr=10.244.0.1/16".into(),
            "--node-ip=127.0.0.1".into(),
            format!("--node-lease-duration-seconds={seconds}"),
        ];
        self.spawn(bin, "kwok", args)
    }

    /// Starts component `name` from `bin` with `args`, its output in the `logs` folder.
    fn spawn(&mut self, bin: &Path, name: &str, args: Vec<String>) -> Result<(), Error> {
        let logs = self.dir.join("logs");
        self.components.push(Component::spawn(name, &bin.join(name), &args, &logs)?);
        Ok(())
    }

    /// Kills kube-apiserver (as a crashed control-plane node would lose it), keeps it down for
    /// `down`, then starts it again on the same port with the same flags and waits until ready.
    pub async fn restart_apiserver(&mut self, down: Duration) -> Result<(), Error> {
        let (bin, args) = self.apiserver.clone().ok_or_else(|| Error::Timeout("no local kube-apiserver".into()))?;
        if let Some(i) = self.components.iter().position(|c| c.name == "kube-apiserver") {
            self.components.remove(i).stop_now();
        }
        tokio::time::sleep(down).await;
        let logs = self.dir.join("logs");
        self.components.push(Component::spawn("kube-apiserver", &bin.join("kube-apiserver"), &args, &logs)?);
        self.wait_for_apiserver(Duration::from_secs(90)).await
    }

    /// Freezes kube-apiserver for `frozen` (SIGSTOP, then SIGCONT), as an etcd or API-server
    /// stall does: connections stay open and nothing answers, so watches see silence rather than
    /// an error, and every client's clock moves on.
    pub async fn freeze_apiserver(&mut self, frozen: Duration) -> Result<(), Error> {
        let pid = self
            .components
            .iter()
            .find(|c| c.name == "kube-apiserver")
            .map(Component::pid)
            .ok_or_else(|| Error::Timeout("no local kube-apiserver".into()))?;
        let signal = |sig| {
            // SAFETY: kill(2) on a pid this harness started and still holds (not reaped).
            unsafe { libc::kill(pid as libc::pid_t, sig) }
        };
        signal(libc::SIGSTOP);
        tokio::time::sleep(frozen).await;
        signal(libc::SIGCONT);
        self.wait_for_apiserver(Duration::from_secs(60)).await
    }

    /// Polls `/readyz` as admin until the API server is ready (or a component died).
    async fn wait_for_apiserver(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            if let Ok(client) = self.client(Identity::Admin).await {
                let req = http::Request::get("/readyz").body(Vec::new()).expect("static request");
                if client.request_text(req).await.is_ok_and(|body| body.trim() == "ok") {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                self.keep_logs = true;
                return Err(Error::Timeout(format!("kube-apiserver not ready; logs in {}", self.dir.display())));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Fails if any component has exited (and keeps its logs).
    pub fn check_alive(&mut self) -> Result<(), Error> {
        for c in &mut self.components {
            if let Some(status) = c.exited() {
                self.keep_logs = true;
                return Err(Error::ComponentExited {
                    name: c.name.clone(),
                    status: status.to_string(),
                    log: self.dir.join("logs").join(format!("{}.log", c.name)),
                });
            }
        }
        Ok(())
    }

    /// A client acting as `who`.
    pub async fn client(&self, who: Identity) -> Result<Client, Error> {
        Client::try_from(self.config(who).await?).map_err(Error::Kube)
    }

    /// The client configuration for `who` (impersonated on an external cluster).
    pub async fn config(&self, who: Identity) -> Result<Config, Error> {
        let path = &self.kubeconfigs[&who];
        let kc = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig(e.to_string()))?;
        let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
        if self.external && who != Identity::Admin {
            config.auth_info.impersonate = Some(who.user().to_string());
            config.auth_info.impersonate_groups = Some(who.groups().iter().map(|g| g.to_string()).collect());
        }
        Ok(config)
    }

    /// Path of the kubeconfig for `who` (for kubectl or child processes).
    pub fn kubeconfig(&self, who: Identity) -> &Path {
        &self.kubeconfigs[&who]
    }

    /// PIDs of the running components (tests check none outlives the harness).
    pub fn pids(&self) -> Vec<u32> {
        self.components.iter().map(Component::pid).collect()
    }

    /// Keep the temp dir and logs after drop (set automatically when a test panics).
    pub fn keep_logs(&mut self) {
        self.keep_logs = true;
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Reverse order: kwok and controllers before the API server, etcd last.
        while let Some(mut c) = self.components.pop() {
            c.stop();
        }
        if self.external {
            return;
        }
        if self.keep_logs || std::thread::panicking() {
            eprintln!("control-plane logs kept in {}", self.dir.join("logs").display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Finds the binaries: `TESSERA_CONTROLPLANE_BIN`, else builds (or reuses) them via build.sh.
pub fn binaries() -> Result<PathBuf, Error> {
    if let Ok(dir) = std::env::var("TESSERA_CONTROLPLANE_BIN") {
        // A failed build.sh in `VAR=$(build.sh) cargo test` leaves it empty: say so, rather than
        // start whatever `etcd` is on PATH.
        let dir = PathBuf::from(dir);
        let expected =
            ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kwok-stages.yaml"];
        if let Some(absent) = expected.iter().find(|f| !dir.join(f).is_file()) {
            return Err(Error::Build(format!(
                "TESSERA_CONTROLPLANE_BIN={:?} has no {absent}: run e2e/controlplane/build.sh and use the directory it prints",
                dir.display().to_string()
            )));
        }
        return Ok(dir);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("controlplane/build.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| Error::io("controlplane/build.sh", e))?;
    if !out.status.success() {
        return Err(Error::Build(format!("{} failed with {}", script.display(), out.status)));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The loopback ports of one control plane's components, chosen together so they differ.
#[derive(Clone, Copy)]
struct Ports {
    etcd: u16,
    etcd_peer: u16,
    api: u16,
    kcm: u16,
    sched: u16,
    kwok: u16,
}

/// Ports handed out in this process: a control plane keeps its ports even while a component is
/// down (`restart_apiserver`), so another test in the same process must never be given them.
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    // Hold every listener until all are chosen so the ports differ.
    let mut listeners: Vec<TcpListener> = Vec::new();
    let mut ports: Vec<u16> = Vec::new();
    while ports.len() < N {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("port", e))?;
        let port = l.local_addr().map(|a| a.port()).map_err(|e| Error::io("port", e))?;
        if handed_out.insert(port) {
            ports.push(port);
        }
        listeners.push(l);
    }
    Ok(ports.try_into().expect("N ports"))
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn random_token() -> Result<String, Error> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::io("urandom", e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `tokens.csv` for `--token-auth-file`: `token,user,uid,"group1,group2"`.
fn write_tokens(dir: &Path) -> Result<HashMap<Identity, String>, Error> {
    let mut tokens = HashMap::new();
    let mut csv = String::new();
    for who in Identity::ALL {
        let token = random_token()?;
        csv.push_str(&format!("{token},{},{},\"{}\"\n", who.user(), who.file_name(), who.groups().join(",")));
        tokens.insert(who, token);
    }
    std::fs::write(dir.join("tokens.csv"), csv).map_err(|e| Error::io("tokens.csv", e))?;
    Ok(tokens)
}

fn write_kubeconfigs(
    dir: &Path,
    server: &str,
    tokens: &HashMap<Identity, String>,
) -> Result<HashMap<Identity, PathBuf>, Error> {
    let ca = dir.join("ca.crt");
    let mut paths = HashMap::new();
    for who in Identity::ALL {
        let name = who.file_name();
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: tessera-e2e\n  cluster:\n    server: {server}\n    \
             certificate-authority: {}\nusers:\n- name: {name}\n  user:\n    token: {}\ncontexts:\n- name: {name}\n  \
             context:\n    cluster: tessera-e2e\n    user: {name}\ncurrent-context: {name}\n",
            ca.display(),
            tokens[&who]
        );
        let path = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, yaml).map_err(|e| Error::io("kubeconfig", e))?;
        paths.insert(who, path);
    }
    Ok(paths)
}
