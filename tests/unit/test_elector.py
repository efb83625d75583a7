"""The election loop's rounds (dtjob.runtime.election) between replicas sharing one Lease, on a clock the test
moves.

The Lease lives in an in-memory store that answers as the API server does where the election depends on it:
a create of an existing Lease is refused, a replace under a stale resourceVersion is a Conflict, every write
moves the resourceVersion on. The integration tests run the same loop against a real API server.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dtjob.config import ElectionTimings
from dtjob.kube.client import Conflict
from dtjob.runtime.election import ELECTED_REASON, Elector
from dtjob.runtime.lease import Leadership, Verdict, decide, record_of

Json = dict[str, Any]
TIMINGS = ElectionTimings()  # 15 s lease, 10 s renew deadline, 2 s retry, renewals every 5 s


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.start = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return self.start + timedelta(seconds=self.now - 1000.0)


class Store:
    """One Lease as the API server holds it, and the Events posted about it."""

    def __init__(self) -> None:
        self.lease: Json | None = None
        self.version = 0
        self.events: list[tuple[str, str]] = []  # (reason, message)
        self.down = False  # every call fails, as with an unreachable API server

    def write(self, spec: Json) -> Json:
        self.version += 1
        meta = {"name": Leases.name, "namespace": "ops", "uid": "u", "resourceVersion": str(self.version)}
        self.lease = {"metadata": meta, "spec": copy.deepcopy(spec)}
        return copy.deepcopy(self.lease)


class Leases:
    namespace = "ops"
    name = "dtjob-operator"

    def __init__(self, store: Store) -> None:
        self.store = store
        self.down = False  # this replica cut off from the API server

    def _up(self) -> None:
        if self.store.down or self.down:
            raise ConnectionError("connection refused")

    def read(self) -> Json | None:
        self._up()
        return copy.deepcopy(self.store.lease)

    def create(self, spec: Json) -> Json | None:
        self._up()
        return None if self.store.lease is not None else self.store.write(spec)

    def replace(self, spec: Json, resource_version: str) -> Json:
        self._up()
        assert self.store.lease is not None
        if self.store.lease["metadata"]["resourceVersion"] != resource_version:
            raise Conflict("changed")
        return self.store.write(spec)

    def announce(
        self, lease: Mapping[str, Any], reason: str, message: str, now: datetime, instance: str
    ) -> None:
        self._up()
        self.store.events.append((reason, message))


def elector(name: str, store: Store, clock: Clock) -> Elector:
    return Elector(
        Leases(store), TIMINGS, Leadership(name, TIMINGS.renew_deadline_s, clock), clock, clock.wall
    )


def holder(store: Store) -> str:
    return record_of(store.lease).holder if store.lease else ""


def test_the_first_replica_creates_the_lease_and_the_second_stands_by() -> None:
    store, clock = Store(), Clock()
    a, b = elector("a", store, clock), elector("b", store, clock)
    assert a.round() == (TIMINGS.renew_interval_s, True)
    assert b.round() == (TIMINGS.retry_period_s, False)
    assert a.leadership.leading() and not b.leadership.leading()
    assert store.events == [(ELECTED_REASON, "a is the leader now (previous holder: none, new lease)")]
    status = b.status()
    assert (status.leading, status.holder, status.fresh, status.lease) == (
        False,
        "a",
        True,
        "ops/dtjob-operator",
    )
    # Renewals neither announce nor count as an election.
    clock.now += 5
    assert a.round() == (TIMINGS.renew_interval_s, False)
    assert len(store.events) == 1


def test_two_replicas_racing_for_a_new_lease_elect_exactly_one() -> None:
    store, clock = Store(), Clock()
    a, b = elector("a", store, clock), elector("b", store, clock)
    # Both read "no Lease" before either writes: b's create is refused.
    assert decide(None, None, clock.now, "b", 15)[0] is Verdict.ACQUIRE
    a.round()
    store_before = copy.deepcopy(store.lease)
    b._write(None, Verdict.ACQUIRE)
    assert store.lease == store_before and not b.leadership.leading()


def test_a_killed_leader_is_replaced_only_after_it_stopped_writing() -> None:
    store, clock = Store(), Clock()
    a, b = elector("a", store, clock), elector("b", store, clock)
    a.round()
    b.round()
    clock.now += 5
    a.round()  # the last renewal; then a is killed: it never runs another round
    killed_at = clock.now
    took_over_at = None
    while took_over_at is None:
        clock.now += TIMINGS.retry_period_s
        _, elected = b.round()
        if elected:
            took_over_at = clock.now
        else:
            assert holder(store) == "a"
        assert not (a.leadership.leading() and b.leadership.leading()), "two leaders at once"
    # b saw a's last renewal at its next round (within 2 s), waited a whole lease duration after that, and
    # noticed at the round after (within 2 s more).
    retry = TIMINGS.retry_period_s
    assert TIMINGS.lease_duration_s <= took_over_at - killed_at <= TIMINGS.lease_duration_s + 2 * retry
    assert not a.leadership.leading(), "a stopped writing at its renew deadline, before b took over"
    assert store.events[-1] == (ELECTED_REASON, "b is the leader now (previous holder: a, its lease expired)")
    assert record_of(store.lease or {}).transitions == 1


def test_a_released_lease_is_taken_at_the_next_look_and_the_releaser_cannot_come_back() -> None:
    store, clock = Store(), Clock()
    a, b = elector("a", store, clock), elector("b", store, clock)
    a.round()
    b.round()
    a.resign()
    a._release()
    assert holder(store) == "" and not a.leadership.leading()
    clock.now += TIMINGS.retry_period_s
    assert b.round()[1] is True
    assert store.events[-1] == (ELECTED_REASON, "b is the leader now (previous holder: a, released)")
    # a round of the resigned replica still under way changes nothing.
    a._write(record_of(store.lease or {}), Verdict.RENEW)
    assert not a.leadership.leading()


def test_a_leader_cut_off_from_the_api_server_steps_down_and_leads_again_if_nobody_took_over() -> None:
    store, clock = Store(), Clock()
    a = elector("a", store, clock)
    a.round()
    store.down = True
    for _ in range(4):  # 8 s of failed rounds: still within the renew deadline
        clock.now += TIMINGS.retry_period_s
        assert a.round() == (TIMINGS.retry_period_s, False)
    assert a.leadership.leading()
    clock.now += TIMINGS.retry_period_s
    a.round()
    assert not a.leadership.leading() and not a.status().leading
    store.down = False
    assert a.round() == (TIMINGS.renew_interval_s, True), "elected again: its caller requeues every job"
    assert len(store.events) == 1, "the holder never changed: no handover to announce"


def test_a_standby_with_a_stale_view_of_the_lease_is_not_fresh() -> None:
    store, clock = Store(), Clock()
    a, b = elector("a", store, clock), elector("b", store, clock)
    assert not b.status().fresh  # never read
    a.round()
    b.round()
    store.down = True
    clock.now += TIMINGS.lease_duration_s
    b.round()
    assert not b.status().fresh and not b.status().leading


@pytest.mark.parametrize("seed", range(20))
def test_never_two_leaders_at_once_whatever_the_interleaving(seed: int) -> None:
    """Three replicas, rounds at their own pace, replicas frozen for a while (a paused process: its right to
    write still counts), cut off from the API server, killed and started again: at no instant do two replicas
    hold the right to write, and a leader is always found again."""
    rng = random.Random(seed)
    store, clock = Store(), Clock()
    replicas = {f"r{i}": elector(f"r{i}", store, clock) for i in range(3)}
    due = {name: clock.now + rng.uniform(0, 2) for name in replicas}
    generation = 0
    for _ in range(1500):
        name = min(due, key=lambda n: due[n])
        clock.now = due[name]
        replica = replicas[name]
        assert isinstance(replica.leases, Leases)
        replica.leases.down = rng.random() < 0.1 if replica.leases.down else rng.random() < 0.03
        if rng.random() < 0.01:  # killed and started again under a new identity
            generation += 1
            replica = replicas[name] = elector(f"{name}-{generation}", store, clock)
        delay, _ = replica.round()
        due[name] = clock.now + delay * rng.uniform(1.0, 1.3)  # a loaded replica runs late
        if rng.random() < 0.03:
            due[name] += rng.uniform(0, 30)  # frozen
        leading = [n for n, r in replicas.items() if r.leadership.leading()]
        assert len(leading) <= 1, f"two leaders at {clock.now}: {leading}"
    for replica in replicas.values():
        assert isinstance(replica.leases, Leases)
        replica.leases.down = False
    for _ in range(40):
        for replica in replicas.values():
            clock.now += 1
            replica.round()
    assert sum(r.leadership.leading() for r in replicas.values()) == 1
