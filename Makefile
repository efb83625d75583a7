# dtjob: `make demo` runs a sample job end to end on a local control plane; `make test` runs every test.
# Everything a fresh machine lacks is installed here, idempotently, into caches under $(DTJOB_CACHE).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

include hack/versions.env
export K8S_VERSION ETCD_VERSION KWOK_VERSION HELM_VERSION AZURITE_VERSION

DTJOB_CACHE ?= $(HOME)/.cache/dtjob
export DTJOB_CACHE
PYTHON ?= python3.11
# The venv is keyed by the files that decide its contents, so a changed pin builds a new one and an
# unchanged tree reuses the cached one in seconds.
VENV_KEY := $(shell cat pyproject.toml hack/pydeps.py training/requirements*.txt training/install.sh 2>/dev/null | sha256sum | cut -c1-16)
VENV ?= $(DTJOB_CACHE)/venv/$(VENV_KEY)
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)/operator:$(CURDIR)/training:$(CURDIR)
export PATH := $(DTJOB_CACHE)/bin/kubernetes-$(K8S_VERSION):$(DTJOB_CACHE)/bin/helm-$(HELM_VERSION):$(VENV)/bin:$(PATH)
CLUSTER_NAME ?= dtjob
export CLUSTER_NAME

.PHONY: help print-venv deps venv control-plane azurite cluster-up cluster-down cluster-status lint test test-unit test-integration \
        test-training demo bench clean-cache

help:
	@echo "make demo           local control plane + operator + a sample job to completion"
	@echo "make test           lint, unit, integration (real control plane), training (real Horovod ranks)"
	@echo "make cluster-up     start the local control plane with a simulated AKS GPU pool"
	@echo "make cluster-down   stop it"
	@echo "make bench         benchmarks, ratios measured side by side (BENCH=\"name ...\" picks some)"

print-venv:
	@echo $(VENV)

# Debian packages the tests and the training code need (OpenMPI for horovodrun --mpi, ssh for the MPI world).
deps:
	@hack/install-debs.sh

$(VENV)/.ready:
	@echo "[venv] creating $(VENV)"
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) hack/pydeps.py pyproject.toml azure dev > $(VENV)/requirements.txt
	$(PY) -m pip install -q -r $(VENV)/requirements.txt
	if [ -x training/install.sh ]; then training/install.sh $(PY); fi
	touch $@
	@# Drop venvs unused for a week: each holds several GB of torch/TensorFlow.
	find $(DTJOB_CACHE)/venv -mindepth 1 -maxdepth 1 -type d -atime +7 -exec rm -rf {} +

venv: deps $(VENV)/.ready

control-plane:
	@hack/build-control-plane.sh

# Azurite (Blob Storage emulator) from the npm registry, for the tests marked `azure`.
azurite:
	@hack/install-azurite.sh >/dev/null

cluster-up: control-plane
	@hack/cluster.sh up

cluster-down:
	@hack/cluster.sh down

cluster-status:
	@hack/cluster.sh status

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test-unit: venv
	$(PY) -m pytest tests/unit

test-integration: control-plane venv
	$(PY) -m pytest -m integration tests

test-training: venv
	$(PY) -m pytest tests/training

# One pytest run for everything, so CI reads one closing line.
test: control-plane azurite venv lint
	$(PY) -m pytest tests

demo: cluster-up venv
	$(PY) hack/demo.py

bench: venv azurite cluster-up
	$(PY) -m bench $(BENCH)

clean-cache:
	hack/cluster.sh down || true
	rm -rf $(DTJOB_CACHE)
