"""The naming and shape rules a job's strings must follow so that Kubernetes, the container runtime and the
registry accept what the operator builds from them. Pure.

Every pattern is RE2 (no lookarounds, no backreferences) so the CRD schema carries the very same string; a
unit test compares them. Python's `re` reads them the same way; the checks use `fullmatch`, since Python's
`$` also matches before a trailing newline and RE2's does not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# DNS-1123 label (Service, Kueue LocalQueue, PodGroup names) and subdomain (Secret, PVC, scheduler names).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_LABEL_MAX = 63
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_SUBDOMAIN_MAX = 253

# A label value: empty, or up to 63 alphanumerics, '-', '_', '.', starting and ending alphanumeric.
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_VALUE_MAX = 63
# A label or annotation key: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
# RE2 cannot bound the prefix's length inside the same pattern: QUALIFIED_PREFIX_MAX is checked apart. No
# backslashes, so the pattern sits in a CEL string literal (map keys can only be checked by CEL) unescaped.
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
QUALIFIED_PREFIX_MAX = 253
# What CEL checks besides QUALIFIED_NAME: a key with a prefix has at most 253 characters before its '/'.
QUALIFIED_PREFIX = "^[^/]{1,253}/"
# A toleration's key: a label key, or empty (with operator Exists: every taint).
TOLERATION_KEY = "^$|" + QUALIFIED_NAME
QUALIFIED_NAME_MAX = QUALIFIED_PREFIX_MAX + 1 + 63
MAX_MAP_ENTRIES = 64  # labels, annotations, node selectors of one pod
MAX_TOLERATIONS = 32

# An environment variable name as the API server has always accepted it (a C identifier plus '-' and '.').
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

# AKS node pool names: lowercase letters and digits, starting with a letter, at most 12 characters (Linux).
NODE_POOL = r"^[a-z][a-z0-9]{0,11}$"
# Exit codes as ranges, `1-127` or `1-127,255`: each code 1-255 (0 is success).
_EXIT_CODE = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]?)"
EXIT_CODE_RANGES = f"^{_EXIT_CODE}(-{_EXIT_CODE})?(,{_EXIT_CODE}(-{_EXIT_CODE})?)*$"
EXIT_CODE_RANGES_MAX = 64

# An image reference as registries and the container runtime parse it:
# [host[:port]/]path[:tag][@algorithm:hex]. Path components are lowercase alphanumerics joined by '.', '_',
# '__' or dashes; the tag is at most 128 characters.
_ALNUM = "[a-z0-9]+"
_COMPONENT = f"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_HOST_PART = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_TAG = "[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = "[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE = f"^(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$"
IMAGE_MAX = 512

# An absolute path without empty, '.' or '..' segments and without a trailing '/' (so equal paths compare
# equal as strings): mount paths, the data directory, the staging destination.
_SEGMENT = r"([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)"
ABSOLUTE_PATH = rf"^(/{_SEGMENT})+$"
PATH_MAX = 4096
# spec.dataset.stageFrom.destination: the same, a trailing '/' allowed (the stager normalizes it away).
DESTINATION = rf"^(/{_SEGMENT})+/?$"
# A Blob Storage prefix: segments without empty, '.' or '..' ones; leading and trailing '/' are dropped.
BLOB_PREFIX = rf"^/*({_SEGMENT}(/{_SEGMENT})*)?/*$"
# An NFS export: the same, or the export root '/'.
NFS_PATH = rf"^/$|^(/{_SEGMENT})+$"
# An NFS server: a host name or IPv4 address, or an IPv6 address.
NFS_SERVER = (
    r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*$"
    r"|^[0-9a-fA-F]*:[0-9a-fA-F:.]*$"
)
NFS_SERVER_MAX = 253

# Paths the operator mounts into its pods itself (desired/: SSH key, hostfile, output, shared memory, SAS
# files), plus /proc, which the container runtime refuses as a mount destination. A user volume may be
# neither one of them, nor inside one, nor above one (it would hide it).
RESERVED_MOUNT_PATHS = ("/etc/dtjob", "/etc/mpi", "/dtjob", "/dev/shm", "/var/run/dtjob", "/proc")

# A resource quantity as a string (integers are quantities too): a non-negative decimal with an optional
# binary (Ki..Ei) or decimal (n, u, m, k, M..E) suffix or an exponent.
QUANTITY = (
    r"^[+]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def matches(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


def label_key_problem(key: str) -> str | None:
    """Why `key` is no valid label or annotation key, or None."""
    if len(key) > QUALIFIED_NAME_MAX or not matches(QUALIFIED_NAME, key):
        return (
            f"{key!r} is not a valid key: an optional DNS subdomain prefix and '/', then at most 63 "
            "letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    prefix, _, _ = key.rpartition("/")
    if len(prefix) > QUALIFIED_PREFIX_MAX:
        return f"{key!r} is not a valid key: its prefix is longer than {QUALIFIED_PREFIX_MAX} characters"
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) > LABEL_VALUE_MAX or not matches(LABEL_VALUE, value):
        return (
            f"{value!r} is not a valid label value: at most 63 letters, digits, '-', '_' or '.', starting "
            "and ending with a letter or digit"
        )
    return None


def name_problem(value: str, subdomain: bool) -> str | None:
    """Why `value` is no DNS-1123 label (or subdomain) name, or None."""
    pattern, limit, what = (
        (DNS_SUBDOMAIN, DNS_SUBDOMAIN_MAX, "DNS-1123 subdomain")
        if subdomain
        else (DNS_LABEL, DNS_LABEL_MAX, "DNS-1123 label")
    )
    if len(value) > limit or not matches(pattern, value):
        return (
            f"{value!r} is not a valid {what}: at most {limit} lowercase letters, digits and '-'"
            + (" or '.'" if subdomain else "")
            + ", starting and ending with a letter or digit"
        )
    return None


def image_problem(image: str) -> str | None:
    if len(image) > IMAGE_MAX or not matches(IMAGE, image):
        return (
            f"{image!r} is not an image reference ([registry[:port]/]repository[:tag][@digest], repository "
            "in lowercase)"
        )
    return None


def path_problem(path: str) -> str | None:
    if len(path) > PATH_MAX or not matches(ABSOLUTE_PATH, path):
        return f"must be an absolute path without empty, '.' or '..' segments or a trailing '/'; got {path!r}"
    return None


def reserved_mount(path: str) -> str | None:
    """The operator's own mount path that `path` would be, sit in or hide; None when it is free."""
    for reserved in RESERVED_MOUNT_PATHS:
        if path == reserved or path.startswith(reserved + "/") or reserved.startswith(path + "/"):
            return reserved
    return None


def toleration_problem(toleration: Mapping[str, Any]) -> tuple[str, str] | None:
    """(field, message) for a toleration the API server would refuse, or None."""
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    value = toleration.get("value") or ""
    effect = toleration.get("effect") or ""
    for field, item in (("key", key), ("operator", operator), ("value", value), ("effect", effect)):
        if not isinstance(item, str):
            return field, f"must be a string, got {item!r}"
    if operator not in ("Exists", "Equal"):
        return "operator", f"must be Exists or Equal, got {operator!r}"
    if effect not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
        return "effect", f"must be NoSchedule, PreferNoSchedule or NoExecute, got {effect!r}"
    if key and (problem := label_key_problem(key)) is not None:
        return "key", problem
    if not key and operator != "Exists":
        return "operator", "must be Exists when key is empty (a toleration of every taint)"
    if operator == "Exists" and value:
        return "value", "must be empty with operator Exists"
    if value and (problem := label_value_problem(value)) is not None:
        return "value", problem
    seconds = toleration.get("tolerationSeconds")
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, int):
            return "tolerationSeconds", f"must be an integer, got {seconds!r}"
        if effect != "NoExecute":
            return "tolerationSeconds", "applies only to effect NoExecute"
    return None


# A template's terminationGracePeriodSeconds is bounded: when Kueue preempts a world, or a suspend or restart
# deletes its pods, their GPUs and quota stay taken until they end. Refused past it at apply (a CEL rule); a
# job stored before the rule keeps running, its pods' grace cut to the bound (dtjob.desired.template).
TERMINATION_GRACE_MAX_SECONDS = 600
TERMINATION_GRACE_WHY = (
    f"must be at most {TERMINATION_GRACE_MAX_SECONDS} seconds: a world that is preempted, suspended or "
    "restarted keeps its GPUs and quota until its pods end"
)

# Pod templates (spec.worker.template, spec.launcher.template) are merged over the pods the operator builds
# (dtjob.desired.template). What of a pod the operator owns is refused there, each with why: at
# `kubectl apply` by the CRD's CEL rules where a rule can say it (the pod-level fields; the same messages), by
# the parser otherwise (dtjob.spec.template).
_HEADLESS = "is set by the operator: the ranks reach each pod by its name under the job's headless Service"
TEMPLATE_OWNED_POD_FIELDS = {
    "restartPolicy": (
        "is set by the operator (Never): a failed pod restarts the whole world, per spec.runPolicy"
    ),
    "hostname": _HEADLESS,
    "subdomain": _HEADLESS,
    "hostnameOverride": _HEADLESS,
    "nodeSelector": (
        "is set by the operator: use spec.placement.nodeSelector (workers) or "
        "spec.placement.launcher.nodeSelector (launcher)"
    ),
}
# What of a pod is the scheduler's: refused at `kubectl apply` by a CEL rule, and dropped from the pods of a
# job stored before that rule (which runs on, placed by the scheduler). A pod bound by name skips the
# scheduler: the gang, Kueue's gate and the nodes the operator keeps a world off (a node whose condition says
# it cannot keep workers) would not hold it, and a world pinned to such a node restarted on it without end.
TEMPLATE_SCHEDULER_POD_FIELDS = {
    "nodeName": (
        "is the scheduler's: a pod bound to a node by name skips the scheduler, the gang, the queue and the "
        "nodes the operator keeps workers off; use spec.placement (nodeSelector, nodePool, affinity)"
    ),
}
# Fields of the operator's own container (names.WORKER_CONTAINER, names.LAUNCHER_CONTAINER) in a template.
_PROGRAM = "is set by the operator (sshd on workers, horovodrun or mpirun on the launcher)"
TEMPLATE_OWNED_CONTAINER_FIELDS = {
    "command": f"{_PROGRAM}: use spec.command",
    "args": f"{_PROGRAM}: use spec.args",
    "image": "is set by the operator: use spec.image",
}
# Only the workers' readiness means something to the operator: sshd accepts connections.
TEMPLATE_OWNED_WORKER_FIELDS = {
    "readinessProbe": "is set by the operator: a worker is Ready when its sshd accepts connections",
}
GPU_RESOURCE = "nvidia.com/gpu"
GPU_WHY = "is set by the operator: use spec.gpusPerWorker"
# Only the operator's container takes spec.image.
IMAGE_REQUIRED_WHY = (
    "is required for a container the template adds (spec.image is the operator's container's)"
)
# A plain container beside the launcher's would keep its pod, and so the job, from ever finishing.
LAUNCHER_ALONE_WHY = (
    "the launcher's pod takes no container beside launcher: the pod would wait for it to end. Add a sidecar "
    "to initContainers with restartPolicy: Always (a native sidecar, stopped when the launcher ends)"
)
# The Open MPI settings the launcher's command line relies on, and the blanked GPUs of a launcher off the GPU
# pool (dtjob.desired.command.LAUNCHER_MPI_ENV, dtjob.desired.pods).
LAUNCHER_OWNED_ENV = (
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_plm_rsh_no_tree_spawn",
    "NVIDIA_VISIBLE_DEVICES",
)
# The pod volumes the operator builds (dtjob.desired.pods), by name. `dshm` (/dev/shm in memory) is the one a
# template may name: as an emptyDir, to set its sizeLimit.
DATA_VOLUME = "data"  # spec.dataset.volume in the pods
CHECKPOINTS_VOLUME = "checkpoints"  # spec.checkpoints in rank 0's pod
SHARED_MEMORY_VOLUME = "dshm"
OPERATOR_VOLUMES = (
    "ssh", "output", SHARED_MEMORY_VOLUME, "mpi", DATA_VOLUME, CHECKPOINTS_VOLUME, "sas-in", "sas-out",
)  # fmt: skip
OPERATOR_VOLUME_WHY = (
    "the operator's volumes are named ssh, output, mpi, data, checkpoints, sas-in and sas-out: name yours "
    "otherwise (a container may mount the operator's)"
)
SHARED_MEMORY_WHY = (
    "dshm (/dev/shm) is the operator's emptyDir in memory: only its sizeLimit may be set, e.g. "
    "{name: dshm, emptyDir: {sizeLimit: 16Gi}}"
)
# Pod labels the operator selects its pods by; a template may set neither these nor any under the prefix.
OWNED_LABEL_PREFIX = "dtjob.io/"
OWNED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
)


def owned_label(key: str) -> bool:
    return key.startswith(OWNED_LABEL_PREFIX) or key in OWNED_LABELS


# Kueue's keys on a pod say which queue, group and Workload admit it: the operator's alone to write (the
# queue from spec.runPolicy.scheduling.queueName). One a job set itself would put its pods in another queue or
# group, or under a Workload another world holds (kueue.x-k8s.io/prebuilt-workload-name): two worlds on one
# quota. The WorkloadPriorityClass is the job's to choose (docs/scheduling.md). Refused in podLabels,
# podAnnotations and template metadata at apply (a CEL rule); from a job stored before the rule they are
# dropped, so that it keeps running (dtjob.spec.model).
KUEUE_KEY_PREFIX = "kueue.x-k8s.io/"
KUEUE_KEYS_THE_JOB_SETS = ("kueue.x-k8s.io/priority-class",)
KUEUE_KEY_WHY = (
    "keys under kueue.x-k8s.io/ are set by the operator (the queue is spec.runPolicy.scheduling.queueName), "
    "but kueue.x-k8s.io/priority-class"
)


def kueue_key_the_operator_sets(key: str) -> bool:
    return key.startswith(KUEUE_KEY_PREFIX) and key not in KUEUE_KEYS_THE_JOB_SETS
