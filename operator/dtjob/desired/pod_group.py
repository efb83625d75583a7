"""The PodGroup of a gang-scheduled world (runPolicy.scheduling.gang), in its scheduler's own API. Pure.

minMember counts the workers, not the launcher: the launcher is created only once every worker is Ready, so
when the scheduler places the gang the workers are the only pods of the world that exist. A group that
counted the launcher would wait for a pod that cannot exist before the group is placed. The launcher still
joins the group (and its scheduler): the group is complete by then, so it is placed on its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from dtjob import names
from dtjob.desired.common import Json, metadata
from dtjob.desired.gang import COSCHEDULING, POD_GROUP_KIND, VOLCANO, gang_scheduler
from dtjob.spec.parse import JobSpec

# A quantity: a decimal number, then a suffix (Ki.., n..E, or an exponent e3).
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$")


def pod_group(spec: JobSpec, owner: Json, worker: Mapping[str, Any]) -> Json:
    """The job's PodGroup, sized to its workers; `worker` is one worker pod as built (its requests, times the
    workers, are the group's minResources)."""
    gang = spec.run_policy.scheduling.gang
    scheduler = gang_scheduler(spec)
    assert gang is not None and scheduler is not None, "only for a job with runPolicy.scheduling.gang"
    group_spec: Json = {"minMember": spec.workers}
    if gang.scheduler == COSCHEDULING:
        # How long placed workers wait at Permit for the rest of the gang before all are let go again.
        group_spec["scheduleTimeoutSeconds"] = gang.schedule_timeout_seconds
        # No minResources: coscheduling checks it in PreFilter as unresolvable, and v0.34 retries such a pod
        # only when a pod is added or a PodGroup changes (or at the scheduler's flush of unschedulable pods,
        # 5 minutes by default), not when GPUs are freed. Without it the worker that does not fit fails Filter
        # on its GPUs, which a deleted pod or an added node retries at once.
    if gang.scheduler == VOLCANO:
        # Volcano admits a group into its queue only when the queue has room for minResources.
        group_spec["minResources"] = min_resources(worker, spec.workers)
        if gang.queue is not None:
            group_spec["queue"] = gang.queue
    name = names.pod_group_name(spec.name)
    return {
        "apiVersion": scheduler.api_version,
        "kind": POD_GROUP_KIND,
        "metadata": metadata(name, spec.namespace, names.labels(spec.name, "pod-group"), owner),
        "spec": group_spec,
    }


def min_resources(pod: Mapping[str, Any], count: int) -> dict[str, str]:
    """What `count` copies of `pod` request: its containers' requests (a limit stands in for a missing
    request, as the API server defaults it), summed, times `count`; init containers, which run before them,
    are left out. Quantities keep their suffix when every container uses the same one (16Gi x 4 = 64Gi),
    else are summed in base units."""
    found: dict[str, list[tuple[Decimal, str]]] = {}
    for container in (pod.get("spec") or {}).get("containers") or ():
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for resource, quantity in wanted.items():
            found.setdefault(resource, []).append(_parse(str(quantity)))
    total: dict[str, str] = {}
    for resource, parts in sorted(found.items()):
        suffixes = {suffix for _, suffix in parts}
        if len(suffixes) == 1:
            total[resource] = _format(sum((n for n, _ in parts), Decimal(0)) * count) + suffixes.pop()
        else:
            total[resource] = _format(sum((n * _UNITS[suffix] for n, suffix in parts), Decimal(0)) * count)
    return total


_UNITS = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal("1e3"),
    "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"),
    "E": Decimal("1e18"), "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
    "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip


def _parse(quantity: str) -> tuple[Decimal, str]:
    """(number, suffix) of a quantity; an exponent is folded into the number."""
    match = _QUANTITY.match(quantity.strip())
    if match is None:
        raise ValueError(f"{quantity!r} is not a quantity")
    number, suffix = Decimal(match[1]), match[2] or ""
    if suffix[:1] in ("e", "E"):
        return number.scaleb(int(suffix[1:])), ""
    return number, suffix


def _format(number: Decimal) -> str:
    return format(number.normalize(), "f")
