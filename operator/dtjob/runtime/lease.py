"""Leader election over a coordination.k8s.io/v1 Lease: the rules, without I/O.

Every replica runs kopf and keeps its watch caches warm; only the one holding the Lease writes. A round of
the election loop (dtjob.runtime.election) reads the Lease, asks decide() what to do, and writes what claim(),
renewal() or release() return, guarded by the resourceVersion it read, so that of two replicas racing for
the same Lease exactly one wins.

Expiry is judged as client-go judges it: by this process's own monotonic clock, from the moment it first saw
the current version of the Lease, never from the timestamps written in it (the nodes' clocks may disagree).
A leader holds its right to write only until `renew_deadline` after the last renewal it sent that was
accepted (Leadership); the others take over no sooner than `lease_duration` after they saw that renewal. The
difference (5 s by default) is the margin by which a leader that can no longer renew has stopped writing
before anyone else starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from dtjob.fence import NotLeader
from dtjob.timefmt import format_micro_time, parse_time

Json = dict[str, Any]
RELEASED_DURATION_S = 1  # what a released Lease declares, as client-go writes it


@dataclass(frozen=True)
class LeaseRecord:
    """The spec of the Lease as read, with the resourceVersion it was read at ("" before it exists)."""

    holder: str  # "" when nobody holds it (released, or never held)
    duration_s: int
    acquired: datetime | None = None
    renewed: datetime | None = None
    transitions: int = 0
    version: str = ""


def record_of(lease: Mapping[str, Any]) -> LeaseRecord:
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_s=int(spec.get("leaseDurationSeconds") or 0),
        acquired=_time(spec.get("acquireTime")),
        renewed=_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
    )


def lease_spec(record: LeaseRecord) -> Json:
    """The Lease's spec to write (holderIdentity left out when nobody holds it)."""
    spec: Json = {"leaseDurationSeconds": record.duration_s, "leaseTransitions": record.transitions}
    if record.holder:
        spec["holderIdentity"] = record.holder
    if record.acquired is not None:
        spec["acquireTime"] = format_micro_time(record.acquired)
    if record.renewed is not None:
        spec["renewTime"] = format_micro_time(record.renewed)
    return spec


def _time(value: Any) -> datetime | None:
    try:
        return parse_time(str(value)) if value else None
    except ValueError:
        return None


class Verdict(StrEnum):
    ACQUIRE = "acquire"  # no Lease yet, or nobody holds it (released): take it now
    EXPIRED = "expired"  # its holder stopped renewing it for a whole lease duration: take it over
    RENEW = "renew"  # ours: renew it
    STANDBY = "standby"  # another replica holds it and keeps renewing it


@dataclass(frozen=True)
class Sighting:
    """The version of the Lease last seen, and when it was first seen (monotonic seconds, this process)."""

    version: str
    at: float


def decide(
    lease: LeaseRecord | None, last: Sighting | None, now: float, me: str, duration_s: float
) -> tuple[Verdict, Sighting | None]:
    """What to do with the Lease as just read, and the sighting to remember for the next round.
    `duration_s` stands in for a lease that declares no duration of its own."""
    if lease is None:
        return Verdict.ACQUIRE, None
    seen = last if last is not None and last.version == lease.version else Sighting(lease.version, now)
    if lease.holder == me:
        return Verdict.RENEW, seen
    if not lease.holder:
        return Verdict.ACQUIRE, seen
    if now - seen.at >= (lease.duration_s or duration_s):
        return Verdict.EXPIRED, seen
    return Verdict.STANDBY, seen


def claim(lease: LeaseRecord | None, me: str, now: datetime, duration_s: int) -> LeaseRecord:
    """The record that makes `me` the holder (a new holder counts one more transition)."""
    if lease is None:
        return LeaseRecord(me, duration_s, now, now, 0)
    if lease.holder == me:
        return renewal(lease, now, duration_s)
    return replace(
        lease, holder=me, duration_s=duration_s, acquired=now, renewed=now, transitions=lease.transitions + 1
    )


def renewal(lease: LeaseRecord, now: datetime, duration_s: int) -> LeaseRecord:
    return replace(lease, duration_s=duration_s, renewed=now, acquired=lease.acquired or now)


def release(lease: LeaseRecord, now: datetime) -> LeaseRecord:
    """Nobody holds it: the next replica to look takes it at once instead of waiting for it to expire."""
    return replace(lease, holder="", duration_s=RELEASED_DURATION_S, renewed=now)


class Leadership:
    """This replica's right to write: held until `renew_deadline_s` after the last accepted renewal was sent,
    and lost by itself when that passes, whether or not the election loop is still running (a paused
    process, a hung API call). Thread-safe: reconciles check it from their worker threads before every
    write."""

    def __init__(self, identity: str, renew_deadline_s: float, clock: Callable[[], float] = time.monotonic):
        self.identity = identity
        self.renew_deadline_s = renew_deadline_s
        self._clock = clock
        self._until: float | None = None
        self._resigned = False
        self._lock = threading.Lock()

    def renewed(self, sent_at: float) -> None:
        """A write of the Lease sent at `sent_at` (monotonic) naming this replica was accepted."""
        with self._lock:
            if not self._resigned:
                self._until = sent_at + self.renew_deadline_s

    def step_down(self, for_good: bool = False) -> None:
        """Stop writing now; `for_good` (shutting down): a renewal still in flight cannot bring it back."""
        with self._lock:
            self._until = None
            self._resigned = self._resigned or for_good

    def leading(self) -> bool:
        with self._lock:
            return self._until is not None and self._clock() < self._until

    def check(self) -> None:
        self.remaining_s()

    def remaining_s(self) -> float:
        """Seconds until this replica's hold runs out (a write must have ended by then); NotLeader when it
        holds none."""
        with self._lock:
            left = None if self._until is None else self._until - self._clock()
        if left is None or left <= 0:
            raise NotLeader(f"{self.identity} does not hold the leader lease")
        return left
