"""The controller's waiting line: each key waits once, the urgent lane first, FIFO within a lane."""

from __future__ import annotations

import asyncio

from dtjob.runtime.lanes import Lanes


def drain(lanes: Lanes[str]) -> list[str]:
    taken: list[str] = []
    while (key := lanes.take()) is not None:
        taken.append(key)
    return taken


def test_urgent_keys_come_first_and_each_lane_keeps_its_order() -> None:
    lanes: Lanes[str] = Lanes()
    for key, urgent in (("a", False), ("b", True), ("c", False), ("d", True)):
        assert lanes.put(key, urgent)
    assert len(lanes) == 4 and "c" in lanes
    assert drain(lanes) == ["b", "d", "a", "c"]
    assert len(lanes) == 0


def test_a_key_waits_once_and_moves_up_when_it_turns_urgent() -> None:
    lanes: Lanes[str] = Lanes()
    assert lanes.put("a") and lanes.put("b") and lanes.put("c")
    assert not lanes.put("a"), "already waiting"
    assert lanes.put("c", urgent=True), "moved to the urgent lane"
    assert not lanes.put("c", urgent=True) and not lanes.put("c")
    assert len(lanes) == 3
    assert drain(lanes) == ["c", "a", "b"], "its old place in the normal lane is skipped"


def test_a_key_taken_can_wait_again() -> None:
    lanes: Lanes[str] = Lanes()
    lanes.put("a")
    lanes.put("a", urgent=True)
    assert lanes.take() == "a"
    assert lanes.put("a")
    assert drain(lanes) == ["a"]


def test_get_waits_for_a_key() -> None:
    async def main() -> list[str]:
        lanes: Lanes[str] = Lanes()
        getters = [asyncio.create_task(lanes.get()) for _ in range(2)]
        await asyncio.sleep(0.01)
        assert not any(g.done() for g in getters)
        lanes.put("a")
        lanes.put("b", urgent=True)
        return sorted(await asyncio.gather(*getters))

    assert asyncio.run(main()) == ["a", "b"]
