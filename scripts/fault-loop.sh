#!/usr/bin/env bash
# The fault-injection loop (e2e/tests/faults.rs) run again and again on a fresh control plane
# each time: leader failover, kube-apiserver freezes shorter and longer than the agents' lease,
# agent restarts and watch outages, mixed, with a rollout in flight and nodes at rest. Stops at
# the first run that cordons a node at rest, evicts a pod on one, or does not converge.
#   scripts/fault-loop.sh [RUNS] [ROUNDS]   (default 20 runs of the test's own rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
rounds=${2:-}
cargo build -q --workspace --bins
cargo build -q -p tessera-nvml-sim
bin=$(e2e/controlplane/build.sh)
for i in $(seq 1 "$runs"); do
  echo "fault loop: run $i of $runs"
  env TESSERA_CONTROLPLANE_BIN="$bin" ${rounds:+TESSERA_FAULT_ROUNDS=$rounds} \
    cargo test -q -p tessera-e2e --test faults -- --nocapture
done
echo "fault loop: $runs runs, no node at rest cordoned, every plan converged"
