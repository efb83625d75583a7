"""What the PodGroup schedulers (coscheduling, Volcano) share: the PodGroup is named after the job, counts the
workers, and GangScheduled is read from the pods. Pure.

minMember counts the workers, not the launcher: the launcher is created only once every worker is Ready, so
when the scheduler places the gang the workers are the only pods of the world that exist. A group that
counted the launcher would wait for a pod that cannot exist before the group is placed. The launcher still
joins the group (and its scheduler): the group is complete by then, so it is placed on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from dtjob import names
from dtjob.gang import placement
from dtjob.gang.base import ConditionView, GangReport, GangScheduler, PodView
from dtjob.gang.pool_room import PoolRoom
from dtjob.spec.parse import JobSpec

POD_GROUP_KIND = "PodGroup"


class PodGroupScheduler(GangScheduler):
    """A scheduler that places a world by a PodGroup the operator creates for it."""

    def gang_scheduled(
        self,
        spec: JobSpec,
        workers: Mapping[int, PodView],
        size: int,
        prev: ConditionView | None,
        room: PoolRoom | None,
        now: datetime,
    ) -> GangReport | None:
        scheduler = (
            spec.run_policy.scheduling.scheduler_name or self.scheduler_name or "the default scheduler"
        )
        return placement.report(spec, scheduler, workers, size, prev, room, now)


def group_name(spec: JobSpec) -> str:
    return names.pod_group_name(spec.name)
