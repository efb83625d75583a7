"""Waiting for a job: until it reaches one of some phases, or a condition of the caller's holds, reporting
each change of its status on the way. Pure: the reads, the clock and the sleep are the caller's."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from dtjob.client.errors import WaitTimeout
from dtjob.client.status import FINISHED_PHASES, JobStatus

Until = str | Collection[str] | Callable[[JobStatus], bool]


def done_when(until: Until) -> Callable[[JobStatus], bool]:
    """A predicate from `until`: a phase, several phases, or a predicate itself."""
    if callable(until):
        return until
    phases = frozenset((until,) if isinstance(until, str) else until)
    if not phases:
        raise ValueError("until names no phase")
    return lambda status: status.phase in phases


@dataclass
class Waiter:
    read: Callable[[], JobStatus]
    sleep: Callable[[float], None]
    clock: Callable[[], float]  # monotonic seconds
    interval_s: float = 2.0

    def wait(
        self,
        until: Until = FINISHED_PHASES,
        timeout: float | None = None,
        on_change: Callable[[JobStatus], None] | None = None,
    ) -> JobStatus:
        """The first status for which `until` holds; `on_change` sees the first status and each that differs
        from the one before. WaitTimeout (carrying the last status) once `timeout` seconds have passed."""
        done = done_when(until)
        deadline = None if timeout is None else self.clock() + timeout
        last: JobStatus | None = None
        while True:
            status = self.read()
            if on_change is not None and status != last:
                on_change(status)
            last = status
            if done(status):
                return status
            left = None if deadline is None else deadline - self.clock()
            if left is not None and left <= 0:
                raise WaitTimeout(status, timeout or 0.0)
            self.sleep(self.interval_s if left is None else min(self.interval_s, left))
