# dtjob: `make demo` runs a sample job end to end on a local control plane; `make test` runs every test.
# Everything a fresh machine lacks is installed here, idempotently, into caches under $(DTJOB_CACHE).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

include hack/versions.env
export K8S_VERSION ETCD_VERSION KWOK_VERSION HELM_VERSION AZURITE_VERSION COREDNS_VERSION KUEUE_VERSION \
  KUEUE_NEWEST_VERSION

DTJOB_CACHE ?= $(HOME)/.cache/dtjob
export DTJOB_CACHE
PYTHON ?= python3.11
# The venv is keyed by the dependency list itself (not by all of pyproject.toml), so a changed pin builds a new
# one while a lint or mypy setting reuses the cached one in seconds. The training frameworks join it only for
# the targets that need them (venv-training; training/install.sh keeps its own stamp).
VENV_KEY := $(shell { $(PYTHON) hack/pydeps.py pyproject.toml azure dev; cat hack/pydeps.py; } 2>/dev/null | sha256sum | cut -c1-16)
VENV ?= $(DTJOB_CACHE)/venv/$(VENV_KEY)
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)/operator:$(CURDIR)/training:$(CURDIR)
export PATH := $(DTJOB_CACHE)/bin/kubernetes-$(K8S_VERSION):$(DTJOB_CACHE)/bin/helm-$(HELM_VERSION):$(VENV)/bin:$(PATH)
CLUSTER_NAME ?= dtjob
export CLUSTER_NAME
# Each phase's wall time (hack/phase.sh), printed at the end of `make demo` and `make test`; one log per run
# (a sub-make inherits its parent's).
ifndef DTJOB_PHASE_LOG
DTJOB_PHASE_LOG := $(CURDIR)/out/phases/$(shell date +%Y%m%d-%H%M%S)-$(shell echo $$PPID).log
endif
export DTJOB_PHASE_LOG
PHASE := hack/phase.sh

.PHONY: help print-venv deps venv venv-training azure-cli control-plane test-binaries gang-schedulers azurite images test-python-deps cluster-up cluster-down cluster-status lint test test-unit \
        test-integration test-training gpu-build-wheels test-e2e registry push-images demo demo-image demo-down demo-sim bench clean-cache

help:
	@echo "make demo           a real PyTorch ResNet-50 job on the local real node, results and logs in Azurite"
	@echo "make kubectl ARGS=\"get dtj -A\"   kubectl on the demo's cluster (it keeps running after make demo)"
	@echo "make demo-down      stop the demo's operator, Azurite and cluster"
	@echo "make demo-sim       the simulated demo: a sample job on a kwok-simulated AKS GPU pool"
	@echo "make test           lint, unit, integration (real control plane), training (real Horovod ranks), e2e (real node)"
	@echo "make cluster-up     start the local control plane with a simulated AKS GPU pool"
	@echo "make cluster-down   stop it"
	@echo "make bench         benchmarks, ratios measured side by side (BENCH=\"name ...\" picks some)"
	@echo "make push-images REGISTRY=myacr.azurecr.io   build the five images for a GPU cluster and push them"

print-venv:
	@echo $(VENV)

# Debian packages the tests and the training code need (OpenMPI for horovodrun --mpi, ssh for the MPI world).
deps:
	@$(PHASE) deps hack/install-debs.sh

# Built under the venv's own lock (hack/cache-lock.sh): a second make at the same time waits for the first and
# finds it ready. A venv cannot be moved once made: it is built in place, and .ready, written last, marks it whole.
$(VENV)/.ready:
	@source hack/cache-lock.sh; log() { echo "[venv] $$*"; }; \
	  if cache_hit venv-$(VENV_KEY) "the venv $(VENV_KEY)" test -f $@; then log "$(VENV) ready"; exit 0; fi; \
	  log "creating $(VENV)"; \
	  rm -rf $(VENV); \
	  $(PYTHON) -m venv $(VENV); \
	  $(PY) -m pip install -q --upgrade pip; \
	  $(PY) hack/pydeps.py pyproject.toml azure dev > $(VENV)/requirements.txt; \
	  $(PY) -m pip install -q -r $(VENV)/requirements.txt; \
	  touch $@
	@# Drop venvs unused for a week: each holds several GB of torch/TensorFlow.
	find $(DTJOB_CACHE)/venv -mindepth 1 -maxdepth 1 -type d -atime +7 -exec rm -rf {} +

# The results uploader's wheels (azure-storage-blob and its build backend), for the test that installs it
# into a bare environment inside the test bed's network namespace, where no registry is reachable.
UPLOADER_WHEELS := $(DTJOB_CACHE)/wheels/uploader-$(VENV_KEY)
export UPLOADER_WHEELS
# Downloaded into a directory of its own, moved into place whole, under its own lock.
$(UPLOADER_WHEELS)/.ready: | $(VENV)/.ready
	@source hack/cache-lock.sh; log() { echo "[venv] $$*"; }; \
	  if cache_hit uploader-wheels-$(VENV_KEY) "the uploader's wheels" test -f $@; then exit 0; fi; \
	  mkdir -p $(dir $(UPLOADER_WHEELS)); \
	  tmp=$$(mktemp -d $(UPLOADER_WHEELS).tmp.XXXXXX); trap 'rm -rf "$$tmp"' EXIT; \
	  $(PY) -m pip download -q -d $$tmp "setuptools>=69" wheel \
	    "$$($(PY) hack/pydeps.py pyproject.toml azure | grep '^azure-storage-blob')"; \
	  touch $$tmp/.ready; chmod 755 $$tmp; \
	  rm -rf $(UPLOADER_WHEELS); mv -T $$tmp $(UPLOADER_WHEELS)

venv: deps
	@$(PHASE) venv $(MAKE) --no-print-directory $(VENV)/.ready $(UPLOADER_WHEELS)/.ready

# The Azure CLI (PyPI's azure-cli, pinned) in a venv of its own, keyed by its version and the Python it runs on:
# the AKS guide's test checks every `az` command and flag the guide shows against the CLI's own parser,
# offline, inside the test bed's network namespace. Built under its own lock into a temporary name, moved
# into place whole (hack/azure-cli-venv.sh).
AZURE_CLI_VERSION := 2.91.0
AZURE_CLI_VENV := $(DTJOB_CACHE)/venv-azure-cli/$(AZURE_CLI_VERSION)-$(notdir $(PYTHON))
export AZURE_CLI_VENV
azure-cli:
	@$(PHASE) azure-cli hack/azure-cli-venv.sh $(AZURE_CLI_VENV) $(AZURE_CLI_VERSION) $(PYTHON)

# PyTorch, TensorFlow and Horovod (built from its sdist with the project's patch) in the same venv: for the
# training tests, mypy over the training code and the benchmarks; with DALI, whose CPU decoder the tests run.
# The demo does without them.
venv-training: venv
	@DTJOB_WITH_DALI=1 $(PHASE) venv-training training/install.sh $(PY)

# The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy,
# kwok, helm, CoreDNS): what the demo and every cluster of the tests run.
control-plane:
	@$(PHASE) control-plane hack/build-control-plane.sh

# Go builds only the tests need: kstatus (sigs.k8s.io/cli-utils), the health library of Flux, for the tests of
# a job's GitOps health, and Kueue's manager, for the tests of jobs it queues and preempts.
test-binaries:
	@$(PHASE) kstatus hack/build-kstatus.sh
	@$(PHASE) kueue hack/build-kueue.sh

# scheduler-plugins' coscheduling kube-scheduler and the PodGroup CRDs, for the gang-scheduling tests, and
# prometheus-operator's ServiceMonitor CRD, for the chart's tests.
gang-schedulers:
	@$(PHASE) gang-schedulers hack/build-control-plane.sh scheduler_plugins volcano_crds volcano_scheduler \
	  servicemonitor_crd

# Azurite (Blob Storage emulator) from the npm registry, for the tests marked `azure`.
azurite:
	@$(PHASE) azurite hack/install-azurite.sh >/dev/null

# A registry the image-push test starts on 127.0.0.1 (Debian's package, unpacked into the cache only).
registry:
	@$(PHASE) registry hack/install-registry.sh >/dev/null

# The five images for a registry, pushed as $(REGISTRY)/dtjob/NAME:TAG (TAG: the chart's appVersion), the names
# the chart gives the operator and the jobs. Log in first (az acr login --name ...).
push-images:
	@[[ -n "$(REGISTRY)" ]] || { echo "usage: make push-images REGISTRY=myregistry.azurecr.io [TAG=0.1.0]" >&2; exit 2; }
	@hack/push-images.sh $(REGISTRY) $(TAG)

# The images/ Dockerfiles built with buildah on a local Debian base, cached by their inputs (horovod-pytorch
# as a GPU pool gets it, horovod-tensorflow in its CPU form).
images: deps
	@hack/build-images.sh $(IMAGES)

cluster-up: control-plane
	@hack/cluster.sh up

cluster-down:
	@hack/cluster.sh down

cluster-status:
	@hack/cluster.sh status

# lint-imports checks the layer contracts in pyproject.toml ([tool.importlinter]).
lint: venv-training
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-logo
	$(PY) hack/check_sizes.py

test-unit: venv
	$(PY) -m pytest tests/unit

test-integration: control-plane test-binaries gang-schedulers venv azure-cli
	$(PY) -m pytest -m integration tests

test-training: venv-training gpu-build-wheels
	$(PY) -m pytest tests/training

# The GPU build test (tests/training/test_gpu_build.py) installs each GPU framework into a venv of its own,
# offline, as the tests run without a route out: the wheels come first (after the training venv, which
# shares the wheelhouse).
gpu-build-wheels: venv-training
	@DTJOB_DEVICE=gpu DTJOB_FRAMEWORKS=torch DTJOB_DOWNLOAD_ONLY=1 $(PHASE) gpu-wheels-torch training/install.sh $(PY)
	@DTJOB_DEVICE=gpu DTJOB_FRAMEWORKS=tensorflow DTJOB_DOWNLOAD_ONLY=1 $(PHASE) gpu-wheels-tf training/install.sh $(PY)

# The test bed's own network namespace (loopback and the real node's bridge, no route out) holds every
# cluster, Azurite and the tests; a cluster name of its own keeps a developer's running cluster untouched.
IN_TEST_NETNS := hack/netns.sh run env CLUSTER_NAME=dtjob-test

test-e2e: control-plane test-binaries test-python-deps
	$(IN_TEST_NETNS) $(PY) -m pytest -m e2e tests/e2e

# What the tests need besides the Go-built test bed, in order: the training venv fills the wheelhouse that
# the image builds then read.
test-python-deps: azurite registry azure-cli venv-training gpu-build-wheels
	@$(PHASE) images hack/build-images.sh

# Every test, in three pytest runs side by side (hack/run-tests.sh): the training and e2e tiers (CPU-bound), the
# integration files that wait on the control plane's timers, and the rest; one line at the end sums them.
# Before them, on a cold machine, two lines of builds overlap: the Python and image chain (downloads, pip
# installs, layer exports) and the Go builds (compiles that fill both cores, one after another). Two makes,
# not `make -j2`: that gave both slots to Go builds and left the downloads waiting for them.
test: deps
	@$(MAKE) --no-print-directory test-python-deps & python_line=$$!; \
	  go_rc=0; hack/go-scratch.sh $(MAKE) --no-print-directory control-plane test-binaries gang-schedulers || go_rc=$$?; \
	  python_rc=0; wait $$python_line || python_rc=$$?; \
	  [[ $$go_rc == 0 && $$python_rc == 0 ]] || { $(PHASE) report; exit 1; }
	@$(PHASE) lint $(MAKE) --no-print-directory lint || { $(PHASE) report; exit 1; }
	@rc=0; $(PHASE) pytest $(IN_TEST_NETNS) hack/run-tests.sh $(PY) --durations=15 || rc=$$?; \
	  $(PHASE) report; exit $$rc

# The real demo keeps its cluster in a named network namespace, so it can be looked at afterwards; a cluster
# name of its own keeps it apart from the one `make test` starts and stops. The cluster, the operator and
# Azurite keep running after the demo, a playground (`make kubectl ARGS="get dtj -A"`), until `make demo-down`;
# DEMO_STATE holds the operator's and Azurite's pidfiles and logs, and what the demo downloads.
DEMO_NETNS ?= dtjob-demo
DEMO_CLUSTER ?= dtjob-demo
DEMO_STATE ?= $(DTJOB_CACHE)/demo/$(DEMO_CLUSTER)
IN_DEMO_NETNS = hack/netns.sh exec $(DEMO_NETNS) env REAL_CLUSTER_NAME=$(DEMO_CLUSTER) DEMO_NETNS=$(DEMO_NETNS) \
  DEMO_STATE=$(DEMO_STATE)
demo: deps
	@$(MAKE) --no-print-directory -j2 control-plane azurite venv demo-image
	@rc=0; $(PHASE) demo-run $(IN_DEMO_NETNS) $(PY) hack/demo.py \
	  || rc=$$?; $(PHASE) report; exit $$rc

# kubectl on the demo's cluster, from inside its network namespace: make kubectl ARGS="get dtj -A"
.PHONY: kubectl
kubectl:
	@[[ -e /run/netns/$(DEMO_NETNS) ]] || { echo "no demo is running (no network namespace $(DEMO_NETNS)): make demo" >&2; exit 1; }
	@$(IN_DEMO_NETNS) kubectl --kubeconfig "$$(REAL_CLUSTER_NAME=$(DEMO_CLUSTER) hack/realnode.sh kubeconfig)" $(ARGS)

# The one image the demo runs; its build (downloads, pip installs, Horovod's CPU compile) overlaps the Go builds.
demo-image: deps
	@$(PHASE) image-pytorch hack/build-images.sh horovod-pytorch

# The operator goes first (it would recreate what the cluster's teardown deletes), Azurite after the cluster;
# stopped by their pidfiles with the standard library only (testbed/pidfile.py), no venv needed.
demo-down:
	@if [[ -d $(DEMO_STATE) ]]; then $(PYTHON) -m testbed.pidfile stop $(DEMO_STATE)/operator.pid; fi
	hack/netns.sh exec $(DEMO_NETNS) env REAL_CLUSTER_NAME=$(DEMO_CLUSTER) hack/realnode.sh down
	@if [[ -d $(DEMO_STATE) ]]; then $(PYTHON) -m testbed.pidfile stop $(DEMO_STATE)/azurite.pid; fi
	hack/netns.sh delete $(DEMO_NETNS)

demo-sim: cluster-up venv
	$(PY) hack/demo_sim.py

bench: venv-training azurite cluster-up
	$(PY) -m bench $(BENCH)

clean-cache:
	hack/cluster.sh down || true
	$(MAKE) --no-print-directory demo-down || true
	@# Whatever an interrupted build or node left mounted under the cache goes first, or rm cannot remove it.
	findmnt -rn -o TARGET | grep -F "$(DTJOB_CACHE)/" | sort -r | xargs -r umount -l || true
	rm -rf $(DTJOB_CACHE)
