"""What a scheduler that places a world's pods together implements, and the few values it speaks in. Pure.

A scheduler is one object of a class here (one module each: coscheduling, volcano, kueue); the registry
(dtjob.gang.registry) says which of them a job's spec asks for. The layers above never branch on a
scheduler's name: they ask the scheduler for its pods' schedulerName, labels and annotations, the spec of
the PodGroup it needs (or none), the job's GangScheduled condition and what to say when the cluster does not
serve its API.

The state machine's own types live above this package, so a scheduler reads pods and conditions through the
read-only views below (PodState and Condition fit them) and answers with a GangReport the state machine
writes into the job's status.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Protocol

from dtjob.gang.pool_room import PoolRoom
from dtjob.spec.parse import JobSpec

Json = Mapping[str, Any]


class PodView(Protocol):
    """A pod of the world as the observer reduced it (dtjob.state.observed.PodState)."""

    @property
    def name(self) -> str: ...
    @property
    def index(self) -> int | None: ...
    @property
    def scheduled(self) -> bool: ...  # bound to a node (PodScheduled True)
    @property
    def created(self) -> datetime | None: ...
    @property
    def reason(self) -> str | None: ...  # why it waits, e.g. the scheduler's Unschedulable verdict


class ConditionView(Protocol):
    """One condition of the job's status (dtjob.state.status.Condition)."""

    @property
    def status(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def message(self) -> str: ...


@dataclass(frozen=True)
class GangReport:
    """What the job's GangScheduled condition says now, and what else goes with it."""

    placed: bool  # the condition's status
    reason: str
    message: str
    event: tuple[str, str] | None = None  # (type, message) of an event with the condition's reason
    requeue_s: float | None = None  # look again then (the schedule timeout)
    job_message: bool = False  # the job's own message says it too


class GangScheduler(ABC):
    """A scheduler the operator hands a world to. The defaults describe one that asks nothing of the pods."""

    name: ClassVar[str]  # as the spec names it (the registry's key)
    # The pods' schedulerName unless runPolicy.scheduling.schedulerName says otherwise; None: the cluster's.
    scheduler_name: ClassVar[str | None] = None
    # The apiVersion of the PodGroup it places the world by; None: it needs none from the operator.
    pod_group_api: ClassVar[str | None] = None
    # What a cluster lacking that API should install, for the job's condition.
    installed_by: ClassVar[str] = ""
    # It places the world by runPolicy.scheduling.topology itself (from its pods' annotations), so the
    # workers need no pod affinity for it.
    places_by_topology: ClassVar[bool] = False

    def pod_labels(self, spec: JobSpec, role: str) -> dict[str, str]:
        """The labels that tie a pod of `role` (worker, launcher) to the job's group."""
        return {}

    def pod_annotations(self, spec: JobSpec, role: str) -> dict[str, str]:
        """The annotations that tie a pod of `role` to the job's group."""
        return {}

    def pod_group_spec(self, spec: JobSpec, worker: Json) -> dict[str, Any] | None:
        """The spec of the job's PodGroup (`worker` is one worker pod as built), or None without one."""
        return None

    def gang_scheduled(
        self,
        spec: JobSpec,
        workers: Mapping[int, PodView],
        size: int,
        prev: ConditionView | None,
        room: PoolRoom | None,
        now: datetime,
    ) -> GangReport | None:
        """The job's GangScheduled condition for the current world's `workers` (by index, `size` wanted),
        given the condition as it stood (`prev`) and the pool's free GPUs (read only past the timeout). None:
        nothing to say now."""
        return None

    def api_not_served(self, spec: JobSpec, api: str) -> str:
        """What the job says while the cluster does not serve its PodGroup `api`."""
        return (
            f"spec.runPolicy.scheduling.gang.scheduler {self.name}: the cluster does not serve {api}; "
            f"install {self.installed_by} (its PodGroup CRD and scheduler)"
        )
