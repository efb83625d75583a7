"""Polling with a deadline: integration tests sync on observed state, never on fixed sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | None], *, timeout: float = 30.0, interval: float = 0.25, what: str = ""
) -> T:
    """Return the first truthy value of predicate(); fail naming `what` and the last value after timeout."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what or predicate!r}; last value: {last!r}"
            )
        time.sleep(interval)
