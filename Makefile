# hami developer entry points. The README's two commands are `make simulate` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup simulate test lint native k8s containerd helm cluster e2e compat test-floor images clean

# Two stamps: `make simulate` needs hami and its runtime packages only; `make setup` (and
# everything that tests) adds the developer tools. pip prints what it installs.
$(VENV)/.hami-runtime: pyproject.toml
	@echo "make: installing hami and its runtime packages into $(VENV) (first time: a minute or two)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e .
	@touch $@

$(VENV)/.hami-dev: $(VENV)/.hami-runtime
	@echo "make: installing the developer tools (pytest, ruff, mypy, import-linter, ...)"
	$(BIN)/pip install -e '.[dev]'
	@touch $@

setup: $(VENV)/.hami-dev

simulate: $(VENV)/.hami-runtime
	$(BIN)/hami simulate
	@echo "make: run further commands with $(BIN)/hami (or: . $(BIN)/activate; hami --help)"

native:
	@if [ -f native/libvgpu/Makefile ]; then $(MAKE) -C native/libvgpu; fi

# Versions: the pins in hack/k8s/go.mod and hack/containerd/go.mod unless K8S_VERSION /
# CONTAINERD_VERSION name another release pinned under hack/*/versions/ (hack/k8s/pin.sh
# pins a Kubernetes release), e.g. `make e2e K8S_VERSION=1.31.14`. The build scripts read
# these variables; the tests read HAMI_K8S_VERSION / HAMI_CONTAINERD_VERSION, set from them.
K8S_VERSION ?=
CONTAINERD_VERSION ?=
export K8S_VERSION CONTAINERD_VERSION
ifneq ($(strip $(K8S_VERSION)),)
export HAMI_K8S_VERSION := $(K8S_VERSION)
endif
ifneq ($(strip $(CONTAINERD_VERSION)),)
export HAMI_CONTAINERD_VERSION := $(CONTAINERD_VERSION)
endif

k8s:
	hack/k8s/build.sh

# containerd for the real node (2.x by default; CONTAINERD_VERSION=1.7.35 the 1.7 line);
# built once per version, like k8s.
containerd:
	hack/containerd/build.sh

helm:
	hack/helm/build.sh

# `make cluster NODE=real`: a real node (kubelet, containerd 2.x, runc) running hami's device
# plugin, monitor and libvgpu, with hami's scheduler and webhook (root, cgroup v1 and
# Debian's runc containernetworking-plugins umoci skopeo busybox-static). MODE (NODE=real):
# node-lock (HAMi's protocol, the default), cdi (allocate mode cdi: no node lock) or dra
# (DRA mode next to it: kube-controller-manager, hami dra-plugin).
NODE ?= api
MODE ?= node-lock
GPUBED_ARGS = $(if $(filter dra,$(MODE)),--dra,--allocate-mode $(MODE))
# `make cluster NODE=chart [VALUES=my-values.yaml] [RELEASE=hami] [RELEASE_NAMESPACE=hami-system]`:
# the chart installed on that real node (its pods are hami; no hami process on the host),
# kept running until Ctrl-C.
VALUES ?=
RELEASE ?= hami
RELEASE_NAMESPACE ?= hami-system
cluster: setup k8s
ifeq ($(NODE),real)
	$(MAKE) native containerd
	$(BIN)/python -m hami.testing.gpubed up $(GPUBED_ARGS)
else ifeq ($(NODE),chart)
	$(MAKE) native containerd helm
	$(BIN)/python -m hami.testing.chartbed_cli up --release $(RELEASE) --namespace $(RELEASE_NAMESPACE) $(foreach f,$(VALUES),--values $(f))
else
	$(BIN)/python -m hami.testing.controlplane up --gpu-node gpu-0
endif

e2e: setup k8s
	HAMI_E2E_REQUIRED=1 $(BIN)/pytest -m e2e

# The version matrix (bench/compat_matrix.py): control-plane e2e, chart install and the
# real-node GPU pod per Kubernetes release (and containerd release for the node), results
# in bench/results/compat_matrix.{jsonl,md}. Builds what is missing first.
K8S_VERSIONS ?= v1.31.14 v1.33.13 v1.37.2
CONTAINERD_VERSIONS ?= v2.4.2 v1.7.35
compat: setup native helm
	$(BIN)/python bench/compat_matrix.py --build --k8s $(K8S_VERSIONS) --containerd $(CONTAINERD_VERSIONS)

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: setup native k8s containerd helm lint
	HAMI_E2E_REQUIRED=1 HAMI_DEPLOY_REQUIRED=1 HAMI_NODE_REQUIRED=1 $(BIN)/pytest
	$(MAKE) test-floor

# The support floor (docs/install.md, "Kubernetes versions"): its control-plane e2e suite
# and the chart + GPU pod on a real node with its kubelet; built once, cached per version.
FLOOR_K8S_VERSION ?= v1.31.14
test-floor: setup native containerd helm
	K8S_VERSION=$(FLOOR_K8S_VERSION) hack/k8s/build.sh
	HAMI_K8S_VERSION=$(FLOOR_K8S_VERSION) HAMI_E2E_REQUIRED=1 HAMI_DEPLOY_REQUIRED=1 \
	  HAMI_NODE_REQUIRED=1 $(BIN)/pytest -m e2e tests/e2e tests/realnode/test_chart_on_node.py

# Image names: <REGISTRY>/hami/hami-scheduler:<TAG> and <REGISTRY>/hami/hami-device-plugin:<TAG>,
# the names the chart renders with --set global.imageRegistry=<REGISTRY> (docs/install.md).
# Without REGISTRY: hami.invalid, the chart's default too, a name no registry serves (never
# Docker Hub's hami/ namespace, which this project does not own).
# Any engine with a docker-compatible `build` works: docker (with or without BuildKit),
# podman, buildah.
REGISTRY ?=
TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_PREFIX = $(or $(REGISTRY),hami.invalid)/hami
ENGINE ?= $(shell command -v docker 2>/dev/null || command -v podman 2>/dev/null || command -v buildah 2>/dev/null)
images:
	@test -n "$(ENGINE)" || { echo "make images: no container engine (docker, podman or buildah)"; exit 1; }
	$(ENGINE) build -f deploy/docker/scheduler.Dockerfile -t $(IMAGE_PREFIX)/hami-scheduler:$(TAG) .
	$(ENGINE) build -f deploy/docker/device-plugin.Dockerfile -t $(IMAGE_PREFIX)/hami-device-plugin:$(TAG) .

clean:
	rm -rf $(VENV) build dist src/*.egg-info
	@if [ -f native/libvgpu/Makefile ]; then $(MAKE) -C native/libvgpu clean; fi
