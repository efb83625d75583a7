"""Kueue's MultiKueue across two local control planes: the test's own (the manager) and a second one started
beside it in the same network namespace (the worker), each with its own name, ports and simulated pools
(hack/cluster.sh with CLUSTER_NAME), and a real Kueue on each (testbed/kueue.py).

The manager's Kueue knows DistributedTrainingJob as an external framework of MultiKueue's generic adapter
(`multiKueue.externalFrameworks`), and reaches the worker through a kubeconfig in a Secret of its namespace;
Kueue accepts only a kubeconfig that carries its certificates inline, so the worker's is flattened. The
manager's ClusterQueue holds the MultiKueue admission check; the worker's, of the same LocalQueue name, only
quota. A worker left running by an interrupted test: `CLUSTER_NAME=<name>-worker hack/cluster.sh down`.
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any

from testbed.kueue import API_VERSION
from testbed.operator_harness import REPO, kubectl

GROUP_VERSION = API_VERSION  # v1beta2: what every Kueue the tests run serves
CLUSTER_SCRIPT = REPO / "hack" / "cluster.sh"
# The generic adapter's name for the kind: Kind.version.group.
EXTERNAL_FRAMEWORK = "DistributedTrainingJob.v1alpha1.dtjob.io"
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
KUEUE_NAMESPACE = "kueue-system"
WORKER = "worker1"  # the MultiKueueCluster's name, and its kubeconfig Secret's
CHECK = "multikueue"
QUOTA = {"cpu": "1000", "memory": "10000Gi", "nvidia.com/gpu": "8"}


def manager_config() -> dict[str, Any]:
    """Kueue's Configuration on the manager, over the test bed's: MultiKueue's adapter for the jobs."""
    return {"multiKueue": {"externalFrameworks": [{"name": EXTERNAL_FRAMEWORK}]}}


class WorkerCluster:
    """A second local control plane, `<CLUSTER_NAME>-worker`: started by hack/cluster.sh, stopped the same."""

    def __init__(self) -> None:
        self.name = f"{os.environ.get('CLUSTER_NAME', 'dtjob')}-worker"
        self.env = dict(os.environ, CLUSTER_NAME=self.name)

    def _cluster(self, *args: str) -> str:
        done = subprocess.run(
            [str(CLUSTER_SCRIPT), *args], env=self.env, text=True, capture_output=True, check=False
        )
        assert done.returncode == 0, f"cluster.sh {' '.join(args)} ({self.name}):\n{done.stderr[-3000:]}"
        return done.stdout.strip()

    def start(self) -> str:
        """Starts it (or keeps it, when running); returns its kubeconfig's path."""
        self._cluster("up")
        self.kubeconfig = self._cluster("kubeconfig")
        return self.kubeconfig

    def stop(self) -> None:
        self._cluster("down")

    def flat_kubeconfig(self) -> str:
        """Its kubeconfig with every certificate inline, as MultiKueue requires."""
        done = kubectl(self.kubeconfig, "config", "view", "--raw", "--flatten", "--minify")
        assert done.returncode == 0, done.stderr
        return done.stdout


def _kueue(kind: str, name: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": GROUP_VERSION, "kind": kind, "metadata": meta, "spec": spec}


def _cluster_queue(name: str, flavor: str, checks: list[str]) -> dict[str, Any]:
    resources = [{"name": k, "nominalQuota": v} for k, v in QUOTA.items()]
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {"coveredResources": list(QUOTA), "flavors": [{"name": flavor, "resources": resources}]}
        ],
    }
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return _kueue("ClusterQueue", name, spec)


def queue_objects(namespace: str, queue: str, checks: list[str]) -> list[dict[str, Any]]:
    """A ResourceFlavor, a ClusterQueue with room for a few worlds (and `checks`), the LocalQueue `queue`."""
    flavor, cluster_queue = f"flavor-{namespace}", f"cq-{namespace}"
    return [
        _kueue("ResourceFlavor", flavor, {}),
        _cluster_queue(cluster_queue, flavor, checks),
        _kueue("LocalQueue", queue, {"clusterQueue": cluster_queue}, namespace),
    ]


def manager_objects(namespace: str, queue: str, worker_kubeconfig: str) -> list[dict[str, Any]]:
    """The worker's kubeconfig Secret, its MultiKueueCluster, a MultiKueueConfig naming it, the admission
    check of MultiKueue's controller, and the queues that use it."""
    secret = {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": WORKER, "namespace": KUEUE_NAMESPACE},
        "data": {"kubeconfig": base64.b64encode(worker_kubeconfig.encode()).decode()},
    }  # fmt: skip
    config = f"{CHECK}-{namespace}"
    parameters = {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": config}
    check = {"controllerName": MULTIKUEUE_CONTROLLER, "parameters": parameters}
    kubeconfig = {"locationType": "Secret", "location": WORKER}
    return [
        secret,
        _kueue("MultiKueueCluster", WORKER, {"clusterSource": {"kubeConfig": kubeconfig}}),
        _kueue("MultiKueueConfig", config, {"clusters": [WORKER]}),
        _kueue("AdmissionCheck", config, check),
        *queue_objects(namespace, queue, [config]),
    ]


def priority_class(name: str, value: int) -> dict[str, Any]:
    """A WorkloadPriorityClass (cluster-scoped; its value and description beside the metadata)."""
    return {"apiVersion": GROUP_VERSION, "kind": "WorkloadPriorityClass", "metadata": {"name": name},
            "value": value, "description": "the test's"}  # fmt: skip


def workdir(base: Path, role: str) -> Path:
    path = base / role
    path.mkdir(parents=True, exist_ok=True)
    return path
