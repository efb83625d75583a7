"""When each log tail was last read, by (namespace, pod, container): progress polls read a launcher's log at
most once per interval however many events reconcile its job. Thread-safe (reconciles run in threads)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

Key = tuple[str, str, str]  # (namespace, pod, container)
# Past this many remembered reads, those past their interval are dropped (pods come and go).
MAX_REMEMBERED = 4096


class LogPolls:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last: dict[Key, float] = {}
        self._lock = threading.Lock()

    def due(self, key: Key, every_s: float) -> bool:
        """Whether `key`'s log may be read now (and if so, that it is read now)."""
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < every_s:
                return False
            if len(self._last) > MAX_REMEMBERED:
                self._last = {k: at for k, at in self._last.items() if now - at < every_s}
            self._last[key] = now
        return True
