#!/usr/bin/env bash
# Tessera demo on an embedded cluster: real etcd, kube-apiserver, controller-manager, scheduler
# and kwok on loopback; simulated GPUs; the operator and node agents as local processes with the
# RBAC from config/. Usage: scripts/demo.sh up | down | ci
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO=.demo
mode=${1:-up}

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

down() {
  if [ -f "$DEMO/pids" ]; then
    while read -r pid; do kill "$pid" 2>/dev/null || true; done < "$DEMO/pids"
    for _ in $(seq 1 50); do
      alive=0
      while read -r pid; do kill -0 "$pid" 2>/dev/null && alive=1; done < "$DEMO/pids"
      [ $alive = 0 ] && break
      sleep 0.2
    done
    while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done < "$DEMO/pids"
  fi
  # The control plane's directory (etcd data, keys, the admin kubeconfig, logs: ~66 MB) goes too,
  # unless TESSERA_DEMO_KEEP=1 asks to keep it for debugging.
  local dir=
  [ -f "$DEMO/dir" ] && dir=$(cat "$DEMO/dir")
  if [ -n "$dir" ] && [ -d "$dir" ]; then
    if [ "${TESSERA_DEMO_KEEP:-0}" = 1 ]; then
      echo "kept the control plane's directory: $dir"
    else
      rm -rf "$dir"
    fi
  fi
  rm -rf "$DEMO"
  echo "demo stopped"
}

if [ "$mode" = down ]; then down; exit 0; fi
if [ -f "$DEMO/pids" ]; then echo "a demo is already running; 'make demo-down' first" >&2; exit 1; fi

say "Building the control plane (first run on 2 cores: 15 to 30 minutes with empty Go caches; cached afterwards)"
BIN=$(e2e/controlplane/build.sh)
say "Building Tessera (first run: a few minutes)"
cargo build -q --bins -p tessera-operator -p tessera-cli -p tessera-node-agent -p tessera-e2e   # kubectl-tessera, cluster-up, sim-dra-driver
cargo build -q -p tessera-nvml-sim
K="$BIN/kubectl"
mkdir -p "$DEMO"
: > "$DEMO/pids"

say "Starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok"
setsid nohup target/debug/cluster-up > "$DEMO/cluster-up.log" 2>&1 < /dev/null &
echo $! >> "$DEMO/pids"
for _ in $(seq 1 120); do grep -q '^pids:' "$DEMO/cluster-up.log" 2>/dev/null && break; sleep 0.5; done
grep -q '^pids:' "$DEMO/cluster-up.log" || { cat "$DEMO/cluster-up.log"; down; exit 1; }
DIR=$(sed -n 's/^dir: //p' "$DEMO/cluster-up.log")
export KUBECONFIG="$DIR/admin.kubeconfig"
echo "$DIR" > "$DEMO/dir"

say "Installing Tessera's CRDs, namespace, RBAC and the node-agent fence from config/"
# The API server warns about what it does not understand in a CRD (issue 28: `unrecognized format
# "uint8"`); the demo shows such warnings, and `demo ci` fails on them.
$K apply --server-side -k config/crd >/dev/null 2> "$DEMO/crd-apply.err" || { cat "$DEMO/crd-apply.err" >&2; down; exit 1; }
if grep -q . "$DEMO/crd-apply.err"; then
  cat "$DEMO/crd-apply.err" >&2
  if [ "$mode" = ci ]; then echo "demo: installing the CRDs printed warnings" >&2; down; exit 1; fi
fi
$K apply --server-side -k config/base >/dev/null
$K apply --server-side -k config/rbac >/dev/null
$K wait --for condition=established --timeout=60s crd --all >/dev/null

say "Creating kwok GPU nodes: 2 x H100 (inference), 1 x A100 (inference), 1 x H100 (training)"
node() { # name product gpus pool
  cat <<YAML | $K create -f - >/dev/null
apiVersion: v1
kind: Node
metadata:
  name: $1
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {tessera.dev/kwok: "true", type: kwok, tessera.dev/pool: $4, nvidia.com/gpu.product: $2,
           nvidia.com/gpu.count: "$3", nvidia.com/mig.capable: "true", kubernetes.io/hostname: $1}
YAML
  $K patch node "$1" --subresource=status --type=merge \
    -p '{"status":{"capacity":{"cpu":"64","memory":"512Gi","pods":"110"},"allocatable":{"cpu":"64","memory":"512Gi","pods":"110"}}}' >/dev/null
}
node h100-a NVIDIA-H100-80GB-HBM3 2 inference
node h100-b NVIDIA-H100-80GB-HBM3 2 inference
node a100-a NVIDIA-A100-SXM4-40GB 2 inference
node h100-train NVIDIA-H100-80GB-HBM3 8 training

say "Starting a simulated node agent per node (pod-bound service-account tokens, fenced to their node)"
# The agent DaemonSet's pods, as on a real cluster (kwok runs them); each local agent process uses a
# token bound to its node's pod. A drain skips them, as it skips every pod of an existing DaemonSet.
cat <<YAML | $K apply -f - >/dev/null
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: tessera-node-agent, namespace: tessera-system}
spec:
  selector: {matchLabels: {app.kubernetes.io/name: tessera-node-agent}}
  template:
    metadata: {labels: {app.kubernetes.io/name: tessera-node-agent}}
    spec:
      serviceAccountName: tessera-node-agent
      nodeSelector: {nvidia.com/mig.capable: "true"}
      tolerations: [{operator: Exists}]
      containers: [{name: agent, image: tessera/node-agent:demo}]
YAML
agent() { # name gpus
  local pod="" token
  for _ in $(seq 1 120); do
    pod=$($K -n tessera-system get pods -l app.kubernetes.io/name=tessera-node-agent \
      --field-selector "spec.nodeName=$1" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null) || true
    [ -n "$pod" ] && break
    sleep 0.5
  done
  [ -n "$pod" ] || { echo "no agent pod on $1" >&2; down; exit 1; }
  token=$($K -n tessera-system create token tessera-node-agent --bound-object-kind Pod --bound-object-name "$pod" --duration 24h)
  sed "s|token: .*|token: $token|" "$DIR/node-agent.kubeconfig" > "$DEMO/agent-$1.kubeconfig"
  # The agent's real NVML code path, over the simulated libnvidia-ml.so.1 (one copy per node,
  # its GPUs in $DEMO/gpus-NODE.json).
  mkdir -p "$DEMO/nvml-$1"
  cp target/debug/libnvidia_ml.so "$DEMO/nvml-$1/libnvidia-ml.so.1"
  KUBECONFIG="$DEMO/agent-$1.kubeconfig" TESSERA_NVML_SIM_STATE="$DEMO/gpus-$1.json" TESSERA_SIM_GPUS="$2" \
    setsid nohup target/debug/node-agent run --backend nvml --nvml-library "$DEMO/nvml-$1/libnvidia-ml.so.1" \
    --advertise-resources true --node-name "$1" --resync-seconds 5 \
    --activity-sample-seconds 2 --activity-write-interval-seconds 5 \
    > "$DEMO/agent-$1.log" 2>&1 < /dev/null &
  echo $! >> "$DEMO/pids"
}
agent h100-a H100-80GB,H100-80GB
agent h100-b H100-80GB,H100-80GB
# Passed through to a VM: MIG mode changes wait for a reset (on bare metal the driver resets them).
agent a100-a A100-40GB:passthrough,A100-40GB:passthrough
agent h100-train "$(printf 'H100-80GB,%.0s' 1 2 3 4 5 6 7)H100-80GB"

LISTEN=127.0.0.1:18080
[ "$mode" = ci ] && LISTEN=127.0.0.1:0   # CI: any free port
say "Starting the operator (leader election, metrics on http://$LISTEN/metrics)"
KUBECONFIG="$DIR/operator.kubeconfig" POD_NAMESPACE=tessera-system setsid nohup target/debug/tessera-operator run \
  --leader-elect --identity demo --listen "$LISTEN" > "$DEMO/operator.log" 2>&1 < /dev/null &
echo $! >> "$DEMO/pids"

say "Applying config/samples (two plans, two tenant quotas)"
for ns in team-a team-a-batch team-b lab; do $K create namespace "$ns" >/dev/null; done
$K apply -f config/samples/ >/dev/null

say "Rolling out (watch the phases; A100s need a simulated reset when MIG mode changes, see below)"
deadline=$((SECONDS + 300))
last=""
reset_done=""
while [ $SECONDS -lt $deadline ]; do
  now=$($K get gpunodes -o custom-columns=NODE:.metadata.name,PLAN:.spec.plan,PHASE:.status.rollout.phase,READY:'.status.conditions[?(@.type=="Ready")].reason' --no-headers 2>/dev/null | tr -s ' ')
  if [ "$now" != "$last" ]; then echo "--- $(date +%T)"; echo "$now"; last=$now; fi
  # A100s: MIG mode needs a GPU reset; the simulated reboot stands in for the admin's reset.
  if [ -z "$reset_done" ] && $K get gpunode a100-a -o jsonpath='{.status.conditions[?(@.type=="Stalled")].reason}' 2>/dev/null | grep -q ResetRequired; then
    say "a100-a reports ResetRequired (kept cordoned): simulating the admin's GPU reset"
    target/debug/node-agent sim reboot --state "$DEMO/gpus-a100-a.json"
    reset_done=1
  fi
  ready=$($K get gpupartitionplans -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{end}')
  if [ "$ready" = "True True " ]; then break; fi
  sleep 1
done
echo
$K get gpupartitionplans
$K get gpunodes
$K get tenantgpuquotas
echo

say "Allocated versus used: a team-a pod holds a 3g.40gb that computes nothing (GPM SM activity 0%; idleAfter 20s for the demo)"
cat <<YAML | $K apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: hoarder, namespace: team-a}
spec:
  containers: [{name: notebook, image: jupyter/minimal-notebook, resources: {limits: {nvidia.com/mig-3g.40gb: 1}}}]
YAML
hnode=""
for _ in $(seq 1 60); do
  hnode=$($K -n team-a get pod hoarder -o jsonpath='{.spec.nodeName}' 2>/dev/null || true)
  [ -n "$hnode" ] && break
  sleep 0.5
done
idle_ok=""
if [ -n "$hnode" ]; then
  # On its (Hopper) node every 3g.40gb sits idle, whichever one the pod got; the other instances compute.
  for i in 0 1; do
    profiles=($($K get gpunode "$hnode" -o jsonpath="{.status.gpus[$i].instances[*].profile}"))
    uuids=($($K get gpunode "$hnode" -o jsonpath="{.status.gpus[$i].instances[*].uuid}"))
    for j in "${!uuids[@]}"; do
      pct=60; [ "${profiles[$j]}" = 3g.40gb ] && pct=0
      target/debug/node-agent sim set-activity --state "$DEMO/gpus-$hnode.json" --gpu "$i" --mig-uuid "${uuids[$j]}" --percent "$pct" >/dev/null
    done
  done
  $K patch tenantgpuquota team-a --type merge -p '{"spec":{"idleAfter":"20s"}}' >/dev/null
  for _ in $(seq 1 90); do
    target/debug/kubectl-tessera idle -o json 2>/dev/null | grep -q '"pod": *"team-a/hoarder"' && { idle_ok=1; break; }
    sleep 1
  done
  target/debug/kubectl-tessera idle
fi
echo

say "Serving h100-train's devices through DRA: the simulated NVIDIA DRA driver publishes its ResourceSlice"
# sim-dra-driver plays NVIDIA's DRA driver (gpu.nvidia.com): its DeviceClasses, and for each node
# labelled tessera.dev/sim-dra=true a ResourceSlice of the MIG devices (and whole GPUs) the agent reports.
setsid nohup target/debug/sim-dra-driver > "$DEMO/sim-dra-driver.log" 2>&1 < /dev/null &
echo $! >> "$DEMO/pids"
$K label node h100-train tessera.dev/sim-dra=true >/dev/null
dra_ok=""
for _ in $(seq 1 60); do
  $K get resourceslice h100-train-gpu.nvidia.com >/dev/null 2>&1 && { dra_ok=1; break; }
  sleep 0.5
done
[ -n "$dra_ok" ] && $K get resourceslice h100-train-gpu.nvidia.com \
  -o jsonpath='{range .spec.devices[*]}{.name}{"  "}{.attributes.profile.string}{"\n"}{end}'
# In `lab`, which no TenantGpuQuota claims: a quota closes the DRA classes in its namespaces unless
# it writes their limit (quota on claims).
say "A notebook pod in lab (no tenant quota) asks for a 1g.10gb through a ResourceClaimTemplate"
cat <<YAML | $K apply -f - >/dev/null
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-1g-10gb, namespace: lab}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: mig.nvidia.com
          selectors: [{cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}]
---
apiVersion: v1
kind: Pod
metadata: {name: notebook, namespace: lab}
spec:
  resourceClaims: [{name: gpu, resourceClaimTemplateName: one-1g-10gb}]
  containers: [{name: notebook, image: jupyter/minimal-notebook, resources: {claims: [{name: gpu}]}}]
YAML
claimed=""
for _ in $(seq 1 120); do
  node=$($K -n lab get pod notebook -o jsonpath='{.spec.nodeName}' 2>/dev/null || true)
  device=$($K -n lab get resourceclaims -o jsonpath='{.items[0].status.allocation.devices.results[0].device}' 2>/dev/null || true)
  if [ -n "$node" ] && [ -n "$device" ]; then claimed=1; break; fi
  sleep 0.5
done
$K -n lab get resourceclaims
[ -n "$claimed" ] && echo "pod lab/notebook runs on $node with DRA device $device"
echo
echo
if [ "$mode" = ci ]; then
  status=0
  [ -n "$idle_ok" ] || { echo "demo: kubectl tessera idle did not list team-a/hoarder" >&2; tail -20 "$DEMO/operator.log" >&2; status=1; }
  [ "$ready" = "True True " ] || { echo "demo: the plans did not become Ready" >&2; tail -20 "$DEMO/operator.log" >&2; status=1; }
  [ -n "$claimed" ] || { echo "demo: the notebook's claim was not allocated through DRA" >&2; tail -20 "$DEMO/sim-dra-driver.log" >&2; status=1; }
  down
  # `make demo-down` must leave nothing behind (issue 28: the control plane's directory stayed).
  if [ "${TESSERA_DEMO_KEEP:-0}" != 1 ] && [ -e "$DIR" ]; then
    echo "demo: $DIR is still there after 'down'" >&2
    status=1
  fi
  exit $status
fi
cat <<TXT
The cluster stays up. Look around:
  export KUBECONFIG=$KUBECONFIG
  $K get gpupartitionplans,gpunodes,tenantgpuquotas      # or: kubectl get tessera
  $K describe gpupartitionplan inference
  $K get events -A --sort-by=.lastTimestamp | tail
  $K get nodes -o custom-columns=NODE:.metadata.name,MIG:'.status.allocatable'
  $K get deviceclasses,resourceslices; $K -n lab get resourceclaims,pods   # DRA
  curl -s 127.0.0.1:18080/metrics | grep tessera_
  target/debug/kubectl-tessera idle                      # idle slices per tenant (kubectl tessera idle)
Logs: $DEMO/*.log, control plane: $DIR/logs. Stop it with: make demo-down
(which removes $DIR too; TESSERA_DEMO_KEEP=1 make demo-down keeps it)
TXT
