"""AKS GPU node pools: the request bodies (pure) and the calls (azure-mgmt-containerservice).

A dtjob GPU pool is a User-mode VM scale set pool that autoscales from zero, so an idle cluster pays for no
GPU; it carries the taint `sku=gpu:NoSchedule` that keeps everything but training pods (which tolerate it) off
the GPUs, and the operator selects it by its `kubernetes.azure.com/agentpool` label.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dtjob.azure.errors import arm_exit_code
from dtjob.azure.quota import PORTAL, QuotaFinding, check_quota, read_compute
from dtjob.contract.transfer_report import ExitCode

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.core.pipeline.transport import HttpTransport

# 1x A100 80 GB, the smallest A100 size: the default PyTorch image needs A100 or newer (CUDA 13), so the
# reference architecture's V100 size (Standard_NC24s_v3) serves only the TensorFlow and Keras images.
DEFAULT_VM_SIZE = "Standard_NC96ads_A100_v4"  # four A100s: the examples ask 4 GPUs per worker
# V100 sizes (NCv3, NDv2): CUDA 13, and with it the default PyTorch image, no longer runs on Volta.
VOLTA_VM_SIZE_RE = re.compile(r"^Standard_(NC\d+r?s_v3|ND40rs_v2)$", re.IGNORECASE)
DEFAULT_TAINT = "sku=gpu:NoSchedule"
POOL_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")
TAINT_RE = re.compile(
    r"^[A-Za-z0-9][-A-Za-z0-9_./]*=[-A-Za-z0-9_.]*:(NoSchedule|PreferNoSchedule|NoExecute)$"
)
LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
OS_DISK_TYPES = ("Managed", "Ephemeral")
OS_SKUS = ("Ubuntu", "AzureLinux")
GPU_DRIVER_MODES = ("Install", "None")
MAX_NODES = 1000
POOL_LABEL = "dtjob.io/pool"


class PoolError(Exception):
    """A node pool request that cannot be made or that Azure refused; `str()` is one line for the CLI.
    `code` is ARM's error code; `exit_code` the CLI's exit status (by default: a value refused before any
    request, a usage error)."""

    def __init__(self, message: str, code: str | None = None, exit_code: int = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = int(exit_code)


class QuotaUnreadable(PoolError):
    """The identity may not read the subscription's compute usage (403): the quota cannot be checked."""


@dataclass(frozen=True)
class GpuPool:
    name: str = "gpu"
    vm_size: str = DEFAULT_VM_SIZE
    min_count: int = 0
    max_count: int = 4
    count: int | None = None  # nodes to start with; default min_count
    os_disk_size_gb: int = 256
    os_disk_type: str = "Managed"
    os_sku: str = "Ubuntu"
    taints: tuple[str, ...] = (DEFAULT_TAINT,)
    labels: Mapping[str, str] = field(default_factory=dict)
    zones: tuple[str, ...] = ()
    max_pods: int | None = None
    spot: bool = False
    gpu_driver: str = "Install"  # "None" when the NVIDIA GPU Operator installs the drivers
    kubernetes_version: str | None = None
    subnet_id: str | None = None


def image_compatibility_note(vm_size: str) -> str | None:
    """What a pool of this size cannot run among the default training images, or None."""
    if VOLTA_VM_SIZE_RE.match(vm_size):
        return (
            f"{vm_size} has V100 GPUs: the default horovod-pytorch image (CUDA 13) needs A100 or H100; "
            "horovod-tensorflow (tensorflow, keras) runs here"
        )
    return None


def validate_pool(pool: GpuPool) -> None:
    """Raise PoolError naming the CLI flag of the first bad value."""
    if not POOL_NAME_RE.match(pool.name):
        raise PoolError(f"NAME: 1-12 lowercase letters or digits starting with a letter, got {pool.name!r}")
    if not re.match(r"^Standard_[A-Za-z0-9_]+$", pool.vm_size):
        raise PoolError(f"--vm-size: expected an Azure VM size like Standard_NC24s_v3, got {pool.vm_size!r}")
    if not 0 <= pool.min_count <= pool.max_count <= MAX_NODES or pool.max_count < 1:
        raise PoolError(f"--min/--max: need 0 <= min <= max, 1 <= max <= {MAX_NODES}")
    count = pool.min_count if pool.count is None else pool.count
    if not pool.min_count <= count <= pool.max_count:
        raise PoolError(f"--count: must lie between --min {pool.min_count} and --max {pool.max_count}")
    if not 30 <= pool.os_disk_size_gb <= 2048:
        raise PoolError(f"--os-disk-size: 30-2048 GB, got {pool.os_disk_size_gb}")
    if pool.os_disk_type not in OS_DISK_TYPES:
        raise PoolError(f"--os-disk-type: one of {', '.join(OS_DISK_TYPES)}, got {pool.os_disk_type!r}")
    if pool.os_sku not in OS_SKUS:
        raise PoolError(f"--os-sku: one of {', '.join(OS_SKUS)}, got {pool.os_sku!r}")
    if pool.gpu_driver not in GPU_DRIVER_MODES:
        raise PoolError(f"--gpu-driver: one of {', '.join(GPU_DRIVER_MODES)}, got {pool.gpu_driver!r}")
    for taint in pool.taints:
        if not TAINT_RE.match(taint):
            raise PoolError(
                f"--taint: expected key=value:NoSchedule|PreferNoSchedule|NoExecute, got {taint!r}"
            )
    for key in pool.labels:
        if not LABEL_KEY_RE.match(key) or key.startswith("kubernetes.azure.com/"):
            raise PoolError(f"--label: {key!r} is not a label key AKS accepts")
    if pool.max_pods is not None and not 10 <= pool.max_pods <= 250:
        raise PoolError(f"--max-pods: 10-250, got {pool.max_pods}")


def agent_pool_body(pool: GpuPool) -> dict[str, Any]:
    """The ARM AgentPool resource for a GPU pool (the PUT body)."""
    validate_pool(pool)
    props: dict[str, Any] = {
        "vmSize": pool.vm_size,
        "count": pool.min_count if pool.count is None else pool.count,
        "enableAutoScaling": True,
        "minCount": pool.min_count,
        "maxCount": pool.max_count,
        "mode": "User",
        "type": "VirtualMachineScaleSets",
        "osType": "Linux",
        "osSKU": pool.os_sku,
        "osDiskSizeGB": pool.os_disk_size_gb,
        "osDiskType": pool.os_disk_type,
        "scaleDownMode": "Delete",
        "nodeTaints": list(pool.taints),
        "nodeLabels": {POOL_LABEL: pool.name, "accelerator": "nvidia", **pool.labels},
        "gpuProfile": {"driver": pool.gpu_driver},
        "tags": {"managed-by": "dtjob"},
    }
    if pool.zones:
        props["availabilityZones"] = list(pool.zones)
    if pool.max_pods is not None:
        props["maxPods"] = pool.max_pods
    if pool.kubernetes_version:
        props["orchestratorVersion"] = pool.kubernetes_version
    if pool.subnet_id:
        props["vnetSubnetID"] = pool.subnet_id
    if pool.spot:
        props.update(scaleSetPriority="Spot", scaleSetEvictionPolicy="Delete", spotMaxPrice=-1)
        # AKS adds this taint to spot pools itself; stating it keeps a later PUT from fighting it.
        props["nodeTaints"].append("kubernetes.azure.com/scalesetpriority=spot:NoSchedule")
    return {"properties": props}


def scaled_body(
    current: Mapping[str, Any], min_count: int | None, max_count: int | None, count: int | None
) -> dict[str, Any]:
    """The PUT body that rescales an existing pool: new autoscaler bounds, or a fixed count (autoscaling off).
    Everything else is carried over from `current` (the GET), so a scale never resets other settings."""
    props = dict(current.get("properties") or {})
    for read_only in ("provisioningState", "powerState", "nodeImageVersion", "currentOrchestratorVersion"):
        props.pop(read_only, None)
    if count is not None:
        if min_count is not None or max_count is not None:
            raise PoolError("pass --count (fixed size) or --min/--max (autoscaling), not both")
        if not 0 <= count <= MAX_NODES:
            raise PoolError(f"--count: 0-{MAX_NODES}, got {count}")
        props.update(enableAutoScaling=False, count=count, minCount=None, maxCount=None)
        return {"properties": props}
    if min_count is None and max_count is None:
        raise PoolError("pass --min and/or --max, or --count")
    low = min_count if min_count is not None else int(props.get("minCount") or 0)
    high = max_count if max_count is not None else int(props.get("maxCount") or max(low, 1))
    if not 0 <= low <= high <= MAX_NODES or high < 1:
        raise PoolError(f"--min/--max: need 0 <= min <= max, 1 <= max <= {MAX_NODES}")
    current_count = int(props.get("count") or 0)
    props.update(
        enableAutoScaling=True, minCount=low, maxCount=high, count=min(max(current_count, low), high)
    )
    return {"properties": props}


def explain_arm_error(err: Exception, action: str) -> PoolError:
    """One line from an ARM failure, with a next step for the errors users meet most."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceNotFoundError

    if isinstance(err, PoolError):
        return err
    if isinstance(err, ClientAuthenticationError) and err.status_code is None:
        return PoolError(
            f"{action}: no Azure credentials ({err.message.splitlines()[0]}); run `az login`",
            exit_code=ExitCode.DENIED,
        )
    if not isinstance(err, HttpResponseError):
        return PoolError(f"{action}: {type(err).__name__}: {err}", exit_code=ExitCode.STORAGE)
    code = err.error.code if err.error is not None and err.error.code else None
    message = err.error.message if err.error is not None and err.error.message else (err.message or "")
    message = " ".join(message.split())
    status = f"{err.status_code} {code}" if err.status_code else (code or "failed")
    hint = ""
    lowered = (code or "").lower()
    if "quota" in lowered or "quota" in message.lower():
        hint = (
            " Request more vCPU quota for this VM family in the cluster's region (az quota update, or "
            f"{PORTAL}), or lower --max."
        )
    elif isinstance(err, ResourceNotFoundError) or err.status_code == 404:
        hint = " Check --subscription, --resource-group and --cluster."
    elif err.status_code == 403:
        hint = " Your identity needs Contributor (or Azure Kubernetes Service Contributor) on the cluster."
    elif lowered in ("skunotavailable", "vmsizenotsupported", "invalidvmsize"):
        hint = " This VM size is not offered in the cluster's region or zones; try another --vm-size."
    return PoolError(f"{action}: {status}: {message}{hint}", code, arm_exit_code(err.status_code))


ProgressFn = Callable[[str], None]


@dataclass
class NodePools:
    """Node pool operations on one AKS cluster. `transport` and `polling_interval` exist for tests and
    proxies; by default the SDK's own transport and ARM's Retry-After pacing are used."""

    subscription_id: str
    resource_group: str
    cluster: str
    credential: TokenCredential
    transport: HttpTransport[Any, Any] | None = None
    polling_interval: float | None = None
    progress: ProgressFn = lambda _line: None
    base_url: str | None = None

    def __post_init__(self) -> None:
        from azure.mgmt.containerservice import ContainerServiceClient

        from dtjob.azure.clients import Deadlines, client_options

        # Each ARM request: 10 s to connect, 60 s for an answer, four more tries; polling paces itself.
        kwargs: dict[str, Any] = client_options(Deadlines(connect_s=10, read_s=60, retries=4, backoff_s=2))
        if self.transport is not None:
            kwargs["transport"] = self.transport
        if self.polling_interval is not None:
            kwargs["polling_interval"] = self.polling_interval
        if self.base_url is not None:
            kwargs["base_url"] = self.base_url
        self._options = kwargs
        self._client = ContainerServiceClient(self.credential, self.subscription_id, **kwargs)
        self._compute_client: Any = None

    def _compute(self) -> Any:
        if self._compute_client is None:
            try:
                from azure.mgmt.compute import ComputeManagementClient
            except ImportError as err:  # installed with dtjob[azure] from this release on
                raise PoolError(f"{err.name} is not installed: pip install 'dtjob[azure]'") from err
            self._compute_client = ComputeManagementClient(
                self.credential, self.subscription_id, **self._options
            )
        return self._compute_client

    def location(self) -> str:
        """The cluster's region: where its pools' VMs count against the subscription's quota."""
        try:
            found = self._client.managed_clusters.get(self.resource_group, self.cluster)
        except Exception as err:
            raise explain_arm_error(err, f"read cluster {self.resource_group}/{self.cluster}") from err
        return str(found.location)

    def check_quota(self, pool: GpuPool) -> QuotaFinding:
        """Whether the pool at its --max fits in the vCPU quota free in the cluster's region (reads only)."""
        location = self.location()
        action = f"read the compute quota of {location}"
        try:
            skus, usages = read_compute(self._compute(), location)
        except Exception as err:
            failure = explain_arm_error(err, action)
            if failure.exit_code == ExitCode.DENIED and failure.code is not None:
                failure = QuotaUnreadable(
                    f"{action}: denied ({failure.code}); it needs Reader on the subscription",
                    failure.code,
                    ExitCode.DENIED,
                )
            raise failure from err
        return check_quota(
            pool.vm_size,
            pool.max_count,
            location,
            skus,
            usages,
            spot=pool.spot,
            zones=pool.zones,
            subscription=self.subscription_id,
        )

    def create(self, pool: GpuPool) -> dict[str, Any]:
        body = agent_pool_body(pool)
        action = f"create pool {pool.name} in {self.resource_group}/{self.cluster}"
        return self._put(pool.name, body, action)

    def scale(
        self, name: str, min_count: int | None = None, max_count: int | None = None, count: int | None = None
    ) -> dict[str, Any]:
        action = f"scale pool {name}"
        current = self.get(name)
        return self._put(name, scaled_body(current, min_count, max_count, count), action)

    def get(self, name: str) -> dict[str, Any]:
        try:
            found = self._client.agent_pools.get(self.resource_group, self.cluster, name)
        except Exception as err:
            raise explain_arm_error(err, f"get pool {name}") from err
        return dict(found.as_dict())

    def list(self) -> list[dict[str, Any]]:
        try:
            return [
                dict(p.as_dict()) for p in self._client.agent_pools.list(self.resource_group, self.cluster)
            ]
        except Exception as err:
            raise explain_arm_error(err, f"list pools of {self.resource_group}/{self.cluster}") from err

    def delete(self, name: str) -> None:
        action = f"delete pool {name}"
        try:
            poller = self._client.agent_pools.begin_delete(self.resource_group, self.cluster, name)
            self._wait(poller, action)
        except Exception as err:
            raise explain_arm_error(err, action) from err

    def _put(self, name: str, body: dict[str, Any], action: str) -> dict[str, Any]:
        try:
            from azure.mgmt.containerservice.models import AgentPool

            # The model takes the wire-format mapping as is, so the body sent is exactly agent_pool_body's.
            poller = self._client.agent_pools.begin_create_or_update(
                self.resource_group, self.cluster, name, AgentPool(body)
            )
            result = self._wait(poller, action)
        except Exception as err:
            raise explain_arm_error(err, action) from err
        return dict(result.as_dict()) if result is not None else {}

    def _wait(self, poller: Any, action: str) -> Any:
        """Wait for a long-running operation, reporting its state every few seconds (AKS pool operations
        take minutes)."""
        started = time.monotonic()
        self.progress(f"{action}: started")
        while not poller.done():
            poller.wait(timeout=10)
            if not poller.done():
                self.progress(f"{action}: {poller.status()} ({time.monotonic() - started:.0f}s)")
        result = poller.result()
        self.progress(f"{action}: {poller.status()} after {time.monotonic() - started:.0f}s")
        return result
