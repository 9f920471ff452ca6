# Tessera. `make demo` runs it on an embedded cluster; `make test` runs every check CI runs.
SHELL := /bin/bash
CARGO ?= cargo
CONTROLPLANE_BUILD := e2e/controlplane/build.sh
# The Kubernetes minor the end-to-end tests, the demo and the bench run on: 1.37 (the newest) by
# default, 1.35 (the oldest still supported) with `make e2e KUBERNETES=1.35`. CI runs both.
KUBERNETES ?= 1.37
export KUBERNETES
# Prints the path of a pinned Go tool (helm, promtool, gpu-feature-discovery), building it into
# ~/.cache/tessera/tools once.
TOOL := tools/build.sh

.PHONY: all build crds lint test unit e2e controlplane tools chart alerts bench demo demo-down demo-ci images images-check clean

all: build

build:
	$(CARGO) build --workspace --all-targets

## Regenerate config/crd/*.yaml and the Helm chart's copies from the Rust types (a test fails when
## they drift).
crds:
	$(CARGO) run -q -p tessera-crds --bin crdgen -- config/crd
	$(CARGO) run -q -p tessera-crds --bin crdgen -- config/helm/tessera/crds

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (Kubernetes
## $(KUBERNETES)) and kwok from pinned Go modules into ~/.cache/tessera/controlplane (reused).
controlplane:
	@$(CONTROLPLANE_BUILD)

## Build helm, promtool and NVIDIA's gpu-feature-discovery from the pinned Go modules in tools/
## into ~/.cache/tessera/tools (reused).
tools:
	@$(TOOL) helm >/dev/null
	@$(TOOL) promtool >/dev/null
	@$(TOOL) gpu-feature-discovery >/dev/null

## The Helm chart, linted strictly (e2e/tests/helm_chart.rs renders it against config/default).
chart:
	helm=$$($(TOOL) helm) && $$helm lint --strict config/helm/tessera

## The alerting rules: checked, and their unit tests (config/observability/alerts.test.yaml).
alerts:
	promtool=$$($(TOOL) promtool) && $$promtool check rules config/observability/alerts.yaml && \
	  $$promtool test rules config/observability/alerts.test.yaml

unit:
	$(CARGO) test --workspace --exclude tessera-e2e

## End-to-end tests against the real control plane of Kubernetes $(KUBERNETES) (built first if
## absent).
e2e: controlplane
	$(CARGO) build --workspace --bins
	$(CARGO) build -p tessera-nvml-sim
	helm=$$($(TOOL) helm) && gfd=$$($(TOOL) gpu-feature-discovery) && bin=$$($(CONTROLPLANE_BUILD)) && \
	  TESSERA_HELM=$$helm TESSERA_GFD=$$gfd TESSERA_CONTROLPLANE_BIN=$$bin $(CARGO) test -p tessera-e2e -- --test-threads=1 $(E2E_ARGS)

## Container images (release binaries) as OCI archives in target/images/, with buildah, podman
## or docker: see README "Install on a real cluster".
images:
	scripts/images.sh build

## Each binary runs inside its image; the operator's user is non-root; sizes.
images-check:
	scripts/images.sh check

## Everything CI checks: formatting, clippy, the Helm chart, the alerting rules, unit and property
## tests, CRD drift, the images (from the dev binaries built here: same packaging, no second
## compile), end-to-end.
test: lint chart alerts
	$(CARGO) build --workspace --bins
	$(CARGO) build -p tessera-nvml-sim
	PROFILE=dev SKIP_CARGO=1 scripts/images.sh build
	PROFILE=dev scripts/images.sh check
	helm=$$($(TOOL) helm) && gfd=$$($(TOOL) gpu-feature-discovery) && bin=$$($(CONTROLPLANE_BUILD)) && \
	  TESSERA_HELM=$$helm TESSERA_GFD=$$gfd TESSERA_CONTROLPLANE_BIN=$$bin $(CARGO) test --workspace -- --test-threads=2
	scripts/demo.sh ci

## The operator's cost per node reconfigured at 100 and 1,000 kwok nodes, and quota admission at
## 10,000 tenant namespaces under 1,000 quotas (BENCH_NAMESPACES, BENCH_QUOTAS; see BENCHMARKS.md).
bench: controlplane
	$(CARGO) build --release -p tessera-operator -p tessera-e2e --bins
	bin=$$($(CONTROLPLANE_BUILD)) && TESSERA_CONTROLPLANE_BIN=$$bin \
	  TESSERA_OPERATOR_BIN=target/release/tessera-operator target/release/bench-rollout $(BENCH_NODES)
	bin=$$($(CONTROLPLANE_BUILD)) && TESSERA_CONTROLPLANE_BIN=$$bin \
	  TESSERA_OPERATOR_BIN=target/release/tessera-operator target/release/bench-quota $(BENCH_NAMESPACES) $(BENCH_QUOTAS)
	target/release/bench-fleet $(BENCH_GPUS)
	target/release/bench-activity

## The demo: an embedded cluster with simulated GPUs, left running (`make demo-down` stops it).
demo:
	@scripts/demo.sh up

demo-down:
	@scripts/demo.sh down

## The demo, non-interactive: fails unless every sample plan becomes Ready (part of `make test`).
demo-ci:
	@scripts/demo.sh ci

clean:
	$(CARGO) clean
