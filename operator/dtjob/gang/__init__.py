"""Gang scheduling: how a world's pods are placed all at once by its scheduler (Kueue, coscheduling,
Volcano). One module per scheduler behind one interface (base.GangScheduler); the registry says which of
them a job's spec asks for. Pure."""

from dtjob.gang.base import ConditionView, GangReport, GangScheduler, PodView
from dtjob.gang.placement import domain_wait, wants_pool_room
from dtjob.gang.pool_room import PoolRoom, pool_room
from dtjob.gang.registry import (
    gang_scheduler,
    pod_annotations,
    pod_group_api,
    pod_labels,
    scheduler_name,
    schedulers,
    topology_by_affinity,
)

__all__ = [
    "ConditionView",
    "GangReport",
    "GangScheduler",
    "PodView",
    "PoolRoom",
    "domain_wait",
    "gang_scheduler",
    "pod_annotations",
    "pod_group_api",
    "pod_labels",
    "pool_room",
    "scheduler_name",
    "schedulers",
    "topology_by_affinity",
    "wants_pool_room",
]
