"""Any MPI program on the real node, as the examples give it: `framework: custom` on CPU workers (no GPU, two
ranks per worker), the mpi image's mpi-world under Open MPI's mpirun and under MPICH's mpiexec.hydra, and a
user's own Horovod script mounted from a ConfigMap into the PyTorch image."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.operator_harness import Jobs, OperatorProcess
from tests.e2e.conftest import IMAGES
from tests.e2e.real_jobs import wait_finished

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# What each MPI says first in MPI_Get_library_version.
LIBRARY = {"OpenMPI": "Open MPI v", "MPICH": "MPICH Version"}


def example(file: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((EXAMPLES / file).read_text()) if doc]


def launcher_log(jobs: Jobs, name: str) -> str:
    pods = jobs.pods(name, "launcher")
    assert pods, f"{name}: no launcher pod left to read"
    return "\n".join(jobs.core.read_namespaced_pod_log(str(p.metadata.name), jobs.ns) for p in pods)


def run_example_job(jobs: Jobs, job: dict[str, Any], **overrides: Any) -> str:
    """Creates the example's job as written but for `overrides`; its launcher's log once it succeeded."""
    name = str(job["metadata"]["name"])
    jobs.create(name, **{**job["spec"], **overrides})
    wait_finished(jobs, name, timeout=480)
    return launcher_log(jobs, name)


@pytest.mark.parametrize("implementation", ["OpenMPI", "MPICH"])
def test_any_mpi_program_runs_under_open_mpi_and_mpich(
    real_jobs: Jobs, real_operator: OperatorProcess, implementation: str
) -> None:
    job = next(
        doc for doc in example("any-mpi-program-cpu.yaml")
        if doc["spec"]["launcher"]["mpiImplementation"] == implementation
    )  # fmt: skip
    name = job["metadata"]["name"]
    args = ["--bytes", "1048576", "--iterations", "5"]
    log = run_example_job(real_jobs, job, image=IMAGES["mpi"], args=args)
    library = re.search(r"^mpi-world: library (.*)$", log, re.M)
    assert library, log
    assert library.group(1).startswith(LIBRARY[implementation]), library.group(1)
    # Four ranks, two on each worker pod, every check passed across the pods.
    assert re.search(r"^mpi-world: ok size=4 hosts=2 allreduce=10 ring=ok bytes=1048576 ", log, re.M), log
    hosts = re.search(r"^mpi-world: hosts (.*)$", log, re.M)
    assert hosts and sorted(hosts.group(1).split()) == [f"{name}-worker-0=2", f"{name}-worker-1=2"], log


def test_a_users_own_horovod_script_from_a_config_map_runs_on_cpu_workers(
    real_jobs: Jobs, real_operator: OperatorProcess
) -> None:
    config_map, job = example("custom-script-cpu.yaml")
    real_jobs.core.create_namespaced_config_map(real_jobs.ns, config_map)  # type: ignore[arg-type]
    small = ["--batch-size", "8", "--image-size", "32", "--num-warmup-batches", "1",
             "--num-batches-per-iter", "2", "--num-iters", "2"]  # fmt: skip
    log = run_example_job(real_jobs, job, image=IMAGES["pytorch"], args=small)
    # horovodrun tags each rank's lines; rank 0 prints the world's figures after an allreduce over both ranks.
    assert "Batch size 8 per rank, 2 ranks, image 32px" in log, log
    assert len(re.findall(r"Iter #\d: [\d.]+ img/sec per CPU", log)) == 2, log
    total = re.search(r"Total img/sec on 2 CPU\(s\): ([\d.]+)", log)
    assert total and float(total.group(1)) > 0, log
