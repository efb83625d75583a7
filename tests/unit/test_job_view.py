"""`dtjob status`'s screen, rendered from a job and events as the API returns them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dtjob.cli.job_view import LAST_EVENTS, render

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


def job(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "r50", "namespace": "ml", "creationTimestamp": "2026-11-23T11:00:00Z"},
        "spec": {"framework": "pytorch"},
        "status": status,
    }


def event(reason: str, message: str, at: str, count: int = 1, kind: str = "Normal") -> dict[str, Any]:
    return {"reason": reason, "message": message, "lastTimestamp": at, "count": count, "type": kind}


def test_a_running_job_shows_its_world_progress_staging_output_and_conditions() -> None:
    screen = render(
        job(
            {
                "phase": "Running",
                "workersReady": "2/2",
                "gpus": 8,
                "launcher": {"state": "Running", "pod": "r50-launcher-abcde"},
                "restarts": 1,
                "progress": {"summary": "epoch 2/90 step 10/5004 812 img/s loss 5.321"},
                "staging": {
                    "phase": "done",
                    "filesCompleted": 10,
                    "filesTotal": 10,
                    "bytesCompleted": 3 * 2**20,
                    "bytesTotal": 3 * 2**20,
                    "bytesPerSecond": 2**20,
                },
                "output": {
                    "url": "https://acct.blob.core.windows.net/runs/ml/r50/u1/",
                    "logsUploaded": False,
                    "logsError": "403 AuthorizationFailure",
                },
                "conditions": [
                    {
                        "type": "Running",
                        "status": "True",
                        "reason": "WorldRunning",
                        "message": "every rank runs",
                        "lastTransitionTime": "2026-11-23T11:58:30Z",
                    }
                ],
            }
        ),
        [event("WorldRestarted", "rank 1 exited 137", "2026-11-23T11:50:00Z", count=2, kind="Warning")],
        NOW,
    )
    lines = screen.splitlines()
    assert "Phase:      Running" in lines
    assert "Age:        1h" in lines
    assert "Workers:    2/2 ready, 8 GPUs" in lines
    assert "Launcher:   Running (pod r50-launcher-abcde)" in lines
    assert "Restarts:   1" in lines
    assert "Progress:   epoch 2/90 step 10/5004 812 img/s loss 5.321" in lines
    assert "Staging:    done: 10/10 files, 3.0 MiB/3.0 MiB at 1.0 MiB/s" in lines
    assert "Output:     https://acct.blob.core.windows.net/runs/ml/r50/u1/" in lines
    assert "            last upload failed: 403 AuthorizationFailure" in lines
    assert any(line.split()[:3] == ["Running", "True", "1m"] for line in lines)
    assert any("WorldRestarted" in line and line.endswith("rank 1 exited 137 (x2)") for line in lines)


def test_a_new_job_without_status_or_events_is_pending() -> None:
    screen = render(job({}), [], NOW)
    assert "Phase:      Pending" in screen.splitlines()
    assert "Progress:   -" in screen
    assert "Events:     none" in screen
    assert "Conditions:" not in screen and "Output:" not in screen


def test_only_the_last_events_are_shown_oldest_first() -> None:
    events = [event(f"Step{i:02d}", f"m{i}", f"2026-11-23T11:{i:02d}:00Z") for i in range(20)]
    shown = [
        line.split()[2]
        for line in render(job({}), list(reversed(events)), NOW).splitlines()
        if "Step" in line
    ]
    assert shown == [f"Step{i:02d}" for i in range(20 - LAST_EVENTS, 20)]


def test_percent_done_and_the_eta_are_shown_with_what_they_rest_on() -> None:
    progress = {
        "summary": "epoch 31/90 step 200/1251 2048 img/s loss 3.200 33.5% ETA 14h56m",
        "percent": 33.5, "etaSeconds": 53770, "eta": "14h56m", "stepsPerSec": 1.5, "worldSize": 8,
        "updatedAt": "2026-11-23T11:58:00Z",
    }  # fmt: skip
    lines = render(job({"phase": "Running", "progress": progress}), [], NOW).splitlines()
    assert "Progress:   epoch 31/90 step 200/1251 2048 img/s loss 3.200 33.5% ETA 14h56m" in lines
    assert "Done:       33.5%, ETA 14h56m (as of 2m ago, 8 ranks at 1.5 steps/s)" in lines
    no_eta = {k: v for k, v in progress.items() if k not in ("etaSeconds", "eta")}
    lines = render(job({"phase": "Restarting", "progress": no_eta}), [], NOW).splitlines()
    assert "Done:       33.5%, ETA unknown" in lines
    finished = {"percent": 100.0, "etaSeconds": 0, "summary": "s"}
    assert "Done:       100.0%, ETA 0s" in render(job({"progress": finished}), [], NOW).splitlines()
    assert not any(
        line.startswith("Done:") for line in render(job({"progress": {"summary": "s"}}), [], NOW).splitlines()
    )


def test_an_elastic_job_shows_the_ranks_training_and_its_bounds() -> None:
    elastic = job({"workersReady": "2/3", "gpus": 3, "progress": {"summary": "s", "worldSize": 2}})
    elastic["spec"]["elastic"] = {"minWorkers": 2, "maxWorkers": 4}
    lines = render(elastic, [], NOW).splitlines()
    assert "Workers:    2/3 ready, 3 GPUs; 2 ranks training; elastic 2..4 workers" in lines


def test_a_torchrun_job_shows_its_workers_torchrun_and_rank_0s_pod_not_a_launcher() -> None:
    torchrun = {**job({"phase": "Running", "launcher": {"state": "Running", "pod": "r50-worker-0"}})}
    torchrun["spec"] = {"framework": "pytorch", "torchrun": {}}
    lines = render(torchrun, [], NOW).splitlines()
    assert "Torchrun:   Running (rank 0 on pod r50-worker-0)" in lines
    assert not any(line.startswith("Launcher:") for line in lines)
