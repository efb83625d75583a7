"""bench.job_stages: a job's start cut into stages, and the slowest jobs compared with the median."""

from __future__ import annotations

from typing import Any

from bench.job_stages import JobTimeline, report, timelines


def watched(job: str, t0: float, slow_node: float = 0.0) -> dict[str, Any]:
    """One job of two workers: created at t0, workers at +1, bound at +2, Ready at +3 (+ slow_node), its
    launch (the launcher Job made) +1 later, its pod +1 later, running +1 later."""
    ready = t0 + 3 + slow_node
    workers = [f"{job}-worker-0", f"{job}-worker-1"]
    launcher = f"{job}-launcher-abc"
    return {
        "members": {job: {*workers, launcher}},
        "pods": {**{w: t0 + 1 for w in workers}, launcher: ready + 2},
        "bound": {**{w: t0 + 2 for w in workers}, launcher: ready + 2.5},
        "ready": {job: {w: ready for w in workers}},
        "launches": {job: ready + 1},
        "running": {job: {**{w: ready for w in workers}, launcher: ready + 3}},
    }


def merged(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {key: {} for key in parts[0]}
    for part in parts:
        for key, values in part.items():
            out[key].update(values)
    return out


def test_each_stage_ends_at_its_milestone_timed_from_the_origin() -> None:
    seen = watched("a", 10.0)
    jobs = timelines({"a": 10.0}, workers=2, origin=10.0, **seen)
    assert jobs == {"a": JobTimeline(0, 0.0, (1.0, 2.0, 3.0, 4.0, 5.0, 6.0))}
    assert jobs["a"].stage_s() == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert jobs["a"].start_s == 6.0


def test_a_job_missing_a_milestone_is_left_out() -> None:
    seen = watched("a", 0.0)
    del seen["launches"]["a"]
    assert timelines({"a": 0.0}, workers=2, origin=0.0, **seen) == {}
    seen = watched("a", 0.0)
    assert timelines({"a": 0.0}, workers=3, origin=0.0, **seen) == {}  # a worker never seen


def test_a_launcher_pod_made_before_its_launch_waits_no_time_for_the_job_controller() -> None:
    # dtjob's: the pod made with the world (at +1.5), held, and released 1 s after the workers were Ready.
    seen = watched("a", 0.0)
    seen["pods"]["a-launcher-abc"] = 1.5
    jobs = timelines({"a": 0.0}, workers=2, origin=0.0, **seen)
    assert jobs["a"].stage_s() == [1.0, 1.0, 1.0, 1.0, 0.0, 2.0]
    # Its pod came 2 s after the workers were Ready (the Job controller behind), released 0.5 s later.
    seen["pods"]["a-launcher-abc"] = 5.0
    seen["launches"]["a"] = 5.5
    jobs = timelines({"a": 0.0}, workers=2, origin=0.0, **seen)
    assert jobs["a"].stage_s() == [1.0, 1.0, 1.0, 0.5, 2.0, 0.5]


def test_the_report_names_the_stage_the_slowest_jobs_waited_in_and_their_place() -> None:
    created = {f"j{i}": float(i) for i in range(10)}
    seen = merged(*(watched(job, at, slow_node=20.0 if job == "j7" else 0.0) for job, at in created.items()))
    lines = report(timelines(created, workers=2, origin=0.0, **seen), slowest_share=0.1)
    by_stage = {line[:36].strip(): line[36:].split() for line in lines[1:-1]}
    assert by_stage["workers Ready (node)"] == ["1.00s", "21.00s"]
    assert by_stage["workers bound (scheduler)"] == ["1.00s", "1.00s"]
    assert by_stage["job start"] == ["6.00s", "26.00s"]
    assert lines[-1] == "the slowest 1 were created at places [7] of 10"


def test_no_job_seen_through_is_said() -> None:
    assert report({}) == ["no job was seen through every stage"]
