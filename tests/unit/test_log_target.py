"""Which pod and which uploaded file `dtjob logs` reads."""

from __future__ import annotations

from typing import Any

from dtjob.log_target import LogTarget, newest_pod, uploaded_log
from dtjob.names import logs_folder


def pod(name: str, attempt: int, created: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "uid": name,
        "labels": {"dtjob.io/attempt": str(attempt)},
        "creationTimestamp": created,
    }
    if deleting:
        meta["deletionTimestamp"] = created
    return {"metadata": meta}


def test_the_selector_names_the_job_the_role_and_the_worker() -> None:
    assert LogTarget("r50").label_selector() == "dtjob.io/job-name=r50,dtjob.io/role=launcher"
    assert LogTarget("r50", 3).label_selector() == (
        "dtjob.io/job-name=r50,dtjob.io/role=worker,dtjob.io/worker-index=3"
    )
    assert LogTarget("r50").container == "launcher" and LogTarget("r50", 0).container == "worker"


def test_the_newest_world_wins_and_a_pod_being_deleted_never_does() -> None:
    old = pod("a", 0, "2026-11-23T10:00:00Z")
    # Attempt 10 sorts after attempt 9 as a number, not as a string.
    nine, ten = pod("b", 9, "2026-11-23T10:05:00Z"), pod("c", 10, "2026-11-23T10:01:00Z")
    going = pod("d", 11, "2026-11-23T10:09:00Z", deleting=True)
    assert newest_pod([old, ten, nine, going]) is ten
    assert newest_pod([old, ten, nine], attempt=0) is old
    assert newest_pod([going]) is None
    assert newest_pod([old], attempt=1) is None


def test_the_uploaded_log_is_found_by_role_in_the_worlds_folder() -> None:
    run = "runs/ml/r50/uid/"
    final, first_world = logs_folder(run), logs_folder(run, 0)
    listed = [
        f"{final}r50-launcher-x7k2p.log",
        f"{final}r50-worker-1.log",
        f"{final}r50-worker-10.log",
        f"{final}r50-launcher2-abcde.log",  # another job whose name starts the same
        f"{first_world}r50-worker-1.log",
    ]
    assert uploaded_log(LogTarget("r50"), listed, final) == f"{final}r50-launcher-x7k2p.log"
    assert uploaded_log(LogTarget("r50", 1), listed, final) == f"{final}r50-worker-1.log"
    assert uploaded_log(LogTarget("r50", 1), listed, first_world) == f"{first_world}r50-worker-1.log"
    assert uploaded_log(LogTarget("r50", 0), listed, final) is None
    assert logs_folder(run, 0) == "runs/ml/r50/uid/logs/attempt-0/"
