# Tessera. `make demo` runs it on an embedded cluster; `make test` runs every check CI runs.
SHELL := /bin/bash
CARGO ?= cargo
CONTROLPLANE_BUILD := e2e/controlplane/build.sh

.PHONY: all build crds lint test unit e2e controlplane bench demo demo-down clean

all: build

build:
	$(CARGO) build --workspace --all-targets

## Regenerate config/crd/*.yaml from the Rust types (a test fails when they drift).
crds:
	$(CARGO) run -q -p tessera-crds --bin crdgen -- config/crd

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Build etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok from pinned Go
## modules into ~/.cache/tessera/controlplane (reused on later runs).
controlplane:
	@$(CONTROLPLANE_BUILD)

unit:
	$(CARGO) test --workspace --exclude tessera-e2e

## End-to-end tests against the real control plane (built first if absent).
e2e: controlplane
	$(CARGO) build --workspace --bins
	TESSERA_CONTROLPLANE_BIN=$$($(CONTROLPLANE_BUILD)) $(CARGO) test -p tessera-e2e -- --test-threads=1

## Everything CI checks: formatting, clippy, unit and property tests, CRD drift, end-to-end.
test: lint
	$(CARGO) build --workspace --bins
	TESSERA_CONTROLPLANE_BIN=$$($(CONTROLPLANE_BUILD)) $(CARGO) test --workspace -- --test-threads=2

## The operator's cost per node reconfigured at 100 and 1,000 kwok nodes (see BENCHMARKS.md).
bench: controlplane
	$(CARGO) build --release -p tessera-operator -p tessera-e2e --bins
	TESSERA_CONTROLPLANE_BIN=$$($(CONTROLPLANE_BUILD)) TESSERA_OPERATOR_BIN=target/release/tessera-operator \
	  target/release/bench-rollout $(BENCH_NODES)

clean:
	$(CARGO) clean
