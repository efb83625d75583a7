"""Which pod and which uploaded file `dtjob logs` reads, and how far it printed a pod's log."""

from __future__ import annotations

from typing import Any

from dtjob.cli.log_target import (
    LogPosition,
    LogTarget,
    newest_pod,
    split_stamp,
    staging_outcome,
    staging_over,
    uploaded_log,
)
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


def test_the_stager_is_the_staging_jobs_pod_and_has_no_uploaded_copy() -> None:
    stager = LogTarget("r50", stager=True)
    assert stager.label_selector() == "dtjob.io/job-name=r50,dtjob.io/role=stager"
    assert (stager.container, stager.describe()) == ("stager", "the stager (Job r50-stage)")
    # The operator uploads the logs of the pods the job owns; the stager's are the staging Job's.
    assert not stager.uploaded and LogTarget("r50").uploaded and LogTarget("r50", 1).uploaded
    listed = ["logs/r50-stage-x7k2p.log", "logs/r50-launcher-x7k2p.log"]
    assert uploaded_log(stager, listed, "logs/") is None


def job(phase: str, *conditions: dict[str, str], **status: Any) -> dict[str, Any]:
    return {"status": {"phase": phase, "conditions": list(conditions), **status}}


def test_staging_is_over_once_staged_or_once_the_job_has_ended() -> None:
    staged = {"type": "Staged", "status": "True", "reason": "StagingSucceeded", "message": "imagenet staged"}
    refused = {"type": "Staged", "status": "False", "reason": "PodRefused", "message": "waiting for room"}
    assert not staging_over(job("Pending")) and not staging_over(job("Staging"))
    assert staging_over(job("Staging", staged)) and staging_over(job("Running", staged))
    # Staged False is said while a refused stager pod waits for room: staging goes on.
    assert not staging_over(job("Staging", refused))
    assert staging_over(job("Failed")) and staging_over(job("Failed", refused))
    assert staging_over({"status": {"phase": "Succeeded"}}) and not staging_over({})


def test_how_staging_ended_is_said_in_the_jobs_own_words() -> None:
    failed = {
        "type": "Staged",
        "status": "False",
        "reason": "StagingFailed",
        "message": "the input SAS was denied",
    }
    assert staging_outcome(job("Failed", failed)) == (
        "condition Staged=False (StagingFailed): the input SAS was denied"
    )
    assert staging_outcome(job("Failed", staging={"phase": "failed", "reason": "exit 5"})) == (
        "staging failed: exit 5"
    )
    assert staging_outcome(job("Failed", message="job was active longer than ...")) == (
        "phase Failed: job was active longer than ..."
    )
    assert staging_outcome({}) == "phase Pending: no message"


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


def test_a_line_is_placed_by_the_timestamp_the_api_server_put_before_it() -> None:
    assert split_stamp(b"2026-01-02T03:04:05.123456789Z step 1\n") == ((1767323045, 123456789), b"step 1\n")
    # Fewer digits, no fraction, an offset: the same instant keys the same.
    assert split_stamp(b"2026-01-02T03:04:05.1234Z x\n")[0] == (1767323045, 123400000)
    assert split_stamp(b"2026-01-02T04:04:05+01:00 x\n")[0] == (1767323045, 0)
    assert split_stamp(b"2026-01-02T03:04:05Z \n") == ((1767323045, 0), b"\n")
    for line in (b"step 1\n", b"2026-01-02 03:04:05Z x\n", b"2026-01-02T03:04:05.123Z\n"):
        assert split_stamp(line) == (None, line)


def test_the_first_read_asks_for_tail_and_since_a_later_one_for_what_is_new() -> None:
    position = LogPosition()
    assert position.request(10, 300, now=100.0) == {"tail_lines": 10, "since_seconds": 300}
    assert LogPosition().request(None, None, now=100.0) == {}
    position.opened(100.0)
    # Nothing printed yet (an empty log, or none in the window): what came since the first read, no more;
    # --tail 0 -f must not print the old lines on a reconnect.
    assert position.request(0, None, now=112.5) == {"since_seconds": 13}
    assert position.request(None, 300, now=112.5) == {"since_seconds": 313}
    assert position.request(None, None, now=112.5) == {}
    position.admit((5, 0))
    # Something printed: the whole log, read past what was printed.
    assert position.request(10, 300, now=130.0) == {}


def test_a_reread_skips_up_to_the_last_line_printed_lines_of_the_same_instant_included() -> None:
    position = LogPosition()
    position.opened(0.0)
    first = [(1, 0), (2, 0), (2, 0)]  # two lines in the same nanosecond
    assert [position.admit(s) for s in first] == [True, True, True]
    assert (position.last, position.same) == ((2, 0), 2)
    position.opened(5.0)  # the stream broke; the log is read from its start again
    again = [(0, 9), (1, 0), (2, 0), (2, 0), (2, 0), (3, 0)]
    assert [position.admit(s) for s in again] == [False, False, False, False, True, True]
    assert (position.last, position.same) == ((3, 0), 1)


def test_a_reread_after_a_rotation_prints_what_is_newer_and_a_line_without_a_stamp_ends_the_skip() -> None:
    position = LogPosition()
    position.opened(0.0)
    assert position.admit((10, 0))
    position.opened(1.0)
    # The kubelet rotated the file: the log now starts after the last line printed. A count of lines
    # printed would have skipped the first new one.
    assert [position.admit(s) for s in [(11, 0), (12, 0)]] == [True, True]
    position.opened(2.0)
    assert [position.admit(s) for s in [(11, 0), None, (11, 0)]] == [False, True, True]
