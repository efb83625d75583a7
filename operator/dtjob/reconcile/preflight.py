"""Checks only the operator can make before creating anything: referenced objects exist, what the pods would
name is the job's to hand out, a worker fits a node.

Returns a Blocker (the job waits in Pending, or fails when it can never run) instead of creating a half world.
The GPU check looks only at the job's own pool: the nodes its workers may land on (its nodeSelector, the
required terms of its node affinity, the taints it tolerates), so that its message tells nothing of another
tenant's pools (their labels, sizes or GPU counts).
"""

from __future__ import annotations

from dtjob import desired
from dtjob.config import OperatorConfig
from dtjob.desired.common import owner_reference
from dtjob.desired.pods import GPU_RESOURCE, worker_scheduling
from dtjob.gang.node_affinity import Unmatched, required_terms
from dtjob.gang.pool_nodes import describe_pool, in_pool
from dtjob.kube.client import Kube, Rejected
from dtjob.reconcile import pod_trust
from dtjob.reconcile.reads import list_nodes
from dtjob.spec.parse import JobSpec
from dtjob.state.observed import Blocker


def preflight(
    kube: Kube, spec: JobSpec, uid: str = "", config: OperatorConfig | None = None
) -> Blocker | None:
    """`config`: the operator's (None: its namespace and ServiceAccount are unknown, as outside a pod)."""
    for field, volume in (
        ("spec.dataset.volume", spec.dataset.volume),
        ("spec.checkpoints", spec.checkpoints),
    ):
        if volume is not None and volume.pvc is not None:
            claim = volume.pvc.claim_name
            if kube.get("PersistentVolumeClaim", spec.namespace, claim) is None:
                return Blocker(
                    "PVCNotFound",
                    f"{field}.persistentVolumeClaim.claimName: PersistentVolumeClaim {claim!r} "
                    f"not found in namespace {spec.namespace}; waiting for it",
                )
    for secret in spec.every_pull_secret:
        if kube.get("Secret", spec.namespace, secret) is None:
            named = (
                "spec.imagePullSecrets"
                if secret in spec.image_pull_secrets
                else "the operator's image pull Secrets (DTJOB_IMAGE_PULL_SECRETS, chart jobImagePullSecrets)"
            )
            return Blocker(
                "ImagePullSecretNotFound",
                f"{named}: Secret {secret!r} not found in namespace {spec.namespace}; waiting for it",
            )
    return _untrusted(kube, config or OperatorConfig(), spec, uid) or _gpu_capacity(kube, spec)


def _untrusted(kube: Kube, config: OperatorConfig, spec: JobSpec, uid: str) -> Blocker | None:
    """The first world's pods as they would be built now, judged before anything exists
    (dtjob.reconcile.pod_trust; every create is judged again, as the spec is then)."""
    owner = owner_reference(spec.name, uid)
    pods = [desired.worker_pod(spec, owner, 0, 0), desired.launcher_pod(spec, owner, 0)]
    verdict = pod_trust.untrusted(kube, config, spec, uid, pods)
    if verdict is None:
        return None
    return Blocker(verdict.reason, f"{verdict.field}: {verdict.message}", fatal=verdict.fatal)


def _gpu_capacity(kube: Kube, spec: JobSpec, fresh: bool = False) -> Blocker | None:
    """Fail a job whose workers fit on no node of the pool; a pool scaled to zero is given the benefit, and
    so is a job whose node affinity is too large to match here (the scheduler judges it)."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(spec.placement.node_selector.items()))
    try:
        nodes = list_nodes(kube, selector, fresh=fresh)
    except Rejected as err:
        # The parser refuses such pools and labels; this catches a CRD older than the operator, or a pool name
        # from the operator's own configuration.
        return Blocker(
            "InvalidNodeSelector",
            f"spec.placement.nodePool / spec.placement.nodeSelector: {err}",
            fatal=True,
        )
    tolerations, affinity = worker_scheduling(spec)
    try:
        terms = required_terms(affinity)
    except Unmatched:
        return None
    # The common case ends at the first node that holds a worker, before the pool's other nodes are checked.
    if any(_gpus(n) >= spec.gpus_per_worker and in_pool(n, tolerations, terms) for n in nodes):
        return None
    nodes = [n for n in nodes if in_pool(n, tolerations, terms)]
    if not nodes:
        return None
    best = max(_gpus(n) for n in nodes)
    if not fresh:
        # The job is about to fail for good: decide on the nodes as they are now, not on a reused list.
        return _gpu_capacity(kube, spec, fresh=True)
    pool = describe_pool(spec.placement.node_selector, terms) or "every node its tolerations allow"
    return Blocker(
        "InsufficientGPUsPerNode",
        f"spec.gpusPerWorker: {spec.gpus_per_worker} GPUs per worker, but the nodes of this job's pool "
        f"({pool}) have at most {best} {GPU_RESOURCE}",
        fatal=True,
    )


def _gpus(node: dict[str, object]) -> int:
    status = node.get("status")
    allocatable = status.get("allocatable", {}) if isinstance(status, dict) else {}
    try:
        return int(allocatable.get(GPU_RESOURCE, 0))
    except (TypeError, ValueError):
        return 0
