"""The state machine on a torchrun world: no launcher, the world's launch read from its workers
(dtjob.state.torchrun.torchrun_launch, as the observer does). Running once every worker runs, Succeeded once
every worker exited 0, a failed worker restarts the world (or fails the job at backoffLimit, or at once for a
permanent exit code under restartPolicy ExitCode), a worker gone after the world formed is lost."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from dtjob import names
from dtjob.contract import results_upload
from dtjob.contract.results_upload import UPLOAD_FAILED_EXIT, latest_report
from dtjob.machine import decide
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import (
    CreateLauncher,
    CreateWorker,
    Decision,
    DeleteLauncher,
    DeletePod,
    EnsureWorld,
    PublishHosts,
)
from dtjob.state.observed import Observed, observe_children
from dtjob.state.rank_error import RankError, rank_error
from dtjob.state.status import Condition, JobStatus, status_from_dict
from dtjob.state.torchrun import torchrun_launch
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
RANK_LOG = (
    "[rank5]: Traceback (most recent call last):\n"
    "error: rank 5: cannot decode /data/train/n01440764/broken.JPEG\n"
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
)


def torchrun(**spec: Any) -> JobSpec:
    return job_spec(torchrun={}, **spec)


def raw_worker(
    index: int, phase: str = "Running", attempt: int = 0, size: int = 2, exit_code: int | None = None
) -> dict[str, Any]:
    """A worker pod as the watch cache holds it (labelled as desired.worker_pod labels a torchrun worker)."""
    labels = {
        names.JOB_NAME_LABEL: "rn50", names.ROLE_LABEL: names.ROLE_WORKER, names.ATTEMPT_LABEL: str(attempt),
        names.WORKER_INDEX_LABEL: str(index), names.WORLD_SIZE_LABEL: str(size),
    }  # fmt: skip
    name = names.worker_name("rn50", index)
    meta = {"name": name, "uid": f"uid-w{index}-a{attempt}", "labels": labels,
            "ownerReferences": [{"kind": "DistributedTrainingJob", "name": "rn50", "uid": "uid-1"}],
            "creationTimestamp": format_time(NOW - timedelta(minutes=10))}  # fmt: skip
    scheduled = {"type": "PodScheduled", "status": "True"}
    status: dict[str, Any] = {"phase": phase, "podIP": f"10.0.0.{index + 10}"}
    if phase == "Running":
        status["conditions"] = [scheduled, {"type": "Ready", "status": "True"}]
        status["containerStatuses"] = [{"name": "worker", "state": {"running": {}}}]
    elif phase == "Pending":
        status["conditions"] = [scheduled, {"type": "Ready", "status": "False"}]
        status["containerStatuses"] = [
            {"name": "worker", "state": {"waiting": {"reason": "ContainerCreating"}}}
        ]
    else:
        code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1)
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        status["conditions"] = [scheduled, {"type": "Ready", "status": "False"}]
        status["containerStatuses"] = [{"name": "worker", "state": {"terminated": terminated}}]
    return {"metadata": meta, "spec": {"nodeName": f"node-{index}"}, "status": status}


def observed(
    spec: JobSpec,
    *pods: dict[str, Any],
    attempt: int = 0,
    log_error: RankError | None = None,
    prev: JobStatus | None = None,
) -> Observed:
    """As dtjob.reconcile.observe builds it: the children, then the launch read from the workers (with the
    failed worker's error line, read from its log, and whether `prev` saw a worker exit 0)."""
    seen = observe_children(list(pods), None, "uid-1")
    trained_before = prev is not None and prev.workers_succeeded > 0
    launch = torchrun_launch(seen.workers(), attempt, spec.workers, trained_before=trained_before)
    if launch is not None and launch.failed and log_error is not None:
        launch = replace(launch, log_error=log_error)
    return replace(seen, launcher=launch, uid="uid-1")


def running(**kw: Any) -> JobStatus:
    """The status of a world that formed: its launch seen (worker 0)."""
    formed = Condition("Running", "True", "WorkersRunning", "8 ranks on 2 workers", format_time(NOW))
    fields: dict[str, Any] = {
        "phase": "Running", "start_time": format_time(NOW - timedelta(minutes=5)),
        "launcher_pod": "rn50-worker-0", "launcher_state": "Running", "workers_total": 2, "workers_ready": 2,
        "conditions": (formed,),
    }  # fmt: skip
    fields.update(kw)
    return JobStatus(**fields)


def no_launcher_actions(d: Decision) -> None:
    """A torchrun world has no launcher: nothing creates or deletes one (its pod, or a legacy Job)."""
    launcher = names.launcher_name("rn50")
    assert not any(
        isinstance(a, CreateLauncher | DeleteLauncher) or getattr(a, "name", "") == launcher
        for a in d.actions
    ), d.actions


def test_a_new_world_creates_its_workers_and_never_a_launcher() -> None:
    spec = torchrun()
    d = decide(spec, observed(spec), JobStatus(), NOW)
    assert d.actions == [EnsureWorld(), CreateWorker(0, 0), CreateWorker(1, 0)]
    assert d.status.phase == "Pending"
    # One worker up, the other still being created: still no launcher, the missing one is made.
    d = decide(spec, observed(spec, raw_worker(0)), JobStatus(phase="Pending"), NOW)
    assert d.actions[-2:] == [EnsureWorld(), CreateWorker(1, 0)]
    no_launcher_actions(d)
    # Worker 0's name is published as soon as it has an address: the others' agents reach its rendezvous.
    published = [a for a in d.actions if isinstance(a, PublishHosts)]
    assert [h.hostname for p in published for h in p.hosts] == ["rn50-worker-0"]
    assert d.status.phase != "Running"
    # Both there, one not running yet: the world has not formed.
    d = decide(spec, observed(spec, raw_worker(0), raw_worker(1, "Pending")), JobStatus(phase="Pending"), NOW)
    no_launcher_actions(d)
    assert not any(isinstance(a, CreateWorker) for a in d.actions)
    assert d.status.phase in ("Pending", "Starting") and d.status.condition("Running") is None


def test_the_world_runs_once_every_worker_runs() -> None:
    spec = torchrun()
    d = decide(spec, observed(spec, raw_worker(0), raw_worker(1)), JobStatus(phase="Starting"), NOW)
    assert d.status.phase == "Running"
    cond = d.status.condition("Running")
    assert cond is not None and cond.status == "True" and cond.reason == "WorkersRunning"
    assert cond.message == "8 ranks on 2 workers"
    created = d.status.condition("Created")
    assert created is not None and "SSH" not in created.message and "hostfile" not in created.message
    # The launch is worker 0's: its log holds rank 0's progress.
    assert d.status.launcher_pod == "rn50-worker-0" and d.status.workers_ready == 2
    no_launcher_actions(d)
    assert not any(isinstance(a, CreateWorker | DeletePod) for a in d.actions)


def test_a_worker_done_while_worker_0_still_uploads_is_no_failure() -> None:
    spec = torchrun(output={"account": "acct1", "container": "results",
                            "credentials": {"authMode": "workloadIdentity"}})  # fmt: skip
    d = decide(spec, observed(spec, raw_worker(0), raw_worker(1, "Succeeded")), running(), NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
    cond = d.status.condition("Running")
    assert cond is not None and cond.reason == "WorkersRunning"
    assert d.status.condition("Restarting") is None and d.status.condition("Failed") is None
    assert not any(isinstance(a, DeletePod) for a in d.actions)
    no_launcher_actions(d)


def test_the_job_succeeds_once_every_worker_exited_0() -> None:
    spec = torchrun()
    d = decide(spec, observed(spec, raw_worker(0, "Succeeded"), raw_worker(1, "Succeeded")), running(), NOW)
    assert d.status.phase == "Succeeded"
    cond = d.status.condition("Succeeded")
    assert cond is not None and cond.reason == "WorkersSucceeded"
    assert cond.message == "all 2 worker pods completed"
    no_launcher_actions(d)
    # Finished: later reconciles only clean up, and never a launcher (cleanPodPolicy All removes the pods).
    later = decide(
        torchrun(runPolicy={"cleanPodPolicy": "All"}),
        observed(spec, raw_worker(0, "Succeeded"), raw_worker(1, "Succeeded")),
        d.status,
        NOW + timedelta(seconds=5),
    )
    assert later.status.phase == "Succeeded"
    no_launcher_actions(later)
    assert DeletePod("rn50-worker-0", "uid-w0-a0") in later.actions


def test_a_failed_worker_restarts_the_world_naming_it_and_its_ranks_error() -> None:
    spec = torchrun()
    error = rank_error(RANK_LOG)
    assert error is not None
    obs = observed(spec, raw_worker(0), raw_worker(1, "Failed", exit_code=1), log_error=error)
    d = decide(spec, obs, running(), NOW)
    assert d.status.phase == "Restarting" and d.status.restarts == 1
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.reason == "WorkerFailed"
    assert cond.message.startswith(
        "worker pod rn50-worker-1 failed: Error, exit code 1: "
        "rank 5: error: rank 5: cannot decode /data/train/n01440764/broken.JPEG"
    )
    assert "restarting the world (restart 1 of 3)" in cond.message
    running_cond = d.status.condition("Running")
    assert running_cond is not None and running_cond.status == "False"
    # The world's pods go (the next attempt takes their names), and there is no launcher to delete.
    assert DeletePod("rn50-worker-0", "uid-w0-a0") in d.actions
    assert DeletePod("rn50-worker-1", "uid-w1-a0") in d.actions
    no_launcher_actions(d)
    assert "WorkerFailed" in [e.reason for e in d.events]


def test_the_next_attempt_makes_a_new_world() -> None:
    spec = torchrun()
    failed = decide(spec, observed(spec, raw_worker(0), raw_worker(1, "Failed")), running(), NOW)
    # The old pods are gone: attempt 1's workers are made, still without a launcher.
    d = decide(spec, observed(spec, attempt=1), failed.status, NOW + timedelta(seconds=5))
    assert d.actions == [EnsureWorld(), CreateWorker(0, 1), CreateWorker(1, 1)]
    assert d.status.phase == "Restarting"
    up = decide(
        spec, observed(spec, raw_worker(0, attempt=1), raw_worker(1, attempt=1), attempt=1), d.status, NOW
    )
    assert up.status.phase == "Running" and up.status.restarts == 1
    assert "Recovered" in [e.reason for e in up.events]
    no_launcher_actions(up)


def test_a_failed_worker_at_the_backoff_limit_fails_the_job() -> None:
    spec = torchrun(runPolicy={"backoffLimit": 0})
    d = decide(spec, observed(spec, raw_worker(0), raw_worker(1, "Failed", exit_code=1)), running(), NOW)
    assert d.status.phase == "Failed" and d.status.restarts == 0
    cond = d.status.condition("Failed")
    assert cond is not None and cond.reason == "WorkerFailed"
    assert cond.message.startswith("worker pod rn50-worker-1 failed: Error, exit code 1")
    assert "runPolicy.backoffLimit (0) reached after 0 restarts" in cond.message
    # cleanPodPolicy Running: the worker still running goes, the failed one stays for its log.
    assert DeletePod("rn50-worker-0", "uid-w0-a0") in d.actions
    assert DeletePod("rn50-worker-1", "uid-w1-a0") not in d.actions
    no_launcher_actions(d)


def test_a_workers_permanent_exit_code_fails_the_job_without_a_restart() -> None:
    spec = torchrun(runPolicy={"restartPolicy": "ExitCode", "backoffLimit": 3})
    d = decide(spec, observed(spec, raw_worker(0), raw_worker(1, "Failed", exit_code=1)), running(), NOW)
    assert d.status.phase == "Failed" and d.status.restarts == 0
    cond = d.status.condition("Failed")
    assert cond is not None and cond.reason == "WorkerFailed"
    assert cond.message.startswith("worker pod rn50-worker-1 failed: Error, exit code 1")
    assert "exit code 1 is permanent under runPolicy.restartPolicy ExitCode (permanentExitCodes 1-127)" in (
        cond.message
    )
    no_launcher_actions(d)
    # A signal (128 + 9) is not the user's code: the world restarts.
    killed = decide(
        spec, observed(spec, raw_worker(0), raw_worker(1, "Failed", exit_code=137)), running(), NOW
    )
    assert killed.status.phase == "Restarting" and killed.status.restarts == 1


def test_a_worker_gone_after_the_world_formed_is_lost() -> None:
    spec = torchrun()
    d = decide(spec, observed(spec, raw_worker(0)), running(), NOW)
    assert d.status.phase == "Restarting" and d.status.restarts == 1
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.reason == "WorkerLost"
    assert cond.message.startswith("worker pod rn50-worker-1 disappeared while the world was running")
    assert DeletePod("rn50-worker-0", "uid-w0-a0") in d.actions
    no_launcher_actions(d)
    # Before the world formed, a missing worker is only made (no launch was ever seen).
    fresh = decide(spec, observed(spec, raw_worker(0)), JobStatus(phase="Pending"), NOW)
    assert fresh.status.restarts == 0 and CreateWorker(1, 0) in fresh.actions


def test_the_launch_waits_for_every_worker_to_run() -> None:
    spec = torchrun()
    seen = observe_children([raw_worker(0), raw_worker(1, "Pending")], None)
    assert torchrun_launch(seen.workers(), 0, 2) is None
    assert torchrun_launch(observe_children([raw_worker(0)], None).workers(), 0, 2) is None
    assert torchrun_launch((), 0, spec.workers) is None
    # Another attempt's pods are not this world.
    old = observe_children([raw_worker(0, attempt=0), raw_worker(1, attempt=0)], None)
    assert torchrun_launch(old.workers(), 1, 2) is None
    launch = torchrun_launch(observe_children([raw_worker(0), raw_worker(1)], None).workers(), 0, 2)
    assert launch is not None and launch.running and not launch.finished
    assert launch.role == names.ROLE_WORKER and not launch.is_launcher
    assert (launch.attempt, launch.world_size, launch.pod_name) == (0, 2, "rn50-worker-0")


def test_the_launchs_size_is_the_one_its_workers_were_started_with() -> None:
    # spec.workers edited to 3 while a world of 2 runs: the world keeps its size until the next one.
    pods = observe_children([raw_worker(0, size=2), raw_worker(1, size=2)], None).workers()
    launch = torchrun_launch(pods, 0, 3)
    assert launch is not None and launch.world_size == 2 and launch.running
    spec = torchrun(workers=3)
    d = decide(spec, observed(spec, raw_worker(0, size=2), raw_worker(1, size=2)), running(), NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
    assert not any(isinstance(a, CreateWorker) for a in d.actions)
    cond = d.status.condition("Running")
    assert (
        cond is not None and cond.message == "8 ranks on 2 workers (spec.workers=3 applies at the next world)"
    )


def test_the_launch_ends_with_its_workers() -> None:
    done = torchrun_launch(
        observe_children([raw_worker(0, "Succeeded"), raw_worker(1, "Succeeded")], None).workers(), 0, 2
    )
    assert done is not None and done.succeeded and not done.running and not done.failed
    # One done, worker 0 still running (uploading): the launch still runs.
    half = torchrun_launch(
        observe_children([raw_worker(0), raw_worker(1, "Succeeded")], None).workers(), 0, 2
    )
    assert half is not None and half.running and not half.finished


def test_a_worker_that_exited_0_may_go_while_worker_0_uploads() -> None:
    """Its agent passed torchrun's exit barrier, so the training is over. Its pod may go then (its node taken
    back by the autoscaler: an ended pod does not hold a node), and the job waits for worker 0's upload:
    no lost worker, no restart, no new worker 1."""
    spec = torchrun()
    half = decide(spec, observed(spec, raw_worker(0), raw_worker(1, "Succeeded")), running(), NOW)
    assert half.status.phase == "Running" and half.status.workers_succeeded == 1
    assert half.status.to_dict()["workers"]["succeeded"] == 1
    kept = status_from_dict(half.status.to_dict())  # as the API server keeps it
    later = NOW + timedelta(seconds=30)
    gone = decide(spec, observed(spec, raw_worker(0), prev=kept), kept, later)
    assert gone.status.phase == "Running" and gone.status.restarts == 0, gone.status.message
    assert not any(isinstance(a, CreateWorker | DeletePod) for a in gone.actions), gone.actions
    assert gone.status.workers_succeeded == 1
    done = decide(spec, observed(spec, raw_worker(0, "Succeeded"), prev=gone.status), gone.status, later)
    assert done.status.phase == "Succeeded", done.status.message
    # Worker 0 gone before it exited: its upload never ended, and the world is lost.
    lost = decide(spec, observed(spec, prev=gone.status), gone.status, later)
    assert lost.status.phase == "Restarting" and lost.status.restarts == 1
    cond = lost.status.condition("Restarting")
    assert cond is not None and cond.reason == "WorkerLost" and "rn50-worker-0" in cond.message
    # The next world starts from no worker done.
    assert lost.status.workers_succeeded == 0
    assert lost.status.to_dict()["workers"]["succeeded"] is None  # null: the merge patch removes it


def test_an_edited_succeeded_count_finishes_no_job_its_workers_did_not() -> None:
    """status.workers.succeeded is the operator's (no tenant role writes status); hand-edited, it only
    stops the replacement of its own job's gone workers: the job still succeeds only once every worker it
    sees exited 0, with worker 0 among them, and a garbage count reads as none."""
    spec = torchrun()
    forged = running(workers_succeeded=2)
    d = decide(spec, observed(spec, raw_worker(0), raw_worker(1), prev=forged), forged, NOW)
    assert d.status.phase == "Running"
    gone = decide(spec, observed(spec, raw_worker(1, "Succeeded"), prev=forged), forged, NOW)
    assert gone.status.phase == "Restarting" and gone.status.restarts == 1, gone.status.message
    for garbage in (-3, "two", None, [1]):
        parsed = status_from_dict({"workers": {"total": 2, "ready": 2, "succeeded": garbage}})
        assert parsed.workers_succeeded == 0, garbage


def test_the_launch_fails_with_the_failed_worker() -> None:
    pods = observe_children([raw_worker(0), raw_worker(1, "Failed", exit_code=3)], None).workers()
    launch = torchrun_launch(pods, 0, 2)
    assert launch is not None and launch.failed and not launch.running and not launch.succeeded
    assert launch.pod_name == "rn50-worker-1"
    assert launch.failed_pod is not None and launch.failed_pod.name == "rn50-worker-1"
    assert launch.failed_pod.exit_code == 3 and launch.reason == "Error, exit code 3"
    # A worker that fails before the others run fails the launch too: the world cannot form.
    early = observe_children([raw_worker(0, "Failed"), raw_worker(1, "Pending")], None).workers()
    failed = torchrun_launch(early, 0, 2)
    assert failed is not None and failed.failed and failed.pod_name == "rn50-worker-0"


def test_worker_0s_upload_that_failed_for_good_fails_the_job_without_training_again() -> None:
    spec = torchrun(output={"account": "acct1", "container": "results",
                            "credentials": {"authMode": "workloadIdentity"}})  # fmt: skip
    obs = observed(spec, raw_worker(0, "Failed", exit_code=UPLOAD_FAILED_EXIT), raw_worker(1, "Succeeded"))
    report = latest_report(results_upload.failed_line(3, 70, "storage refused: 503", "rn50-worker-0"))
    d = decide(spec, replace(obs, results_upload=report), running(), NOW)
    assert d.status.phase == "Failed" and d.status.restarts == 0
    cond = d.status.condition("Failed")
    assert cond is not None and cond.reason == "ResultsUploadFailed"
    assert d.status.results_state == "Failed"
    no_launcher_actions(d)


def test_worker_0_keeps_the_results_it_could_not_upload_and_the_job_keeps_it() -> None:
    # Worker 0's upload failed for good: its last line says so, and worker 0 runs on holding the results.
    spec = torchrun(output={"account": "acct1", "container": "results",
                            "credentials": {"authMode": "workloadIdentity"}})  # fmt: skip
    obs = observed(spec, raw_worker(0, "Running"), raw_worker(1, "Succeeded"))
    report = latest_report(results_upload.failed_line(3, 70, "storage refused: 503", "rn50-worker-0"))
    d = decide(spec, replace(obs, results_upload=report), running(), NOW)
    assert d.status.phase == "Failed" and d.status.restarts == 0, d.status.message
    cond = d.status.condition("Failed")
    assert cond is not None and cond.reason == "ResultsUploadFailed"
    assert d.status.results_pod == "rn50-worker-0" and "kept on pod rn50-worker-0" in d.status.message
    # Cleaning up once finished spares the pod that holds the results.
    after = decide(spec, replace(obs, results_upload=report), d.status, NOW)
    deleted = [a.name for a in after.actions if type(a).__name__ == "DeletePod"]
    assert "rn50-worker-0" not in deleted, after.actions
    no_launcher_actions(after)
    # While the upload still retries, the world runs on.
    retrying = latest_report(results_upload.retry_line(1, 2, 60, "storage refused: 503"))
    again = decide(spec, replace(obs, results_upload=retrying), running(), NOW)
    assert again.status.phase == "Running", again.status.message


def test_a_finished_worker_whose_pod_is_gone_does_not_make_a_succeeded_world_train_again() -> None:
    # Worker 1 exited 0, then its completed pod went (a node with only completed pods is scaled down, a Spot
    # node reclaimed, a cleanup of Succeeded pods); worker 0 then exited 0 too: rank 0 trained to the end (a
    # DDP step needs every rank) and worker 0 uploaded the results. An MPI world succeeds on its launcher's
    # exit whatever became of its workers; restarting this one (WorkerLost) would train it again from the
    # start and overwrite the results uploaded.
    spec = torchrun()
    d = decide(spec, observed(spec, raw_worker(0, "Succeeded")), running(), NOW)
    assert d.status.restarts == 0 and d.status.phase == "Succeeded", d.status.message
