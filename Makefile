# hami developer entry points. The README's two commands are `make simulate` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup simulate test lint native k8s cluster e2e clean

$(BIN)/hami: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(BIN)/hami

setup: $(BIN)/hami

simulate: setup
	$(BIN)/hami simulate

native:
	@if [ -f native/libvgpu/Makefile ]; then $(MAKE) -C native/libvgpu; fi

k8s:
	hack/k8s/build.sh

cluster: setup k8s
	$(BIN)/python -m hami.testing.controlplane up --gpu-node gpu-0

e2e: setup k8s
	HAMI_E2E_REQUIRED=1 $(BIN)/pytest -m e2e

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: setup native k8s lint
	HAMI_E2E_REQUIRED=1 $(BIN)/pytest

clean:
	rm -rf $(VENV) build dist src/*.egg-info
	@if [ -f native/libvgpu/Makefile ]; then $(MAKE) -C native/libvgpu clean; fi
