"""Operator-wide settings read from environment variables, with defaults that fit an AKS cluster.

Each default is written once, on OperatorConfig; load_config falls back to it for every unset variable.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from dtjob.contract.training import FRAMEWORKS
from dtjob.spec.nfs_shares import NfsShares, cluster_shares
from dtjob.spec.storage import MAX_SAS_LIFETIME_S, MIN_SAS_LIFETIME_S
from dtjob.spec.tenancy import StoragePolicy, cluster_policy

DEFAULT_IMAGES = {
    "pytorch": "ghcr.io/dtjob/horovod-pytorch:0.1.0",
    # TensorFlow and Keras share one image: Keras 2 (tf_keras) ships beside TensorFlow.
    "tensorflow": "ghcr.io/dtjob/horovod-tensorflow:0.1.0",
    "keras": "ghcr.io/dtjob/horovod-tensorflow:0.1.0",
}
DEFAULT_STAGER_IMAGE = "ghcr.io/dtjob/stager:0.1.0"
# Replace a SAS once this fraction of its lifetime has passed (dtjob.azure.sas's rotation timing too).
DEFAULT_SAS_ROTATE_FRACTION = 0.8
# The most bytes of one pod's log kept in storage (dtjob.azure.logs cuts longer logs), and the least allowed.
DEFAULT_LOG_CAP_BYTES = 64 * 2**20
MIN_LOG_CAP_BYTES = 64 * 2**10


@dataclass(frozen=True)
class ElectionTimings:
    """Seconds. A leader renews every `renew_interval_s`, retries a failed renewal every `retry_period_s`
    and stops writing `renew_deadline_s` after its last accepted renewal; the others poll every
    `retry_period_s` and take over `lease_duration_s` after the Lease last changed."""

    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period_s:g} s, {self.renew_deadline_s:g} s, {self.lease_duration_s:g} s"
            )

    @property
    def renew_interval_s(self) -> float:
        """A third of the lease (5 s by default), and at least two tries before the renew deadline."""
        return max(self.retry_period_s, min(self.lease_duration_s / 3, self.renew_deadline_s / 2))


# The node problem detector's GPU conditions on AKS (GPU pools): the GPUs or their links are broken now.
UNHEALTHY_CONDITIONS = frozenset(
    {"GPUMissing", "XIDErrors", "NVLinkStatusInactive", "IBLinkFlapping", "UnhealthyNvidiaDevicePlugin"}
)
# ... and the node is about to go (Azure scheduled event: a redeploy, a reboot, a spot eviction).
DRAIN_CONDITIONS = frozenset({"VMEventScheduled"})
# How long after such a condition appears a worker there is deleted (and replaced elsewhere); its ranks leave
# the world at their next commit at once. Azure gives a spot eviction about 30 s, maintenance about 15 min.
DRAIN_GRACE_SECONDS = 60.0


@dataclass(frozen=True)
class NodeHealthPolicy:
    """The condition types that make a node unfit for workers (unhealthy) or about to go (drain)."""

    unhealthy: frozenset[str] = UNHEALTHY_CONDITIONS
    drain: frozenset[str] = DRAIN_CONDITIONS
    drain_grace_seconds: float = DRAIN_GRACE_SECONDS

    @property
    def enabled(self) -> bool:
        return bool(self.unhealthy or self.drain)


def parse_condition_types(text: str | None, default: frozenset[str]) -> frozenset[str]:
    """Node condition types, comma-separated (the operator's setting); None: the default, "": none."""
    if text is None:
        return default
    return frozenset(part.strip() for part in text.split(",") if part.strip())


@dataclass(frozen=True)
class OperatorConfig:
    images: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_IMAGES))
    gpu_pool: str = "gpu"
    # "": CPU pods (launchers, the stager, CPU jobs' workers) get no agentpool selector and land on any node
    # they tolerate, which the GPU pool's taint keeps them off; a default AKS cluster names its first pool
    # nodepool1, so no pool name would fit every cluster.
    cpu_pool: str = ""
    gpu_taint_key: str = "sku"
    gpu_taint_value: str = "gpu"
    # How often every job is reconciled even without events (deadlines, TTLs, drift repair).
    resync_seconds: float = 60.0
    # Upper bound on concurrent reconciles; each runs blocking API calls in a worker thread.
    reconcile_workers: int = 8
    # How often a running job's launcher log is read for training progress (one pods/log call each time).
    progress_seconds: float = 30.0
    # The progress reads of every running job together, at most about this many a second (0: unbounded): with
    # more running jobs than that allows, each job's log is read less often (dtjob.runtime.log_polls).
    progress_reads_per_second: float = 10.0
    # How often, while the queue is idle, the C heap's free pages go back to the system (0: never).
    heap_trim_seconds: float = 30.0
    # The staging Job's image (python -m dtjob.stager).
    stager_image: str = DEFAULT_STAGER_IMAGE
    # The installer's registry's pull Secrets: for pods that run only its images (installer_images), and each
    # must exist in the job's namespace.
    image_pull_secrets: tuple[str, ...] = ()
    # Replace a SAS once this fraction of its lifetime has passed (tests lower it to see rotation quickly).
    sas_rotate_fraction: float = DEFAULT_SAS_ROTATE_FRACTION
    # The longest a token the operator signs lives, whatever a job's sasLifetimeSeconds asks (0: as the job
    # asks, up to 7 days). A SAS cannot be revoked: a copy of one outlives the job that held it until then.
    sas_lifetime_max_seconds: int = 0
    # Hosts of Blob Storage emulators (Azurite) whose plain-http endpoints jobs may use, besides loopback.
    # Empty on a production install: jobs then reach storage over https only.
    emulator_hosts: frozenset[str] = frozenset()
    # Which accounts, containers and client IDs jobs may use, cluster-wide (namespaces' annotations override
    # it per namespace; see dtjob.spec.tenancy). The defaults allow no storage account and no explicit client
    # ID.
    storage_policy: StoragePolicy = field(default_factory=lambda: cluster_policy({}))
    # The NFS shares jobs' pods may mount, cluster-wide (a Namespace's dtjob.io/nfs-shares replaces it there;
    # see dtjob.spec.nfs_shares). The default admits any: the namespace's Pod Security level decides.
    nfs_shares: NfsShares = field(default_factory=lambda: cluster_shares({}))
    # Storage accounts with a hierarchical namespace: output SAS tokens there reach only the run's directory.
    hns_accounts: frozenset[str] = frozenset()
    # Create a NetworkPolicy per job that admits traffic to its MPI hosts only from its own pods.
    network_policy: bool = False
    # The most bytes of one pod's log the operator keeps in storage; a longer log keeps its head and tail.
    log_cap_bytes: int = DEFAULT_LOG_CAP_BYTES
    # Every Kubernetes API call: seconds to connect and to wait for an answer (a call that names its own
    # timeout keeps it), and how many times a 429/5xx answer or a broken connection is retried. A hung call
    # ends after (1 + 1 read retry) x the read timeout.
    kube_connect_timeout_seconds: float = 10.0
    kube_timeout_seconds: float = 20.0
    kube_retries: int = 3
    # Every Blob Storage call the operator makes (log uploads, user delegation keys, token requests):
    # seconds to connect and to wait for an answer, per try, and how many more tries. A storage endpoint that
    # never answers costs a reconcile about (1 + azure_retries) x azure_timeout_seconds.
    azure_connect_timeout_seconds: float = 10.0
    azure_timeout_seconds: float = 30.0
    azure_retries: int = 2
    # A reconcile still running after this many seconds stops counting against reconcile_workers (its job
    # stays locked until it ends), so that a few hung jobs never hold up the others.
    reconcile_slow_seconds: float = 10.0
    # Leader election among the operator's replicas (when on: dtjob operator --leader-elect): the Lease's
    # name in the operator's namespace, and its timings (ElectionTimings above).
    lease_name: str = "dtjob-operator"
    # Where the operator runs and as whom (POD_NAMESPACE, DTJOB_SERVICE_ACCOUNT from the downward API): a job
    # in that namespace may not run its pods as that ServiceAccount.
    operator_namespace: str | None = None
    operator_service_account: str | None = None
    election: ElectionTimings = field(default_factory=ElectionTimings)
    # The node conditions (set True) that move a worker off its node: broken GPUs, and a node about to go.
    node_health: NodeHealthPolicy = field(default_factory=NodeHealthPolicy)

    @property
    def sas_lifetime_cap(self) -> timedelta | None:
        """sas_lifetime_max_seconds as a duration; None: no cap."""
        return timedelta(seconds=self.sas_lifetime_max_seconds) if self.sas_lifetime_max_seconds else None

    def image_for(self, framework: str) -> str:
        return self.images[framework]

    @property
    def installer_images(self) -> frozenset[str]:
        """The images the installer configured (the training images, the stager's): the only ones its pull
        Secrets (image_pull_secrets) are given for."""
        return frozenset((*self.images.values(), self.stager_image))


def load_config(environ: Mapping[str, str] | None = None) -> OperatorConfig:
    env = os.environ if environ is None else environ
    d = OperatorConfig()
    return OperatorConfig(
        images={fw: env.get(f"DTJOB_IMAGE_{fw.upper()}", d.images[fw]) for fw in FRAMEWORKS},
        gpu_pool=env.get("DTJOB_GPU_POOL", d.gpu_pool),
        cpu_pool=env.get("DTJOB_CPU_POOL", d.cpu_pool),
        gpu_taint_key=env.get("DTJOB_GPU_TAINT_KEY", d.gpu_taint_key),
        gpu_taint_value=env.get("DTJOB_GPU_TAINT_VALUE", d.gpu_taint_value),
        resync_seconds=float(env.get("DTJOB_RESYNC_SECONDS", d.resync_seconds)),
        reconcile_workers=int(env.get("DTJOB_RECONCILE_WORKERS", d.reconcile_workers)),
        progress_seconds=float(env.get("DTJOB_PROGRESS_SECONDS", d.progress_seconds)),
        progress_reads_per_second=_positive(
            env, "DTJOB_PROGRESS_READS_PER_SECOND", d.progress_reads_per_second, allow_zero=True
        ),
        node_health=NodeHealthPolicy(
            unhealthy=parse_condition_types(env.get("DTJOB_NODE_UNHEALTHY_CONDITIONS"), UNHEALTHY_CONDITIONS),
            drain=parse_condition_types(env.get("DTJOB_NODE_DRAIN_CONDITIONS"), DRAIN_CONDITIONS),
            drain_grace_seconds=_positive(
                env, "DTJOB_NODE_DRAIN_GRACE_SECONDS", DRAIN_GRACE_SECONDS, allow_zero=True
            ),
        ),
        heap_trim_seconds=float(env.get("DTJOB_HEAP_TRIM_SECONDS", d.heap_trim_seconds)),
        stager_image=env.get("DTJOB_STAGER_IMAGE", d.stager_image),
        image_pull_secrets=tuple(
            dict.fromkeys(s.strip() for s in env.get("DTJOB_IMAGE_PULL_SECRETS", "").split(",") if s.strip())
        ),
        sas_rotate_fraction=_fraction(env.get("DTJOB_SAS_ROTATE_FRACTION", str(d.sas_rotate_fraction))),
        sas_lifetime_max_seconds=_lifetime_cap(env.get("DTJOB_SAS_LIFETIME_MAX_SECONDS", "0")),
        emulator_hosts=frozenset(
            h.strip() for h in env.get("DTJOB_EMULATOR_HOSTS", "").split(",") if h.strip()
        ),
        storage_policy=cluster_policy(env),
        nfs_shares=cluster_shares(env),
        hns_accounts=frozenset(
            a.strip().lower() for a in env.get("DTJOB_HNS_ACCOUNTS", "").split(",") if a.strip()
        ),
        network_policy=env.get("DTJOB_NETWORK_POLICY", str(d.network_policy)).lower() == "true",
        log_cap_bytes=_log_cap(env.get("DTJOB_LOG_CAP_BYTES", str(d.log_cap_bytes))),
        kube_connect_timeout_seconds=_positive(
            env, "DTJOB_KUBE_CONNECT_TIMEOUT_SECONDS", d.kube_connect_timeout_seconds
        ),
        kube_timeout_seconds=_positive(env, "DTJOB_KUBE_TIMEOUT_SECONDS", d.kube_timeout_seconds),
        kube_retries=int(_positive(env, "DTJOB_KUBE_RETRIES", d.kube_retries, allow_zero=True)),
        reconcile_slow_seconds=_positive(env, "DTJOB_RECONCILE_SLOW_SECONDS", d.reconcile_slow_seconds),
        azure_connect_timeout_seconds=_positive(
            env, "DTJOB_AZURE_CONNECT_TIMEOUT_SECONDS", d.azure_connect_timeout_seconds
        ),
        azure_timeout_seconds=_positive(env, "DTJOB_AZURE_TIMEOUT_SECONDS", d.azure_timeout_seconds),
        azure_retries=int(_positive(env, "DTJOB_AZURE_RETRIES", d.azure_retries, allow_zero=True)),
        lease_name=env.get("DTJOB_LEASE_NAME", d.lease_name),
        operator_namespace=env.get("POD_NAMESPACE") or None,
        operator_service_account=env.get("DTJOB_SERVICE_ACCOUNT") or None,
        election=ElectionTimings(
            _positive(env, "DTJOB_LEASE_DURATION_SECONDS", d.election.lease_duration_s),
            _positive(env, "DTJOB_LEASE_RENEW_DEADLINE_SECONDS", d.election.renew_deadline_s),
            _positive(env, "DTJOB_LEASE_RETRY_PERIOD_SECONDS", d.election.retry_period_s),
        ),
    )


def _lifetime_cap(text: str) -> int:
    value = int(text)
    if value != 0 and not MIN_SAS_LIFETIME_S <= value <= MAX_SAS_LIFETIME_S:
        raise ValueError(
            f"DTJOB_SAS_LIFETIME_MAX_SECONDS must be 0 (no cap) or {MIN_SAS_LIFETIME_S} to "
            f"{MAX_SAS_LIFETIME_S}, got {text}"
        )
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise ValueError(f"DTJOB_SAS_ROTATE_FRACTION must be between 0 and 1 (exclusive), got {text}")
    return value


def _log_cap(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"DTJOB_LOG_CAP_BYTES must be a whole number of bytes, got {text!r}") from None
    if value < MIN_LOG_CAP_BYTES:
        raise ValueError(f"DTJOB_LOG_CAP_BYTES must be at least {MIN_LOG_CAP_BYTES}, got {value}")
    return value


def _positive(env: Mapping[str, str], name: str, default: float, allow_zero: bool = False) -> float:
    text = env.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan  # refused below, naming the setting
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(
            f"{name} must be a {'non-negative' if allow_zero else 'positive'} number, got {text}"
        )
    return value
