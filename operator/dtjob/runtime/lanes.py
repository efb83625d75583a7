"""The controller's waiting line: unique keys in two FIFO lanes, the urgent one served first.

Urgent is what finishes work already under way (a job's worker turned Ready: its launcher may be due),
ahead of what starts new work (a new job's first reconcile): with hundreds of jobs starting at once, a job
whose last worker turned Ready would otherwise wait behind every job created after it. A key waits once;
putting a waiting key again as urgent moves it to the urgent lane (its old place is skipped when reached).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Lanes(Generic[K]):
    def __init__(self) -> None:
        self._urgent: deque[K] = deque()
        self._normal: deque[K] = deque()
        self._waiting: dict[K, bool] = {}  # waiting key -> whether in the urgent lane
        self._wakeup = asyncio.Event()

    def put(self, key: K, urgent: bool = False) -> bool:
        """Returns False when the key already waits in a lane at least as urgent (nothing changes)."""
        lane = self._waiting.get(key)
        if lane is not None and (lane or not urgent):
            return False
        self._waiting[key] = urgent
        (self._urgent if urgent else self._normal).append(key)
        self._wakeup.set()
        return True

    async def get(self) -> K:
        while True:
            key = self.take()
            if key is not None:
                return key
            self._wakeup.clear()
            await self._wakeup.wait()

    def take(self) -> K | None:
        """The next key without waiting, or None when none waits."""
        for lane, urgent in ((self._urgent, True), (self._normal, False)):
            while lane:
                key = lane.popleft()
                if self._waiting.get(key) is urgent:  # otherwise moved to the urgent lane, or taken
                    del self._waiting[key]
                    return key
        return None

    def __contains__(self, key: object) -> bool:
        return key in self._waiting

    def __len__(self) -> int:
        return len(self._waiting)
