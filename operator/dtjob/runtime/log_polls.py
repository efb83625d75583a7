"""When each log tail was last read, by (namespace, pod, container): progress polls read a launcher's log at
most once per interval however many events reconcile its job. Thread-safe (reconciles run in threads).

Each read is a pods/log call the API server hands on to the node's kubelet, outside API Priority and
Fairness, so a budget bounds them all together: with more logs polled than `reads_per_second` times the
interval allows, each log's reads are spaced further apart (a log's first read is never held back).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

Key = tuple[str, str, str]  # (namespace, pod, container)
# Past this many remembered reads, those past their interval are dropped (pods come and go).
MAX_REMEMBERED = 4096
# How often the logs polled lately are counted again for the budget's spacing.
RECOUNT_SECONDS = 1.0


class LogPolls:
    def __init__(self, clock: Callable[[], float] = time.monotonic, reads_per_second: float = 0.0) -> None:
        """`reads_per_second`: the budget of every log's reads together; 0 for none."""
        self.clock = clock
        self.reads_per_second = reads_per_second
        self._last: dict[Key, float] = {}
        self._lock = threading.Lock()
        self._budget_gap = 0.0
        self._counted_at: float | None = None

    def due(self, key: Key, every_s: float) -> bool:
        """Whether `key`'s log may be read now (and if so, that it is read now): not within `every_s` of its
        last read, nor within the budget's spacing."""
        now = self.clock()
        with self._lock:
            gap = max(every_s, self._spacing(now, every_s))
            last = self._last.get(key)
            if last is not None and now - last < gap:
                return False
            if len(self._last) > MAX_REMEMBERED:
                self._last = {k: at for k, at in self._last.items() if now - at < gap}
            self._last[key] = now
        return True

    def read_in(self, key: Key, after_s: float) -> float | None:
        """Seconds until `after_s` has passed since `key`'s log was last read (negative once it has); None if
        it was never read."""
        with self._lock:
            last = self._last.get(key)
        return None if last is None else last + after_s - self.clock()

    def interval(self, every_s: float) -> float:
        """How far apart one log's reads are now: `every_s`, or the budget's wider spacing."""
        with self._lock:
            return max(every_s, self._spacing(self.clock(), every_s))

    def _spacing(self, now: float, every_s: float) -> float:
        """The gap between one log's reads that keeps the logs read lately within the budget. A log counts
        while read within twice its period, which is the budget's spacing or, below the budget, twice the
        least gap `every_s` (the progress timer's); so one polled on its period always counts, though the
        recount come just before its next read, and one whose pod is gone stops counting. Recounted at most
        every RECOUNT_SECONDS; the lock is held."""
        if self.reads_per_second <= 0:
            return 0.0
        if self._counted_at is None or now - self._counted_at >= RECOUNT_SECONDS:
            horizon = 2 * max(2 * every_s, self._budget_gap)
            polled = sum(1 for at in self._last.values() if now - at < horizon)
            self._budget_gap = polled / self.reads_per_second
            self._counted_at = now
        return self._budget_gap
