"""The leader election loop: a round every few seconds reads the Lease, decides (dtjob.runtime.lease) and
writes.

The leader renews every `renew_interval_s`; the others read every `retry_period_s` and take over once the
Lease has not changed for a whole lease duration, or at once when it was released. Each takeover posts one
Event on the Lease, naming the new holder and the one before, so `kubectl get events` shows every handover.
A round's Kubernetes calls run on this loop's own thread, one at a time: a release at shutdown waits for a
round still under way instead of racing it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from dtjob.config import ElectionTimings
from dtjob.kube.errors import Conflict
from dtjob.runtime.lease import (
    Leadership,
    LeaseRecord,
    Sighting,
    Verdict,
    claim,
    decide,
    lease_spec,
    record_of,
    release,
    renewal,
)

log = logging.getLogger(__name__)
Json = dict[str, Any]
ELECTED_REASON = "LeaderElected"


class Leases(Protocol):
    """The Lease as the loop uses it (dtjob.kube.leases.LeaseClient against the API server)."""

    namespace: str
    name: str

    def read(self) -> Json | None: ...
    def create(self, spec: Json) -> Json | None: ...
    def replace(self, spec: Json, resource_version: str) -> Json: ...
    def announce(
        self, lease: Mapping[str, Any], reason: str, message: str, now: datetime, instance: str
    ) -> None: ...


@dataclass(frozen=True)
class ElectionStatus:
    identity: str
    leading: bool
    holder: str  # the holder as last read ("" if none or never read)
    lease: str  # namespace/name
    read_age_s: float | None  # seconds since the Lease was last read successfully
    fresh: bool  # read within a lease duration: a standby that knows who leads

    def to_dict(self) -> Json:
        age = None if self.read_age_s is None else round(self.read_age_s, 1)
        return {"identity": self.identity, "leader": self.leading, "holder": self.holder,
                "lease": self.lease, "leaseReadSecondsAgo": age}  # fmt: skip


class Elector:
    def __init__(
        self,
        leases: Leases,
        timings: ElectionTimings,
        leadership: Leadership,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.leases = leases
        self.timings = timings
        self.leadership = leadership
        self.me = leadership.identity
        self.holder = ""
        self._clock = clock
        self._wall = wall
        self._sighting: Sighting | None = None
        self._read_at: float | None = None
        self._said_leading = False
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="election")

    @property
    def where(self) -> str:
        return f"{self.leases.namespace}/{self.leases.name}"

    def status(self) -> ElectionStatus:
        age = None if self._read_at is None else self._clock() - self._read_at
        fresh = age is not None and age < self.timings.lease_duration_s
        return ElectionStatus(self.me, self.leadership.leading(), self.holder, self.where, age, fresh)

    # --- one round -----------------------------------------------------------------------------------

    def round(self) -> tuple[float, bool]:
        """Read, decide, write. Returns the seconds until the next round and whether this replica has just
        become the leader (so its caller requeues every job)."""
        if self._said_leading and not self.leadership.leading():
            log.warning("stepped down: no renewal of the Lease %s accepted for %.0f s; this replica (%s) "
                        "writes nothing until it holds the Lease again", self.where,
                        self.timings.renew_deadline_s, self.me)  # fmt: skip
            self._said_leading = False
        retry = self.timings.retry_period_s
        try:
            found = self.leases.read()
        except Exception as err:  # the API server is unreachable, say: try again, leading or not
            log.warning("could not read the Lease %s: %s", self.where, _short(err))
            return retry, False
        self._read_at = self._clock()
        record = record_of(found) if found is not None else None
        verdict, self._sighting = decide(
            record, self._sighting, self._read_at, self.me, self.timings.lease_duration_s
        )
        if verdict is Verdict.STANDBY:
            assert record is not None
            self.leadership.step_down()  # a no-op unless another replica wrote itself in while we held it
            self._note_holder(record.holder)
            return retry, False
        return self._write(record, verdict)

    def _write(self, record: LeaseRecord | None, verdict: Verdict) -> tuple[float, bool]:
        now = self._wall()
        duration = round(self.timings.lease_duration_s)
        wanted = (
            renewal(record, now, duration)
            if verdict is Verdict.RENEW and record is not None
            else claim(record, self.me, now, duration)
        )
        sent = self._clock()
        try:
            if record is None:
                written = self.leases.create(lease_spec(wanted))
            else:
                written = self.leases.replace(lease_spec(wanted), record.version)
        except Conflict:
            written = None  # another replica wrote first: the next read says who
        except Exception as err:
            log.warning("could not %s the Lease %s: %s", verdict.value, self.where, _short(err))
            return self.timings.retry_period_s, False
        if written is None:
            return self.timings.retry_period_s, False
        was_leading = self.leadership.leading()
        self.leadership.renewed(sent)
        self._sighting = Sighting(str(written["metadata"]["resourceVersion"]), self._clock())
        # A released Lease names nobody: the holder this replica saw last is the one that released it.
        previous = (record.holder or self.holder) if record is not None else ""
        self.holder = self.me
        if previous != self.me:
            how = "its lease expired" if verdict is Verdict.EXPIRED else "released" if record else "new lease"
            message = f"{self.me} is the leader now (previous holder: {previous or 'none'}, {how})"
            log.info("leading: %s; the Lease %s", message, self.where)
            self.leases.announce(written, ELECTED_REASON, message, now, self.me)
        elif not was_leading:
            log.info("leading again: renewed the Lease %s, which still names this replica (%s)", self.where,
                     self.me)  # fmt: skip
        self._said_leading = True
        return self.timings.renew_interval_s, not was_leading

    def _note_holder(self, holder: str) -> None:
        if holder != self.holder:
            log.info("standing by: %s leads (the Lease %s); this replica is %s", holder, self.where, self.me)
            self.holder = holder

    # --- running -------------------------------------------------------------------------------------

    async def run(self, on_elected: Callable[[], None]) -> None:
        """Rounds until cancelled; `on_elected` runs on the event loop each time this replica becomes the
        leader."""
        loop = asyncio.get_running_loop()
        log.info("leader election: this replica is %s; the Lease %s (lease %g s, renew deadline %g s, retry "
                 "%g s)", self.me, self.where, self.timings.lease_duration_s, self.timings.renew_deadline_s,
                 self.timings.retry_period_s)  # fmt: skip
        while True:
            try:
                delay, elected = await loop.run_in_executor(self._thread, self.round)
            except Exception:  # a bug or an unexpected answer: the loop must go on, or the lease lapses
                log.exception("leader election round failed")
                delay, elected = self.timings.retry_period_s, False
            if elected:
                on_elected()
            await asyncio.sleep(delay)

    def resign(self) -> None:
        """Stop writing at once, for good (shutting down): nothing brings the leadership back."""
        self.leadership.step_down(for_good=True)

    async def release(self) -> None:
        """Clear the holder if the Lease still names this replica, so that the next replica to look takes it
        at once instead of waiting a whole lease duration. After any round still under way."""
        self.resign()
        await asyncio.get_running_loop().run_in_executor(self._thread, self._release)
        self._thread.shutdown(wait=False)

    def _release(self) -> None:
        try:
            found = self.leases.read()
            record = record_of(found) if found is not None else None
            if record is None or record.holder != self.me:
                return
            self.leases.replace(lease_spec(release(record, self._wall())), record.version)
        except Exception as err:  # the others take over when it expires
            log.warning("could not release the Lease %s: %s", self.where, _short(err))
            return
        self.holder = ""
        log.info("released the Lease %s: another replica takes over at its next look", self.where)


def _short(err: Exception) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"[:300]
