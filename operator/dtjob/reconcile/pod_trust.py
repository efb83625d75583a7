"""Whether pods about to be created may name what they name (dtjob.desired.pod_trust's rule), with each
Secret they name besides the job's own read fresh from the API server, never from a cache: one created or
labelled a moment ago counts. A GET per such Secret per create, and templates rarely name one: the common
path reads nothing. Pods that mount an NFS share read their Namespace too, for its list of shares
(dtjob.spec.nfs_shares), fresh for the same reason."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dtjob.config import OperatorConfig
from dtjob.desired.pod_shares import mounted_shares, mounts_a_share
from dtjob.desired.pod_trust import NFS_SHARE_NOT_ALLOWED, Untrusted, judge, to_read
from dtjob.kube.client import Kube
from dtjob.kube.errors import Forbidden
from dtjob.spec.nfs_shares import ANNOTATION_NFS_SHARES, NfsShares, namespace_shares
from dtjob.spec.parse import JobSpec
from dtjob.state.status import NFS_SHARES_UNREADABLE


def untrusted(
    kube: Kube, config: OperatorConfig, spec: JobSpec, uid: str, objects: Sequence[Mapping[str, Any]]
) -> Untrusted | None:
    """Why `objects` (Pods, batch Jobs of the job `uid`) may not be created, or None."""
    secrets = {name: kube.get("Secret", spec.namespace, name) for name in to_read(spec, objects)}

    def verdict(shares: NfsShares) -> Untrusted | None:
        return judge(
            spec, uid, objects, secrets, config.operator_namespace, config.operator_service_account, shares
        )

    if not mounts_a_share(objects):
        return verdict(config.nfs_shares)
    try:
        return verdict(_shares(kube, config, spec.namespace))
    except Forbidden as refused:
        # What fails the job whatever the Namespace says still does; otherwise it waits for the list.
        first = verdict(config.nfs_shares)
        if first is not None and first.fatal and first.reason != NFS_SHARE_NOT_ALLOWED:
            return first
        field = next(m.field for obj in objects for m in mounted_shares(spec, obj))
        return Untrusted(NFS_SHARES_UNREADABLE, field, _unreadable(spec.namespace, refused), fatal=False)


def _shares(kube: Kube, config: OperatorConfig, namespace: str) -> NfsShares:
    meta = (kube.get("Namespace", None, namespace) or {}).get("metadata") or {}
    return namespace_shares(config.nfs_shares, namespace, meta.get("annotations") or {})


def _unreadable(namespace: str, refused: Forbidden) -> str:
    return (
        f"a pod mounts an NFS share, and the operator may not read Namespace {namespace} for its "
        f"{ANNOTATION_NFS_SHARES} ({refused}): grant it get on namespaces (the chart does); waiting"
    )
