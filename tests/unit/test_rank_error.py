"""A failed launcher's message quotes the line that says why a rank failed, and names the pod: the line is
found in the launcher's log as horovodrun and mpirun forward it (rank tags and all), read once as the failure
is seen, and never carries a SAS token."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dtjob.machine import decide
from dtjob.reconcile.observe import FAILURE_TAIL_LINES, observe
from dtjob.state.decision import Event
from dtjob.state.observed import Children, LauncherState, Observed, PodState
from dtjob.state.rank_error import MAX_CHARS, RankError, rank_error
from dtjob.state.status import JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import CONFIG, job_body, job_spec
from tests.unit.recording_kube import RecordingKube

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
NO_GPU = (
    "DTJOB_EXPECT_GPU is set (the job asks for GPUs) but no GPU is visible to this rank: check the node's "
    "NVIDIA driver and device plugin and that the image is a GPU build; set DTJOB_EXPECT_GPU=0 in the job's "
    "env to train on CPU"
)

# horovodrun's Gloo launcher: every rank's line behind `[rank]<stream>:`, then its own report and traceback.
GLOO_NO_GPU = f"""\
[0]<stdout>:dtjob_train pytorch: 8 ranks, batch 128 per rank
[1]<stderr>:error: rn50-worker-0 local rank 1: {NO_GPU}
[0]<stderr>:error: rn50-worker-0 local rank 0: {NO_GPU}
Process 1 exit with status code 3.
Terminating remaining workers after failure of Process 1.
Process 0 exit with status code 3.
Traceback (most recent call last):
  File "/usr/local/bin/horovodrun", line 8, in <module>
    sys.exit(run_commandline())
             ^^^^^^^^^^^^^^^^^
  File "/usr/local/lib/python3.11/site-packages/horovod/runner/gloo_run.py", line 301, in launch_gloo
    raise RuntimeError('Horovod detected that one or more processes exited with non-zero status, '
RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job to be terminated. The first process to do so was:
Process name: 1
Exit code: 3
"""  # noqa: E501

# Open MPI's --tag-output ([jobid,rank]), rank 0's bad-input line, then mpirun's banner.
MPIRUN_BAD_INPUT = """\
[1,0]<stdout>:DTJOB_PROGRESS {"epoch": 0, "epochs": 1, "step": 0, "stepsPerEpoch": 10}
[1,0]<stderr>:error: --batch-size 512: larger than this rank's share of train/ (1000 images over 8 ranks)
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[41645,1],0]
  Exit code:    2
--------------------------------------------------------------------------
"""

# Rank 3 runs out of GPU memory; rank 0's progress and then its own traceback (its peer gone) interleave.
MPIRUN_TRACEBACK = """\
[1,0]<stdout>:epoch 1/90 step 20/1251 loss 6.8812
[1,3]<stderr>:Traceback (most recent call last):
[1,3]<stderr>:  File "/opt/dtjob/training/dtjob_train/pytorch.py", line 321, in <module>
[1,0]<stdout>:DTJOB_PROGRESS {"epoch": 1, "epochs": 90, "step": 20}
[1,3]<stderr>:    main()
[1,3]<stderr>:  File "/opt/dtjob/training/dtjob_train/pytorch.py", line 305, in main
[1,3]<stderr>:    train(cfg, run, model, optimizer, amp, loss_fn, train_batches, val_batches)
[1,3]<stderr>:    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[1,3]<stderr>:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.15 GiB of which 1.02 GiB is free.
[1,0]<stderr>:Traceback (most recent call last):
[1,0]<stderr>:  File "/opt/dtjob/training/dtjob_train/pytorch.py", line 321, in <module>
[1,0]<stderr>:    main()
[1,0]<stderr>:horovod.common.exceptions.HorovodInternalError: ncclAllReduce failed: unhandled system error
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[41645,1],3]
  Exit code:    1
--------------------------------------------------------------------------
"""  # noqa: E501


def test_our_trainers_error_line_under_horovodrun_gloo_names_the_rank_and_its_pod() -> None:
    found = rank_error(GLOO_NO_GPU)
    assert found == RankError(f"error: rn50-worker-0 local rank 1: {NO_GPU}", rank=1, pod="rn50-worker-0")
    assert found.describe().startswith("rank 1 (pod rn50-worker-0): error: rn50-worker-0 local rank 1: ")


def test_our_trainers_error_line_under_mpirun_loses_its_tag_and_keeps_its_rank() -> None:
    found = rank_error(MPIRUN_BAD_INPUT)
    assert found is not None
    assert found.describe() == (
        "rank 0: error: --batch-size 512: larger than this rank's share of train/ (1000 images over 8 ranks)"
    )


def test_a_traceback_gives_its_exception_line_from_the_rank_that_failed_first() -> None:
    found = rank_error(MPIRUN_TRACEBACK)
    assert found is not None and found.rank == 3 and found.pod is None
    assert found.text.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert found.describe().startswith("rank 3: torch.OutOfMemoryError: CUDA out of memory.")


def test_a_traceback_without_rank_tags_is_quoted_as_is() -> None:
    # Plain mpirun forwards a program's output untagged.
    log = (
        "Traceback (most recent call last):\n"
        '  File "/app/train.py", line 9, in <module>\n'
        "    raise RuntimeError('CUDA error: an illegal memory access was encountered')\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "--------------------------------------------------------------------------\n"
    )
    found = rank_error(log)
    assert found == RankError("RuntimeError: CUDA error: an illegal memory access was encountered")


@pytest.mark.parametrize(
    "log",
    [
        "",
        MPIRUN_BAD_INPUT.replace("[1,0]<stderr>:error: --batch-size", "[1,0]<stderr>:note: --batch-size"),
        # Only horovodrun's own report that a rank exited: it says nothing of why, the exit code says as much.
        GLOO_NO_GPU.replace("error: rn50", "warning: rn50"),
        # Indented text that is no traceback (mpirun's banner) and an error-looking line in prose.
        "  Process name: [[41645,1],0]\n  Exit code:    2\nValueError: not after a traceback\n",
    ],
)
def test_a_log_with_no_error_line_gives_nothing(log: str) -> None:
    assert rank_error(log) is None


def test_a_sas_url_or_key_in_the_line_never_reaches_the_message() -> None:
    sig = "AbC%2Bdef%2Fghi%3D"
    log = (
        "[1,0]<stderr>:error: --data-dir: cannot list https://acct.blob.core.windows.net/imagenet/train?"
        f"sv=2023-01-03&se=2026-05-01T13%3A00%3A00Z&sr=c&sp=rl&sig={sig}: 403 AuthenticationFailed "
        "(DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0a2V5PT0=;EndpointSuffix=x)\n"
    )
    found = rank_error(log)
    assert found is not None
    assert sig not in found.text and "c2VjcmV0a2V5PT0" not in found.text
    assert found.text == (
        "error: --data-dir: cannot list https://acct.blob.core.windows.net/imagenet/train?"
        "sv=2023-01-03&se=2026-05-01T13%3A00%3A00Z&sr=c&sp=rl&sig=REDACTED: 403 "
        "AuthenticationFailed (DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=REDACTED;"
        "EndpointSuffix=x)"
    )


def test_a_long_line_is_capped_and_a_secret_at_the_cut_is_still_blanked() -> None:
    found = rank_error("[0]<stderr>:error: " + "x" * 5000 + "?sig=" + "s" * 5000)
    assert found is not None and len(found.text) == MAX_CHARS and found.text.endswith("...")
    found = rank_error("[0]<stderr>:error: " + "x" * (4 * MAX_CHARS - 30) + " ?sv=1&sig=" + "s" * 500)
    assert found is not None and "sss" not in found.text


@pytest.mark.parametrize(
    ("line", "described"),
    [
        # horovodrun --prefix-output-with-timestamp
        (
            "Tue Nov 22 03:00:00 2026[2]<stderr>:error: rank 2: x.JPEG: cannot decode",
            "rank 2: error: rank 2:",
        ),
        # mpirun glued the next line's tag to this one
        ("[1,4]<stderr>:error: rank 4: x.JPEG: cannot decode[1,4]<stderr>:", "rank 4: error: rank 4:"),
        # untagged, the rank named by the line itself
        ("error: rank 5: x.JPEG: cannot decode", "rank 5: error: rank 5:"),
        # the launcher script's own failure, and terminal colours
        (
            "\x1b[31mdtjob: MPI host rn50-worker-1.rn50-workers does not resolve after 120 s\x1b[0m",
            "dtjob: MPI",
        ),
        # rank 0's results upload after horovodrun (dtjob.stager, through ssh: no tag)
        ("upload failed: the output SAS was denied (403)", "upload failed: the output SAS"),
    ],
)
def test_tags_timestamps_and_colours_are_stripped(line: str, described: str) -> None:
    found = rank_error(f"starting\n{line}\n")
    assert found is not None and found.describe().startswith(described), found
    assert "<stderr>" not in found.text and "\x1b" not in found.text


# --- decide: the message and the event -------------------------------------------------------------------


def failed_launcher(exit_code: int, log_error: RankError | None) -> LauncherState:
    failed = PodState(
        "rn50-launcher-x", "launcher", 0, None, "Failed", scheduled=True, ready=False, deleting=False,
        reason=f"Error, exit code {exit_code}", exit_code=exit_code, termination_reason="Error",
    )  # fmt: skip
    return LauncherState(
        0, deleting=False, running=False, succeeded=False, failed=True, pod_name=failed.name,
        reason=failed.reason, failed_pod=failed, log_error=log_error,
    )  # fmt: skip


def running_world(launcher: LauncherState) -> Observed:
    workers = tuple(
        PodState(f"rn50-worker-{i}", "worker", 0, i, "Running", scheduled=True, ready=True, deleting=False)
        for i in range(2)
    )
    return Observed(pods=workers, launcher=launcher)


def running() -> JobStatus:
    return JobStatus(phase="Running", start_time=format_time(NOW - timedelta(minutes=10)), launcher_pod="x")


def test_decide_quotes_the_ranks_line_and_its_pod_in_the_restart_message_and_event() -> None:
    quoted = rank_error(GLOO_NO_GPU)
    d = decide(
        job_spec(runPolicy={"backoffLimit": 3}), running_world(failed_launcher(3, quoted)), running(), NOW
    )
    assert d.status.phase == "Restarting"
    expected = (
        f"launcher pod rn50-launcher-x failed: Error, exit code 3: rank 1 (pod rn50-worker-0): "
        f"error: rn50-worker-0 local rank 1: {NO_GPU}; restarting the world (restart 1 of 3)"
    )
    assert d.status.message == expected
    restarting = d.status.condition("Restarting")
    assert restarting is not None and restarting.message == expected
    assert Event("Warning", "LauncherFailed", expected) in d.events


def test_decide_quotes_the_line_when_an_exit_code_fails_the_job_for_good() -> None:
    spec = job_spec(runPolicy={"restartPolicy": "ExitCode", "backoffLimit": 3})
    d = decide(spec, running_world(failed_launcher(2, rank_error(MPIRUN_BAD_INPUT))), running(), NOW)
    failed = d.status.condition("Failed")
    assert d.status.phase == "Failed" and failed is not None
    assert failed.message.startswith(
        "launcher pod rn50-launcher-x failed: Error, exit code 2: rank 0: error: --batch-size 512: larger "
    )
    assert "; exit code 2 is permanent under runPolicy.restartPolicy ExitCode" in failed.message
    assert any(e.reason == "LauncherFailed" and "error: --batch-size 512" in e.message for e in d.events)


def test_without_a_line_the_message_is_the_pods_reason_alone() -> None:
    d = decide(
        job_spec(runPolicy={"backoffLimit": 3}), running_world(failed_launcher(1, None)), running(), NOW
    )
    assert d.status.message == (
        "launcher pod rn50-launcher-x failed: Error, exit code 1; restarting the world (restart 1 of 3)"
    )


# --- observe: the failed launcher's log, read once --------------------------------------------------------


def launcher_children(attempt: int = 0, legacy: bool = False) -> Children:
    """The job's failed launcher: its own pod, or (`legacy`) the pod of a launcher Job an earlier release of
    the operator made, which has a generated name."""
    labels = {"dtjob.io/role": "launcher", "dtjob.io/attempt": str(attempt)}
    ended = {"name": "launcher", "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}
    job_uid = job_body()["metadata"]["uid"]
    pod: dict[str, Any] = {
        "metadata": {"name": "rn50-launcher", "labels": labels, "ownerReferences": [{"uid": job_uid}]},
        "status": {"phase": "Failed", "containerStatuses": [ended]},
    }
    if not legacy:
        return Children(pods=(pod,))
    pod["metadata"] = {
        **pod["metadata"],
        "name": "rn50-launcher-x",
        "ownerReferences": [{"uid": "launcher-uid"}],
    }
    meta = {"name": "rn50-launcher", "uid": "launcher-uid", "labels": {"dtjob.io/attempt": str(attempt)},
            "ownerReferences": [{"uid": job_uid}]}  # fmt: skip
    return Children(pods=(pod,), launcher={"metadata": meta, "status": {}})


def observe_failed(kube: RecordingKube, prev: JobStatus, attempt: int = 0, legacy: bool = False) -> Observed:
    return observe(kube, CONFIG, job_spec(), job_body(), prev, launcher_children(attempt, legacy), NOW)


@pytest.mark.parametrize("pod", ["rn50-launcher", "rn50-launcher-x"])
def test_observe_reads_the_failed_launchers_log_tail_for_the_line(pod: str) -> None:
    kube = RecordingKube(logs={pod: "noise\n" * 500 + GLOO_NO_GPU})
    observed = observe_failed(kube, running(), legacy=pod != "rn50-launcher")
    assert observed.launcher is not None and observed.launcher.failed
    assert observed.launcher.log_error == rank_error(GLOO_NO_GPU)
    assert kube.calls.count(("read-log", "Pod", pod)) == 1
    assert GLOO_NO_GPU.count("\n") < FAILURE_TAIL_LINES  # the banner and traceback after the line fit


def test_a_log_that_cannot_be_read_leaves_the_message_as_the_pod_says() -> None:
    observed = observe_failed(RecordingKube(), running())  # pods/log answers 404
    assert observed.launcher is not None and observed.launcher.failed and observed.launcher.log_error is None


def test_a_failed_launcher_of_an_older_world_is_not_read_for_an_error() -> None:
    # Restarting: the old world's launcher is still there, and the next world's message is not about it.
    kube = RecordingKube(logs={"rn50-launcher": GLOO_NO_GPU})
    prev = JobStatus(phase="Restarting", start_time=format_time(NOW - timedelta(minutes=10)), restarts=1)
    observed = observe_failed(kube, prev, attempt=0)
    assert observed.launcher is not None and observed.launcher.log_error is None


# A torchrun worker's own log (dtjob.desired.torchrun): torchrun's banner, the failing rank's traceback tagged
# by torch.distributed once its process group exists, then the agent's report of the exit.
TORCHRUN_WORKER = """\
W1129 12:47:28.451000 6719 torch/distributed/run.py:874] *****************************************
[rank1]: Traceback (most recent call last):
[rank1]:   File "/tmp/train.py", line 5, in <module>
[rank1]:     raise ValueError("shard 1 of the training set is missing")
[rank1]: ValueError: shard 1 of the training set is missing
W1129 12:47:29.968000 6719 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 6723 closing
E1129 12:47:30.000000 6719 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) rank 1
Traceback (most recent call last):
  File "<string>", line 5, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def test_a_torchrun_ranks_tagged_traceback_gives_its_rank_and_line_not_torchruns_report() -> None:
    found = rank_error(TORCHRUN_WORKER)
    assert found == RankError("ValueError: shard 1 of the training set is missing", rank=1)
    # Without the rank's own lines, torchrun's report says only that a rank exited: no line at all.
    report_only = "\n".join(TORCHRUN_WORKER.splitlines()[5:])
    assert rank_error(report_only) is None
