"""Which schedulers a job's world joins, by the names its spec gives them, and what they ask of its pods
together. Pure.

runPolicy.scheduling.gang.scheduler names at most one gang scheduler, the one that places the world (its
PodGroup); runPolicy.scheduling.queueName adds Kueue, which admits it. A new scheduler is one module in this
package and one line in GANG_SCHEDULERS below (and its name in the spec's list of accepted names).
"""

from __future__ import annotations

from dtjob.gang import kueue
from dtjob.gang.base import GangScheduler
from dtjob.gang.coscheduling import POD_GROUP_LABEL, Coscheduling
from dtjob.gang.kueue import Kueue
from dtjob.gang.volcano import Volcano
from dtjob.spec.parse import JobSpec

# The gang schedulers, by runPolicy.scheduling.gang.scheduler.
GANG_SCHEDULERS: dict[str, GangScheduler] = {s.name: s for s in (Coscheduling(), Volcano())}
KUEUE = Kueue()


def gang_scheduler(spec: JobSpec) -> GangScheduler | None:
    """The scheduler runPolicy.scheduling.gang names, or None without a gang."""
    gang = spec.run_policy.scheduling.gang
    return GANG_SCHEDULERS[gang.scheduler] if gang is not None else None


def schedulers(spec: JobSpec) -> tuple[GangScheduler, ...]:
    """Every scheduler the world joins: Kueue for a job on a queue, then its gang scheduler."""
    found = gang_scheduler(spec)
    queued = (KUEUE,) if spec.run_policy.scheduling.queue_name else ()
    return (*queued, *((found,) if found is not None else ()))


def scheduler_name(spec: JobSpec) -> str | None:
    """The world's schedulerName: the spec's, else its schedulers', else the cluster's default."""
    own = spec.run_policy.scheduling.scheduler_name
    return own or next((s.scheduler_name for s in schedulers(spec) if s.scheduler_name), None)


def pod_labels(spec: JobSpec, role: str) -> dict[str, str]:
    """The labels a pod of `role` carries for its schedulers (and for a PodGroup of the user's own)."""
    labels = kueue.world_labels(spec, role)
    if spec.run_policy.scheduling.pod_group:
        # runPolicy.scheduling.podGroup: a coscheduling PodGroup the user made, which the pods join.
        labels[POD_GROUP_LABEL] = spec.run_policy.scheduling.pod_group
    for scheduler in schedulers(spec):
        labels.update(scheduler.pod_labels(spec, role))
    return labels


def pod_annotations(spec: JobSpec, role: str) -> dict[str, str]:
    """The annotations a pod of `role` carries for its schedulers."""
    annotations = kueue.world_annotations(spec)
    for scheduler in schedulers(spec):
        annotations.update(scheduler.pod_annotations(spec, role))
    return annotations


def topology_by_affinity(spec: JobSpec) -> bool:
    """Whether runPolicy.scheduling.topology is the workers' pod affinity: it is, unless a scheduler of
    the world places by topology itself (Kueue, from its annotations)."""
    if spec.run_policy.scheduling.topology is None:
        return False
    return not any(s.places_by_topology for s in schedulers(spec))


def pod_group_api(spec: JobSpec) -> str | None:
    """The apiVersion of the PodGroup the operator keeps for the job's world, or None when it keeps none."""
    found = gang_scheduler(spec)
    return found.pod_group_api if found is not None else None
