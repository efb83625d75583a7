"""Names and labels of every object the operator creates for a job (one place, so they never drift)."""

from __future__ import annotations

from dtjob import API_GROUP

JOB_NAME_LABEL = f"{API_GROUP}/job-name"
ROLE_LABEL = f"{API_GROUP}/role"
# The world attempt a pod belongs to (status.restarts when it was created); older attempts are stale.
ATTEMPT_LABEL = f"{API_GROUP}/attempt"
WORKER_INDEX_LABEL = f"{API_GROUP}/worker-index"
# On the launcher Job: how many workers its world has (spec.workers edited mid-run applies at the next world).
WORLD_SIZE_LABEL = f"{API_GROUP}/world-size"
# Pods that are MPI hosts, selected by the headless Service (workers, plus the launcher when it runs ranks).
MPI_HOST_LABEL = f"{API_GROUP}/mpi-host"
MANAGED_BY = "dtjob-operator"

ROLE_WORKER = "worker"
ROLE_LAUNCHER = "launcher"
# The launcher pod's one container: its log carries every rank's output, progress lines included.
LAUNCHER_CONTAINER = "launcher"


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def launcher_name(job: str) -> str:
    return f"{job}-launcher"


def ssh_secret_name(job: str) -> str:
    return f"{job}-ssh"


def hostfile_name(job: str) -> str:
    return f"{job}-hostfile"


def service_name(job: str) -> str:
    return f"{job}-workers"


def network_policy_name(job: str) -> str:
    return f"{job}-mpi"


def host_fqdn(pod_hostname: str, job: str, namespace: str) -> str:
    return f"{pod_hostname}.{service_name(job)}.{namespace}.svc"


def selector(job: str) -> dict[str, str]:
    """Labels that select every child of a job."""
    return {JOB_NAME_LABEL: job, "app.kubernetes.io/managed-by": MANAGED_BY}


def labels(job: str, component: str, role: str | None = None) -> dict[str, str]:
    out = {
        JOB_NAME_LABEL: job,
        "app.kubernetes.io/name": "dtjob",
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/component": component,
    }
    if role:
        out[ROLE_LABEL] = role
    return out
