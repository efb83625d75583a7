"""spec.elastic: Horovod Elastic's bounds, and what an elastic job cannot have. Pure.

Horovod Elastic runs on horovodrun's Gloo controller only (it resizes the world without mpirun), so an
elastic job needs runner horovodrun with the default MPI, no mpiArgs (Gloo reads none), and a launcher that
runs no ranks itself (the world's hosts are the workers the discovery script finds).
"""

from __future__ import annotations

from dtjob.spec.model import DEFAULT_ELASTIC_TIMEOUT_SECONDS, Elastic, Launcher
from dtjob.spec.reader import Reader, SpecError

MAX_TIMEOUT_SECONDS = 86400
MAX_COMMIT_EVERY_STEPS = 100000
GLOO_ONLY = "Horovod Elastic runs on horovodrun's Gloo controller, not over mpirun"


def parse_elastic(r: Reader, workers: int, max_workers: int) -> Elastic:
    """spec.elastic, checked against spec.workers: 1 <= minWorkers <= workers <= maxWorkers."""
    low = r.integer("minWorkers", None, minimum=1, maximum=max_workers)
    high = r.integer("maxWorkers", None, minimum=1, maximum=max_workers)
    if low is None:
        raise SpecError(r.at("minWorkers"), "is required")
    if high is None:
        raise SpecError(r.at("maxWorkers"), "is required")
    if low > workers:
        raise SpecError(r.at("minWorkers"), f"must be <= spec.workers ({workers}), got {low}")
    if high < workers:
        raise SpecError(r.at("maxWorkers"), f"must be >= spec.workers ({workers}), got {high}")
    timeout = r.integer(
        "timeoutSeconds", DEFAULT_ELASTIC_TIMEOUT_SECONDS, minimum=1, maximum=MAX_TIMEOUT_SECONDS
    )
    commit = r.integer("commitEverySteps", None, minimum=1, maximum=MAX_COMMIT_EVERY_STEPS)
    return Elastic(low, high, timeout or DEFAULT_ELASTIC_TIMEOUT_SECONDS, commit)


def check_elastic_launcher(launcher: Launcher) -> None:
    """Refuses what Horovod Elastic cannot run, naming the field."""
    if launcher.runner != "horovodrun":
        raise SpecError("spec.launcher.runner", f"must be horovodrun with spec.elastic: {GLOO_ONLY}")
    if launcher.mpi_implementation != "OpenMPI":
        raise SpecError(
            "spec.launcher.mpiImplementation", f"must be left at OpenMPI with spec.elastic: {GLOO_ONLY}"
        )
    if launcher.mpi_args:
        raise SpecError("spec.launcher.mpiArgs", f"must be empty with spec.elastic: {GLOO_ONLY}")
    if launcher.run_as_worker:
        raise SpecError(
            "spec.launcher.runAsWorker",
            "must be false with spec.elastic: the elastic world's hosts are the workers that are Ready",
        )
