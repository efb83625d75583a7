"""Any Horovod or MPI program: framework custom, a user's command without dtjob_train flags, slots apart from
GPUs, CPU jobs on the CPU pool, and the launcher's command line and hostfile per MPI implementation."""

from __future__ import annotations

from typing import Any

from dtjob.desired.command import mpi_command, training_command
from dtjob.desired.pods import launcher_pod, worker_pod
from dtjob.desired.world import hostfile_text

from tests.unit.operator_fixtures import job_spec

OWNER = {
    "apiVersion": "dtjob.io/v1alpha1",
    "kind": "DistributedTrainingJob",
    "metadata": {"name": "rn50", "uid": "u"},
}
CUSTOM: dict[str, Any] = {"framework": "custom", "image": "ghcr.io/me/bench:1", "command": ["/opt/bench/run"]}


def test_a_users_command_runs_as_given_unless_the_flags_are_asked_for() -> None:
    assert training_command(job_spec(**CUSTOM, args=["--size", "1M"])) == ["/opt/bench/run", "--size", "1M"]
    with_flags = training_command(job_spec(**CUSTOM, appendTrainingFlags=True))
    assert with_flags[0] == "/opt/bench/run" and "--batch-size" in with_flags
    # The built-in trainer keeps its flags; args still replace them.
    assert "--batch-size" in training_command(job_spec())
    assert training_command(job_spec(args=["--epochs", "9"]))[-2:] == ["--epochs", "9"]


def test_slots_are_apart_from_gpus_and_a_cpu_job_goes_to_the_cpu_pool() -> None:
    spec = job_spec(**CUSTOM, gpusPerWorker=0, slotsPerWorker=3, workers=2)
    assert spec.total_slots == 6
    assert mpi_command(spec)[:3] == ["horovodrun", "-np", "6"]
    assert hostfile_text(spec).splitlines()[0].endswith(" slots=3")
    pod = worker_pod(spec, OWNER, 0, 0)
    container = pod["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in str(container.get("resources"))
    assert "nodeSelector" not in pod["spec"]  # the default CPU pool (""): any node it tolerates
    assert not any(t.get("key") == "sku" for t in pod["spec"].get("tolerations") or [])
    # A GPU job keeps one slot per GPU by default, on the GPU pool.
    gpu = job_spec(gpusPerWorker=4)
    assert gpu.slots_per_worker == 4
    assert worker_pod(gpu, OWNER, 0, 0)["spec"]["nodeSelector"] == {"kubernetes.azure.com/agentpool": "gpu"}


def test_each_mpi_implementation_gets_its_launcher_and_hostfile() -> None:
    def spec(impl: str) -> Any:
        return job_spec(
            **CUSTOM,
            gpusPerWorker=0,
            slotsPerWorker=2,
            launcher={"runner": "mpirun", "mpiImplementation": impl},
        )

    openmpi = spec("OpenMPI")
    assert mpi_command(openmpi)[:4] == ["mpirun", "--allow-run-as-root", "-np", "4"]
    assert hostfile_text(openmpi).splitlines() == [
        "rn50-worker-0.rn50-workers.ml.svc slots=2",
        "rn50-worker-1.rn50-workers.ml.svc slots=2",
    ]
    mpich = spec("MPICH")
    cmd = mpi_command(mpich)
    assert cmd[:9] == ["mpiexec.hydra", "-n", "4", "-f", "/etc/mpi/hostfile", "-bootstrap", "ssh", "-iface",
                       "eth0"]  # fmt: skip
    assert cmd[-1] == "/opt/bench/run"
    assert hostfile_text(mpich).splitlines()[0] == "rn50-worker-0.rn50-workers.ml.svc:2"
    assert mpi_command(spec("IntelMPI"))[0] == "mpirun" and "-bootstrap" in mpi_command(spec("IntelMPI"))
    # horovodrun reads Open MPI's hostfile whatever the image's MPI.
    horovod = job_spec(**CUSTOM, launcher={"mpiImplementation": "MPICH"})
    assert " slots=" in hostfile_text(horovod)
    assert "mpiexec.hydra" in launcher_pod(mpich, OWNER, 0)["spec"]["containers"][0]["command"][-1]
