"""The write fence: with leader election, every write (to the API server or to Blob Storage) asks first
whether this replica still leads, and an API server write, retries included, must end before its hold on the
Lease does. dtjob.runtime.lease's Leadership answers; a single replica or a command-line tool is Unfenced.
"""

from __future__ import annotations

import math
from typing import Protocol


class NotLeader(Exception):
    """This replica does not hold the leader Lease (or its hold ran out): it must not write anything."""


class Fence(Protocol):
    """Whether this process may write now; check() raises NotLeader when it may not, and remaining_s() says
    for how many more seconds it may (raising NotLeader when for none)."""

    def leading(self) -> bool: ...
    def check(self) -> None: ...
    def remaining_s(self) -> float: ...


class Unfenced:
    """Without leader election (one replica, or a command-line tool): always allowed."""

    def leading(self) -> bool:
        return True

    def check(self) -> None:
        return None

    def remaining_s(self) -> float:
        return math.inf
