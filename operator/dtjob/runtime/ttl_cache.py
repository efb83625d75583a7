"""A small map whose entries expire: answers the operator may reuse for a few seconds. Pure and thread-safe
(the reconciles that read it run in worker threads). With `max_entries` it also holds at most that many, the
oldest put going first, whatever keys its callers' input makes up."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    def __init__(
        self, ttl_s: float, clock: Callable[[], float] = time.monotonic, max_entries: int | None = None
    ) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._max_entries = max_entries
        self._entries: dict[K, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value put under `key` less than ttl_s ago, or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            at, value = entry
            if self._clock() - at >= self._ttl_s:
                del self._entries[key]
                return None
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            now = self._clock()
            # Drop what has expired, so keys that are never read again do not pile up.
            self._entries = {k: e for k, e in self._entries.items() if now - e[0] < self._ttl_s and k != key}
            self._entries[key] = (now, value)  # last in the map: the newest put
            if self._max_entries is not None:
                for old in list(self._entries)[: max(0, len(self._entries) - self._max_entries)]:
                    del self._entries[old]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __iter__(self) -> Iterator[K]:
        with self._lock:
            return iter(list(self._entries))
