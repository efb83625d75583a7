"""The leader election's rules (dtjob.runtime.lease): what a replica does with the Lease as read, the records
it writes, and how long its right to write lasts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from dtjob.config import ElectionTimings, load_config
from dtjob.fence import NotLeader
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

from tests.unit.manual_clock import ManualClock

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
ME, OTHER = "op-a_1", "op-b_2"


def held(holder: str, version: str = "7", duration: int = 15) -> LeaseRecord:
    return LeaseRecord(holder, duration, NOW, NOW, 3, version)


def test_no_lease_or_a_released_one_is_taken_at_once() -> None:
    assert decide(None, None, 100.0, ME, 15) == (Verdict.ACQUIRE, None)
    verdict, seen = decide(held(""), None, 100.0, ME, 15)
    assert verdict is Verdict.ACQUIRE and seen == Sighting("7", 100.0)


def test_our_own_lease_is_renewed() -> None:
    assert decide(held(ME), Sighting("7", 0.0), 100.0, ME, 15)[0] is Verdict.RENEW


def test_another_holders_lease_expires_a_whole_duration_after_it_was_first_seen_unchanged() -> None:
    verdict, seen = decide(held(OTHER), None, 100.0, ME, 15)
    assert verdict is Verdict.STANDBY and seen == Sighting("7", 100.0)
    assert decide(held(OTHER), seen, 114.9, ME, 15)[0] is Verdict.STANDBY
    assert decide(held(OTHER), seen, 115.0, ME, 15)[0] is Verdict.EXPIRED
    # A renewal (a new version) starts the count again, whatever the timestamps inside say.
    verdict, again = decide(held(OTHER, version="8"), seen, 115.0, ME, 15)
    assert verdict is Verdict.STANDBY and again == Sighting("8", 115.0)
    assert decide(held(OTHER, version="8"), again, 129.0, ME, 15)[0] is Verdict.STANDBY


def test_expiry_follows_the_duration_the_holder_declared() -> None:
    seen = Sighting("7", 100.0)
    assert decide(held(OTHER, duration=30), seen, 120.0, ME, 15)[0] is Verdict.STANDBY
    assert decide(held(OTHER, duration=0), seen, 115.0, ME, 15)[0] is Verdict.EXPIRED  # none declared: ours


def test_records_to_write_count_transitions_and_a_release_clears_the_holder() -> None:
    later = NOW + timedelta(seconds=5)
    first = claim(None, ME, NOW, 15)
    assert (first.holder, first.acquired, first.renewed, first.transitions) == (ME, NOW, NOW, 0)
    renewed = renewal(held(ME), later, 15)
    assert (renewed.acquired, renewed.renewed, renewed.transitions) == (NOW, later, 3)
    taken = claim(held(OTHER), ME, later, 15)
    assert (taken.holder, taken.acquired, taken.transitions) == (ME, later, 4)
    released = release(held(ME), later)
    assert (released.holder, released.duration_s, released.renewed) == ("", 1, later)
    assert "holderIdentity" not in lease_spec(released)


def test_the_lease_spec_round_trips_in_the_apis_micro_time() -> None:
    record = LeaseRecord(ME, 15, NOW, NOW + timedelta(microseconds=250), 2)
    spec = lease_spec(record)
    assert spec == {
        "holderIdentity": ME, "leaseDurationSeconds": 15, "leaseTransitions": 2,
        "acquireTime": "2026-05-01T12:00:00.000000Z", "renewTime": "2026-05-01T12:00:00.000250Z",
    }  # fmt: skip
    read = record_of({"metadata": {"resourceVersion": "42"}, "spec": spec})
    assert read == LeaseRecord(ME, 15, record.acquired, record.renewed, 2, "42")
    assert record_of({"metadata": {}, "spec": {}}) == LeaseRecord("", 0)


def test_timings_are_ordered_and_the_leader_renews_every_third_of_the_lease() -> None:
    default = ElectionTimings()
    assert (default.lease_duration_s, default.renew_deadline_s, default.retry_period_s) == (15, 10, 2)
    assert default.renew_interval_s == 5
    assert ElectionTimings(6, 4, 1).renew_interval_s == 2
    for bad in ((10, 10, 2), (15, 10, 10), (15, 20, 2), (15, 10, 0)):
        with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
            ElectionTimings(*bad)


def test_the_timings_come_from_the_environment() -> None:
    config = load_config({
        "DTJOB_LEASE_DURATION_SECONDS": "30", "DTJOB_LEASE_RENEW_DEADLINE_SECONDS": "20",
        "DTJOB_LEASE_RETRY_PERIOD_SECONDS": "4", "DTJOB_LEASE_NAME": "ops",
    })  # fmt: skip
    assert config.election == ElectionTimings(30, 20, 4) and config.lease_name == "ops"
    assert load_config({}).election == ElectionTimings() and load_config({}).lease_name == "dtjob-operator"
    with pytest.raises(ValueError, match="renew deadline"):
        load_config({"DTJOB_LEASE_RENEW_DEADLINE_SECONDS": "15"})


def test_leadership_lasts_until_the_renew_deadline_after_the_last_accepted_renewal() -> None:
    clock = ManualClock()
    leadership = Leadership(ME, 10, clock)
    assert not leadership.leading()
    with pytest.raises(NotLeader, match=ME):
        leadership.check()
    leadership.renewed(sent_at=clock.now - 1)  # counted from when it was sent, not when it was answered
    clock.now += 8.9
    leadership.check()
    clock.now += 0.1
    assert not leadership.leading()
    leadership.renewed(clock.now)
    leadership.step_down()
    assert not leadership.leading()


def test_a_resigned_leadership_ignores_a_renewal_still_in_flight() -> None:
    clock = ManualClock()
    leadership = Leadership(ME, 10, clock)
    leadership.renewed(clock.now)
    leadership.step_down(for_good=True)
    leadership.renewed(clock.now)
    assert not leadership.leading()
