"""dtjob.runtime.log_polls: one log read at most once per interval, and every log's reads within a budget."""

from __future__ import annotations

import itertools

from dtjob.runtime.log_polls import LogPolls

from tests.unit.manual_clock import ManualClock as Clock


def key(i: int) -> tuple[str, str, str]:
    return ("ml", f"job-{i}-launcher", "launcher")


def poll_every(
    polls: LogPolls, clock: Clock, logs: range, every_s: float, for_s: float
) -> dict[int, list[float]]:
    """Each log asked for at every reconcile (one a second each, as pod events and timers would), for
    `for_s`; returns when each was read."""
    reads: dict[int, list[float]] = {i: [] for i in logs}
    end = clock.now + for_s
    while clock.now < end:
        for i in logs:
            if polls.due(key(i), every_s):
                reads[i].append(clock.now)
        clock.now += 1.0
    return reads


def test_without_a_budget_a_log_is_read_once_per_interval() -> None:
    clock = Clock()
    polls = LogPolls(clock)
    reads = poll_every(polls, clock, range(2000), 15.0, 60.0)
    assert all(len(times) == 4 for times in reads.values())  # at 0, 15, 30 and 45 s
    assert polls.interval(15.0) == 15.0


def test_below_the_budget_nothing_is_spaced_further() -> None:
    clock = Clock()
    polls = LogPolls(clock, reads_per_second=10.0)
    reads = poll_every(polls, clock, range(100), 15.0, 60.0)  # 100 logs every 15 s: 6.7 reads a second
    assert all(len(times) == 4 for times in reads.values())
    assert polls.interval(15.0) == 15.0


def test_many_logs_polled_stay_within_the_budget_and_each_is_still_read() -> None:
    clock = Clock()
    polls = LogPolls(clock, reads_per_second=10.0)
    reads = poll_every(polls, clock, range(1000), 15.0, 600.0)
    assert polls.interval(15.0) == 100.0  # 1,000 logs at 10 reads a second
    first_reads = 1000  # a log's first read is never held back
    total = sum(len(times) for times in reads.values())
    assert (total - first_reads) / 600.0 <= 10.0
    for times in reads.values():  # every log still read, at the budget's spacing
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert len(times) >= 5 and max(gaps) <= 101.0, times


def test_the_spacing_narrows_again_once_the_logs_polled_are_gone() -> None:
    clock = Clock()
    polls = LogPolls(clock, reads_per_second=10.0)
    poll_every(polls, clock, range(1000), 15.0, 120.0)
    assert polls.interval(15.0) == 100.0
    poll_every(
        polls, clock, range(10), 15.0, 240.0
    )  # the others' pods ended: their logs are asked for no more
    assert polls.interval(15.0) == 15.0
    reads = poll_every(polls, clock, range(10), 15.0, 60.0)
    assert all(len(times) == 4 for times in reads.values())


def test_how_soon_a_log_is_due_counts_from_its_last_read() -> None:
    clock = Clock()
    polls = LogPolls(clock)
    assert polls.read_in(key(0), 30.0) is None  # never read
    assert polls.due(key(0), 15.0)
    clock.now += 20.0
    assert polls.read_in(key(0), 30.0) == 10.0
    clock.now += 15.0
    assert polls.read_in(key(0), 30.0) == -5.0  # overdue


def test_logs_polled_together_on_the_timers_period_count_for_the_budget() -> None:
    # Every log read in the same pass each period (twice the least gap): the recount comes first in a pass,
    # a moment past the period since the last reads, and must still count them.
    clock = Clock()
    polls = LogPolls(clock, reads_per_second=0.2)
    reads = 0
    for _ in range(30):
        for i in range(4):
            reads += polls.due(key(i), 0.5)
        clock.now += 1.01
    assert polls.interval(0.5) == 20.0  # 4 logs at 0.2 reads a second
    assert reads <= 4 + 4 * 2, reads  # the first reads, then one each 20 s at most
