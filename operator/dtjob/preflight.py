"""Checks only the operator can make before creating anything: referenced objects exist, a worker fits a node.

Returns a Blocker (the job waits in Pending, or fails when it can never run) instead of creating a half world.
"""

from __future__ import annotations

from dtjob.desired.pods import GPU_RESOURCE
from dtjob.kube import Kube, Rejected
from dtjob.observed import Blocker
from dtjob.spec import JobSpec


def preflight(kube: Kube, spec: JobSpec) -> Blocker | None:
    for field, volume in (
        ("spec.dataset.volume", spec.dataset.volume),
        ("spec.checkpoints", spec.checkpoints),
    ):
        if volume is not None and volume.pvc is not None:
            claim = volume.pvc.claim_name
            if kube.get_pvc(spec.namespace, claim) is None:
                return Blocker(
                    "PVCNotFound",
                    f"{field}.persistentVolumeClaim.claimName: PersistentVolumeClaim {claim!r} "
                    f"not found in namespace {spec.namespace}; waiting for it",
                )
    for secret in spec.image_pull_secrets:
        if kube.get_secret(spec.namespace, secret) is None:
            return Blocker(
                "ImagePullSecretNotFound",
                f"spec.imagePullSecrets: Secret {secret!r} not found in namespace {spec.namespace}; "
                "waiting for it",
            )
    return _gpu_capacity(kube, spec)


def _gpu_capacity(kube: Kube, spec: JobSpec, fresh: bool = False) -> Blocker | None:
    """Fail a job whose workers fit on no node of the pool; a pool scaled to zero is given the benefit."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(spec.placement.node_selector.items()))
    try:
        nodes = kube.list_nodes(selector, fresh=fresh)
    except Rejected as err:
        # The parser refuses such pools and labels; this catches a CRD older than the operator, or a pool name
        # from the operator's own configuration.
        return Blocker(
            "InvalidNodeSelector",
            f"spec.placement.nodePool / spec.placement.nodeSelector: {err}",
            fatal=True,
        )
    if not nodes:
        return None
    capacities = [_gpus(n) for n in nodes]
    best = max(capacities)
    if best >= spec.gpus_per_worker:
        return None
    if not fresh:
        # The job is about to fail for good: decide on the nodes as they are now, not on a reused list.
        return _gpu_capacity(kube, spec, fresh=True)
    return Blocker(
        "InsufficientGPUsPerNode",
        f"spec.gpusPerWorker: {spec.gpus_per_worker} GPUs per worker, but the nodes matching {selector} "
        f"have at most {best} {GPU_RESOURCE}",
        fatal=True,
    )


def _gpus(node: dict[str, object]) -> int:
    status = node.get("status")
    allocatable = status.get("allocatable", {}) if isinstance(status, dict) else {}
    try:
        return int(allocatable.get(GPU_RESOURCE, 0))
    except (TypeError, ValueError):
        return 0
