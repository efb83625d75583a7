"""Names and labels of every object the operator creates for a job, and the blob paths of its results and
logs (one place, so they never drift). Pure."""

from __future__ import annotations

from enum import StrEnum

from dtjob import API_GROUP

JOB_NAME_LABEL = f"{API_GROUP}/job-name"
ROLE_LABEL = f"{API_GROUP}/role"
# The world attempt a pod belongs to (status.restarts when it was created); older attempts are stale.
ATTEMPT_LABEL = f"{API_GROUP}/attempt"
WORKER_INDEX_LABEL = f"{API_GROUP}/worker-index"
# On the launcher pod (and a torchrun worker): how many workers its world has (spec.workers edited
# mid-run applies at the next world).
WORLD_SIZE_LABEL = f"{API_GROUP}/world-size"
# Pods that are MPI hosts, selected by the NetworkPolicies (workers, plus the launcher when it runs ranks).
MPI_HOST_LABEL = f"{API_GROUP}/mpi-host"
MANAGED_BY = "dtjob-operator"
# The launcher's pod is made with its world; this scheduling gate holds it until every worker is Ready, when
# the operator takes it off (the pod is already there: the launch is one write then).
LAUNCH_GATE = f"{API_GROUP}/workers-ready"
# On a worker pod: the nodes the operator kept it off (their conditions said they could not keep a worker),
# comma-separated, as its affinity says; a pod still unbound when one of them recovers is made again.
AVOIDED_NODES_ANNOTATION = f"{API_GROUP}/avoided-nodes"
# On a Secret: a storage account key the operator may read to sign SAS tokens (accountKey mode). It reads no
# other, so a job cannot point it at another system's key its author may not read; no pod ever gets one.
STORAGE_KEY_LABEL = f"{API_GROUP}/storage-key"
# The EndpointSlice label that names who publishes a slice's endpoints (Kubernetes' own controller says
# endpointslice-controller.k8s.io): the headless Service's MPI hosts are the operator's to publish.
SLICE_MANAGER = f"operator.{API_GROUP}"

ROLE_WORKER = "worker"
ROLE_LAUNCHER = "launcher"
ROLE_STAGER = "stager"
WORKER_CONTAINER = "worker"
# The launcher pod's one container: its log carries every rank's output, progress lines included.
LAUNCHER_CONTAINER = "launcher"
STAGER_CONTAINER = "stager"
# The container that writes each role's log (pods/log needs the name when a pod could have several).
CONTAINER_OF_ROLE = {
    ROLE_WORKER: WORKER_CONTAINER,
    ROLE_LAUNCHER: LAUNCHER_CONTAINER,
    ROLE_STAGER: STAGER_CONTAINER,
}

# The files of a SAS Secret, as pods see them where it is mounted.
SECRET_TOKEN_KEY = "sas-token"
SECRET_URL_KEY = "container-url"
SECRET_EXPIRES_KEY = "expires-at"
# Under the output prefix, each run's directory holds its pods' logs in this folder.
LOGS_DIR = "logs"


class Access(StrEnum):
    """Which side of a job a SAS serves, and so which permissions it carries."""

    INPUT = "in"  # read + list: the dataset container
    # create + write: what the uploads need (Put Blob, Put Block, Put Block List, overwriting their own
    # retries). No list, read, add or delete: a job can neither find nor read other runs' results.
    OUTPUT = "out"

    @property
    def permission(self) -> str:
        # Canonical permission letters, in the order the service expects.
        return "rl" if self is Access.INPUT else "cw"


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


def launcher_network_policy_name(job: str) -> str:
    return f"{job}-launcher-mpi"


def pod_group_name(job: str) -> str:
    """The gang scheduler's PodGroup of the job's world (named after the job, as mpi-operator does)."""
    return job


def staging_job_name(job: str) -> str:
    return f"{job}-stage"


def sas_secret_name(job: str, access: Access) -> str:
    return f"{job}-sas-{access.value}"


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


def directory_prefix(prefix: str) -> str:
    """`train` and `train/` both mean the virtual directory `train/`; empty means the whole container."""
    prefix = prefix.strip("/")
    return f"{prefix}/" if prefix else ""


def run_prefix(prefix: str, namespace: str, job: str, uid: str) -> str:
    """`<prefix>/<namespace>/<job>/<uid>/`: the blob prefix of one run (no leading slash). The uid keeps a
    re-created job with the same name from overwriting an earlier run."""
    return directory_prefix(prefix) + f"{namespace}/{job}/{uid}/"


def output_url(container_url: str, prefix: str, namespace: str, job: str, uid: str) -> str:
    """The run's URL for the job's status. Built from the container URL only, so it never carries a SAS."""
    return f"{container_url.split('?', 1)[0].rstrip('/')}/{run_prefix(prefix, namespace, job, uid)}"


def log_blob_name(
    prefix: str, namespace: str, job: str, uid: str, pod: str, attempt: int | None = None
) -> str:
    """`logs/<pod>.log` for the final world, `logs/attempt-<n>/<pod>.log` for one a restart replaced."""
    return f"{logs_folder(run_prefix(prefix, namespace, job, uid), attempt)}{pod}.log"


def logs_folder(run: str, attempt: int | None = None) -> str:
    """The folder of a run's logs under `run` (its prefix or URL): `logs/` for the final world,
    `logs/attempt-<n>/` for one a restart replaced."""
    return f"{run}{LOGS_DIR}/" if attempt is None else f"{run}{LOGS_DIR}/attempt-{attempt}/"
