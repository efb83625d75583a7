"""Child objects with odd values are observed, never raised on: a stager pod's termination message that is
JSON but not a progress snapshot (a number, a list, fields of the wrong type) leaves the outcome without
progress instead of failing every reconcile of the job."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dtjob import names
from dtjob.contract.transfer_report import PROGRESS_MARKER, ExitCode, parse_progress
from dtjob.state.staging import staging_outcome

NOT_SNAPSHOTS = ["0", "[]", '"done"', "null", json.dumps({"phase": "done", "files_total": "many"}),
                 json.dumps({"phase": 1, "elapsed_s": True})]  # fmt: skip


def stager_pod(message: str, exit_code: int) -> dict[str, Any]:
    terminated = {"exitCode": exit_code, "message": message}
    return {
        "metadata": {"name": "rn50-stage-x", "labels": {names.ROLE_LABEL: names.ROLE_STAGER}},
        "status": {
            "containerStatuses": [{"name": names.STAGER_CONTAINER, "state": {"terminated": terminated}}]
        },
    }


def staging_job(condition: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "rn50-stage"},
        "status": {"conditions": [{"type": condition, "status": "True"}]},
    }


@pytest.mark.parametrize("message", NOT_SNAPSHOTS)
def test_a_termination_message_that_is_not_a_snapshot_is_read_as_no_progress(message: str) -> None:
    done = staging_outcome(staging_job("Complete"), [stager_pod(message, 0)])
    assert done.phase == "Succeeded" and done.progress is None
    failed = staging_outcome(staging_job("Failed"), [stager_pod(message, int(ExitCode.DENIED))])
    assert failed.phase == "Failed" and failed.progress is None
    assert failed.reason == "the input SAS was denied (403)"


@pytest.mark.parametrize("message", NOT_SNAPSHOTS)
def test_a_log_line_that_is_not_a_snapshot_is_skipped(message: str) -> None:
    assert parse_progress(f"{PROGRESS_MARKER}{message}\n") is None


def test_a_snapshots_text_reaches_the_status_no_longer_than_the_stager_writes_it() -> None:
    """Whoever may exec into the stager's pod may print a `DTJOB_PROGRESS` line of their own to its log,
    whose phase and reason the running job's status.staging shows: each is cut, as a line may be as long
    as the log tail read."""
    counts = ("files_total", "files_done", "files_skipped", "bytes_total", "bytes_done", "bytes_skipped")
    forged = {"phase": "p" * 100_000, "reason": "r" * 100_000, **dict.fromkeys(counts, 3)}
    forged.update(elapsed_s=1.0, bytes_per_s=3.0)
    running = {"metadata": {"name": "rn50-stage"}, "status": {}}
    outcome = staging_outcome(running, [], log_tail=PROGRESS_MARKER + json.dumps(forged) + "\n")
    assert outcome.phase == "Running" and outcome.progress is not None
    shown = outcome.progress.to_status()
    assert shown["filesTotal"] == 3
    assert 0 < len(shown["phase"]) <= 512 and 0 < len(shown["reason"]) <= 512, shown
