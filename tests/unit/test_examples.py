"""Every example's DistributedTrainingJob passes the operator's own checks (the API server's schema is checked
in tests/integration), and the CPU examples build the pods they promise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from dtjob.desired.command import mpi_command
from dtjob.desired.pods import worker_pod

from tests.unit.operator_fixtures import job_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def jobs_in(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return [d for d in docs if d.get("kind") == "DistributedTrainingJob"]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_job_passes_the_operators_checks(path: Path) -> None:
    jobs = jobs_in(path)
    assert jobs, f"{path.name} holds no DistributedTrainingJob"
    for job in jobs:
        assert job_spec(**job["spec"]).total_slots > 0


def test_the_any_mpi_program_example_runs_mpi_world_on_cpu_under_each_mpi() -> None:
    launchers = {}
    for job in jobs_in(EXAMPLES / "any-mpi-program-cpu.yaml"):
        spec = job_spec(**job["spec"])
        assert spec.gpus_per_worker == 0 and spec.total_slots == 4
        pod = worker_pod(spec, {"metadata": {"name": "x", "uid": "u"}}, 0, 0)
        assert "nvidia.com/gpu" not in str(pod["spec"]["containers"][0].get("resources"))
        launchers[spec.launcher.mpi_implementation] = mpi_command(spec)
    assert launchers["OpenMPI"][0] == "mpirun" and launchers["OpenMPI"][-5].endswith("mpi-world.openmpi")
    assert launchers["MPICH"][0] == "mpiexec.hydra" and launchers["MPICH"][-5].endswith("mpi-world.mpich")


def test_the_custom_script_example_mounts_the_script_on_every_worker() -> None:
    (job,) = jobs_in(EXAMPLES / "custom-script-cpu.yaml")
    spec = job_spec(**job["spec"])
    pod = worker_pod(spec, {"metadata": {"name": "x", "uid": "u"}}, 1, 0)
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["benchmark"] == "/opt/benchmark"
    assert any(v["name"] == "benchmark" and v["configMap"]["name"] == "my-benchmark-script"
               for v in pod["spec"]["volumes"])  # fmt: skip
    assert mpi_command(spec)[-len(job["spec"]["args"]) - 2 :][:2] == ["python", "/opt/benchmark/benchmark.py"]


@pytest.mark.parametrize("path", sorted(EXAMPLES.rglob("*.yaml")), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_example_job_fails_rather_than_waits_forever_for_a_world(path: Path) -> None:
    for job in jobs_in(path):
        assert job_spec(**job["spec"]).run_policy.startup_deadline_seconds, (
            f"{path.name}: no startup deadline"
        )
