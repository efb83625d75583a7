"""An ETA in status belongs to the world that measured it, while it trains: a restart, a suspend or a failure
takes it out (percent done stays), and an older world's launcher, still read as it goes, does not put it
back."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from dtjob.contract.training_progress import latest_progress
from dtjob.machine import decide
from dtjob.state.observed import LauncherState, Observed, PodState
from dtjob.state.status import JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
RECORD = {
    "epoch": 31, "epochs": 90, "step": 200, "stepsPerEpoch": 1251, "imagesPerSec": 2048.0, "loss": 3.2,
    "updatedAt": "2025-01-01T11:59:00Z", "worldSize": 2, "globalBatch": 1024, "stepsPerSec": 2.0,
}  # fmt: skip
PROGRESS = latest_progress(f"DTJOB_PROGRESS {json.dumps(RECORD)}")


def worker(index: int, attempt: int = 0) -> PodState:
    return PodState(
        name=f"rn50-worker-{index}", role="worker", attempt=attempt, index=index, phase="Running",
        scheduled=True, ready=True, deleting=False, uid=f"uid-{index}", created=NOW - timedelta(minutes=10),
    )  # fmt: skip


def launcher(attempt: int, *, failed: bool) -> LauncherState:
    return LauncherState(
        attempt, deleting=False, running=not failed, succeeded=False, failed=failed,
        pod_name=f"rn50-launcher-{attempt}", reason="Error, exit code 137" if failed else None,
    )  # fmt: skip


def status(restarts: int, progress: Any = None) -> JobStatus:
    return JobStatus(
        phase="Running", start_time=format_time(NOW - timedelta(hours=1)), launcher_pod="x",
        restarts=restarts, training_progress=progress,
    )  # fmt: skip


def test_the_running_worlds_record_keeps_its_eta() -> None:
    assert PROGRESS is not None and PROGRESS["etaSeconds"] > 0
    observed = Observed(
        pods=(worker(0), worker(1)), launcher=launcher(0, failed=False), training_progress=PROGRESS
    )
    d = decide(job_spec(), observed, status(0), NOW)
    assert d.status.to_dict()["progress"] == PROGRESS


def test_a_restart_takes_the_eta_out_and_keeps_percent_done() -> None:
    assert PROGRESS is not None
    observed = Observed(
        pods=(worker(0), worker(1)), launcher=launcher(0, failed=True), training_progress=PROGRESS
    )
    d = decide(job_spec(), observed, status(0), NOW)
    assert d.status.phase == "Restarting" and d.status.restarts == 1
    kept = d.status.to_dict()["progress"]
    assert "etaSeconds" not in kept and "eta" not in kept and "ETA" not in kept["summary"]
    assert kept["percent"] == PROGRESS["percent"] and kept["step"] == 200


def test_the_old_worlds_launcher_read_again_after_the_restart_brings_no_eta_back() -> None:
    assert PROGRESS is not None
    old = Observed(
        pods=(), launcher=replace(launcher(0, failed=True), deleting=True), training_progress=PROGRESS
    )
    restarting = replace(status(1, progress=None), phase="Restarting")
    d = decide(job_spec(), old, restarting, NOW)
    assert d.status.phase != "Running"
    kept = d.status.to_dict()["progress"]
    assert "etaSeconds" not in kept and kept["percent"] == PROGRESS["percent"]


def test_a_suspended_job_has_no_eta() -> None:
    assert PROGRESS is not None
    observed = Observed(pods=(worker(0), worker(1)), launcher=launcher(0, failed=False))
    d = decide(job_spec(runPolicy={"suspend": True}), observed, status(0, progress=PROGRESS), NOW)
    assert d.status.phase == "Suspended"
    kept = d.status.to_dict()["progress"]
    assert "etaSeconds" not in kept and kept["percent"] == PROGRESS["percent"]


def test_a_failed_job_has_no_eta_a_succeeded_one_keeps_its_zero() -> None:
    assert PROGRESS is not None
    spec = job_spec(runPolicy={"backoffLimit": 0})
    failed = Observed(
        pods=(worker(0), worker(1)), launcher=launcher(0, failed=True), training_progress=PROGRESS
    )
    d = decide(spec, failed, status(0), NOW)
    assert d.status.phase == "Failed" and "etaSeconds" not in d.status.to_dict()["progress"]
    done = {**PROGRESS, "percent": 100.0, "etaSeconds": 0, "eta": "0s"}
    succeeded = replace(status(0, progress=done), phase="Succeeded", completion_time=format_time(NOW))
    assert decide(spec, Observed(), succeeded, NOW).status.to_dict()["progress"] == done
