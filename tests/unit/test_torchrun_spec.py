"""spec.torchrun: its defaults (the processes per worker follow the GPUs, and the ranks follow them), what a
torchrun job cannot have (each refusal names its field), and what each rank runs under torchrun."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob.desired.command import training_command
from dtjob.spec.parse import SpecError

from tests.unit.operator_fixtures import job_spec

CUSTOM = {"framework": "custom", "image": "ghcr.io/me/ddp:1", "command": ["./train", "--epochs", "3"]}


def test_processes_per_worker_default_to_the_gpus_and_the_ranks_follow() -> None:
    spec = job_spec(torchrun={})
    assert spec.torchrun is not None
    assert spec.torchrun.processes_per_worker == 4  # gpusPerWorker 4
    assert spec.slots_per_worker == 4 and spec.total_slots == 8
    assert spec.torchrun.rendezvous_timeout_seconds == 900


def test_a_cpu_world_runs_one_process_per_worker() -> None:
    spec = job_spec(gpusPerWorker=0, torchrun={})
    assert spec.torchrun is not None and spec.torchrun.processes_per_worker == 1
    assert spec.slots_per_worker == 1 and spec.total_slots == 2


def test_the_processes_and_timeout_given_are_kept_and_set_the_ranks() -> None:
    spec = job_spec(
        workers=3, gpusPerWorker=2, torchrun={"processesPerWorker": 8, "rendezvousTimeoutSeconds": 60}
    )
    assert spec.torchrun is not None
    assert (spec.torchrun.processes_per_worker, spec.torchrun.rendezvous_timeout_seconds) == (8, 60)
    assert spec.slots_per_worker == 8 and spec.total_slots == 24
    # spec.slotsPerWorker may be given when it agrees.
    agreed = job_spec(slotsPerWorker=2, torchrun={"processesPerWorker": 2})
    assert agreed.slots_per_worker == 2 and agreed.total_slots == 4
    # Without spec.torchrun nothing changes: an MPI world, slots per GPU.
    mpi = job_spec()
    assert mpi.torchrun is None and mpi.slots_per_worker == 4


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"framework": "tensorflow"}, "spec.framework"),
        ({"framework": "keras"}, "spec.framework"),
        ({"launcher": {"runAsWorker": True}}, "spec.launcher"),
        ({"launcher": {"podLabels": {"team": "ml"}}}, "spec.launcher"),
        ({"placement": {"launcher": {"nodePool": "tools"}}}, "spec.placement.launcher"),
        ({"slotsPerWorker": 2}, "spec.slotsPerWorker"),  # 4 GPUs: torchrun starts 4 processes
        ({"slotsPerWorker": 3, "torchrun": {"processesPerWorker": 2}}, "spec.slotsPerWorker"),
        ({"torchrun": {"processesPerWorker": 0}}, "spec.torchrun.processesPerWorker"),
        ({"torchrun": {"processesPerWorker": 257}}, "spec.torchrun.processesPerWorker"),
        ({"torchrun": {"processesPerWorker": "4"}}, "spec.torchrun.processesPerWorker"),
        ({"torchrun": {"rendezvousTimeoutSeconds": 0}}, "spec.torchrun.rendezvousTimeoutSeconds"),
    ],
)
def test_what_a_torchrun_job_cannot_have_is_refused_naming_the_field(
    changes: dict[str, Any], path: str
) -> None:
    body: dict[str, Any] = {"torchrun": {}, **changes}
    with pytest.raises(SpecError) as info:
        job_spec(**body)
    assert info.value.path == path
    assert str(info.value).startswith(path + ":")


def test_the_same_fields_are_fine_without_torchrun() -> None:
    # The refusals above come from spec.torchrun, not from the fields themselves.
    job_spec(framework="tensorflow")
    job_spec(launcher={"runAsWorker": True})
    job_spec(placement={"launcher": {"nodePool": "tools"}})
    job_spec(elastic={"minWorkers": 1, "maxWorkers": 4})
    job_spec(slotsPerWorker=2)


def test_the_largest_world_per_worker_is_accepted() -> None:
    spec = job_spec(torchrun={"processesPerWorker": 256})
    assert spec.torchrun is not None and spec.torchrun.processes_per_worker == 256


def test_pytorch_ranks_run_the_ddp_trainer_under_torchrun() -> None:
    command = training_command(job_spec(torchrun={}))
    assert command[:3] == ["python", "-m", "dtjob_train.ddp"]
    assert "--batch-size" in command  # the trainer's flags built from the spec follow
    # Without torchrun the Horovod trainer runs.
    assert training_command(job_spec())[:3] == ["python", "-m", "dtjob_train.pytorch"]


def test_a_custom_command_is_kept_as_given_under_torchrun() -> None:
    spec = job_spec(torchrun={}, args=["--lr", "0.1"], **CUSTOM)
    assert training_command(spec) == ["./train", "--epochs", "3", "--lr", "0.1"]
