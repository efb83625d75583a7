"""spec.torchrun: a PyTorch world under torchrun, no MPI and no SSH, and what such a job cannot have. Pure.

Each worker runs torchrun itself, with its node rank in a fixed world or over spec.elastic's node range in
an elastic one; worker 0's agent hosts the rendezvous store that the others reach through the job's headless
Service. There is no launcher, so nothing of spec.launcher applies,
and the processes per worker are torchrun's --nproc-per-node (spec.slotsPerWorker may only agree).
"""

from __future__ import annotations

from dtjob.spec.model import (
    CUSTOM,
    DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS,
    MAX_RENDEZVOUS_TIMEOUT_SECONDS,
    Torchrun,
)
from dtjob.spec.reader import Reader, SpecError

# The frameworks a torchrun world runs: the PyTorch trainer (with DDP), or the user's own program.
TORCHRUN_FRAMEWORKS = ("pytorch", CUSTOM)
MAX_PROCESSES_PER_WORKER = 256
NO_LAUNCHER = "a torchrun job has no launcher: each worker runs torchrun itself"


def parse_torchrun(spec: Reader, framework: str, gpus: int) -> Torchrun:
    """spec.torchrun with its defaults; refuses, naming the field, what a torchrun world cannot have."""
    r = spec.child("torchrun")
    if framework not in TORCHRUN_FRAMEWORKS:
        raise SpecError(
            "spec.framework",
            f"must be {' or '.join(TORCHRUN_FRAMEWORKS)} with spec.torchrun (torchrun starts PyTorch "
            f"processes), got {framework}",
        )
    for path in ("launcher",):
        if spec.has(path):
            raise SpecError(f"spec.{path}", f"must be left out with spec.torchrun: {NO_LAUNCHER}")
    if spec.child("placement").has("launcher"):
        raise SpecError("spec.placement.launcher", f"must be left out with spec.torchrun: {NO_LAUNCHER}")
    processes = r.integer("processesPerWorker", None, minimum=1, maximum=MAX_PROCESSES_PER_WORKER)
    processes = processes or max(gpus, 1)
    slots = spec.integer("slotsPerWorker", None, minimum=1)
    if slots is not None and slots != processes:
        raise SpecError(
            "spec.slotsPerWorker",
            f"must equal spec.torchrun.processesPerWorker ({processes}) or be left out, got {slots}: a "
            "torchrun worker runs that many processes",
        )
    timeout = r.integer(
        "rendezvousTimeoutSeconds",
        DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS,
        minimum=1,
        maximum=MAX_RENDEZVOUS_TIMEOUT_SECONDS,
    )
    return Torchrun(processes, timeout or DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS)
