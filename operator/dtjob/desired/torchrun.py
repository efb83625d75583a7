"""A torchrun world's worker: no sshd and no launcher. Each worker runs torchrun, with its node rank in a
fixed world (static rendezvous) or over spec.elastic's node range (c10d rendezvous); worker 0's agent hosts
the rendezvous store (a c10d TCPStore) at worker 0's name in the job's headless Service; rank 0 runs on
worker 0, which uploads the results after training. Pure.
"""

from __future__ import annotations

import shlex

from dtjob import names
from dtjob.desired.command import results_upload_command, training_command, wait_for_hosts
from dtjob.desired.common import OUTPUT_DIR, SSH_PORT
from dtjob.names import run_prefix
from dtjob.spec.parse import JobSpec

# torchrun's usual rendezvous port; the job's NetworkPolicy admits only the job's own pods to it.
RENDEZVOUS_PORT = 29400
# How many times an elastic world's agent restarts its processes after a failure (a peer lost) before it
# gives up; the operator's restarts (runPolicy.backoffLimit) count past that.
ELASTIC_AGENT_RESTARTS = 10
# Once minWorkers agents are at an elastic rendezvous, how long it waits for more before the world forms
# (torchrun's default is 30 s): each loss would idle the survivors that long.
LAST_CALL_SECONDS = 10
# torch 2.13's agents share one store with the ranks, whose address rank 0's agent publishes only in the
# first rendezvous round: an agent that joins a later round (a replacement) waits for it until it fails.
# Unshared, every round's rank 0 publishes its own.
UNSHARED_STORE = "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1\n"
# torchrun itself exits 1 whatever ended a rank; this runs the same torchrun (torch.distributed.run) and exits
# with the code of the first rank that failed (128 + the signal that killed one), so the pod's exit code is
# the rank's, which runPolicy.restartPolicy ExitCode judges as it judges an MPI launcher's.
TORCHRUN = """import sys
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main
try:
    main(sys.argv[1:])
except ChildFailedError as failed:
    code = failed.get_first_failure()[1].exitcode
    sys.exit(128 - code if code < 0 else code or 1)
"""


def service_port(spec: JobSpec) -> tuple[str, int]:
    """The port the workers' headless Service names: the rendezvous of a torchrun world, else sshd's."""
    return ("rendezvous", RENDEZVOUS_PORT) if spec.torchrun is not None else ("ssh", SSH_PORT)


def rendezvous_host(spec: JobSpec) -> str:
    """Worker 0's name, published by the operator in the headless Service once its pod runs."""
    return names.host_fqdn(names.worker_name(spec.name, 0), spec.name, spec.namespace)


def rendezvous_id(uid: str, attempt: int) -> str:
    """Unique to the job's attempt: an agent of an older world never joins a newer one's rendezvous."""
    return f"{uid or 'job'}-{attempt}"


def torchrun_command(spec: JobSpec, index: int, uid: str, attempt: int) -> list[str]:
    """torchrun for worker `index`: the processes per worker and the rendezvous at worker 0, fixed or
    elastic; the training command (the trainer under DDP, or the user's program) follows --no-python."""
    assert spec.torchrun is not None
    elastic = spec.elastic is not None
    rendezvous = _elastic_rendezvous(spec, index) if elastic else _fixed_rendezvous(spec, index)
    return [
        "python", "-c", TORCHRUN,
        *rendezvous,
        "--nproc-per-node", str(spec.torchrun.processes_per_worker),
        "--rdzv-id", rendezvous_id(uid, attempt),
        "--no-python",
        *training_command(spec),
    ]  # fmt: skip


def _fixed_rendezvous(spec: JobSpec, index: int) -> list[str]:
    """Static rendezvous: every worker knows its node rank, and worker 0 (node rank 0) hosts the store."""
    assert spec.torchrun is not None
    return [
        "--nnodes", str(spec.workers),
        "--node-rank", str(index),
        "--rdzv-backend", "static",
        "--rdzv-conf", f"timeout={spec.torchrun.rendezvous_timeout_seconds}",
        "--master-addr", rendezvous_host(spec),
        "--master-port", str(RENDEZVOUS_PORT),
        # A failed process fails the pod: restarting the world is the operator's (runPolicy.backoffLimit).
        "--max-restarts", "0",
    ]  # fmt: skip


def _elastic_rendezvous(spec: JobSpec, index: int) -> list[str]:
    """The c10d rendezvous over spec.elastic's node range, its store hosted by worker 0's agent. The ranks
    follow the sorted --local-addr, and worker names sort worker 0 first, so rank 0 stays on worker 0 (whose
    pod keeps the checkpoints and uploads the results) however the world re-forms."""
    assert spec.torchrun is not None and spec.elastic is not None
    timeout = spec.torchrun.rendezvous_timeout_seconds
    host = "true" if index == 0 else "false"
    return [
        "--nnodes", f"{spec.elastic.min_workers}:{spec.elastic.max_workers}",
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{rendezvous_host(spec)}:{RENDEZVOUS_PORT}",
        "--rdzv-conf", f"join_timeout={timeout},last_call_timeout={LAST_CALL_SECONDS},is_host={host}",
        "--local-addr", names.host_fqdn(names.worker_name(spec.name, index), spec.name, spec.namespace),
        # Each peer lost costs every other agent one restart of its processes (a peer that joins costs
        # none); past these, the agent fails its pod and the world restarts, counted (runPolicy).
        "--max-restarts", str(ELASTIC_AGENT_RESTARTS),
    ]  # fmt: skip


def _wait_for_rendezvous_host(spec: JobSpec) -> str:
    """Worker 0's name resolves once the operator publishes its pod, which can be after this worker starts:
    wait for it (bounded by the rendezvous timeout), then fail naming it. Images without getent skip this."""
    assert spec.torchrun is not None
    host = shlex.quote(rendezvous_host(spec))
    return wait_for_hosts(host, "the rendezvous host", spec.torchrun.rendezvous_timeout_seconds)


# torchrun as a child, so the pod's SIGTERM (a deletion, an eviction) reaches its agent, which stops the
# processes; `wait` returns early when the trap runs, so it waits again for the agent's own exit code. Its
# Python is the image's python3, else python (torch's own images have both; some only one).
def _run_then(command: list[str], after: str) -> str:
    program, *args = command
    assert program == "python"
    return f"""python=$(command -v python3 || command -v python || echo python)
"$python" {shlex.join(args)} &
agent=$!
trap 'kill -TERM "$agent" 2>/dev/null' TERM
wait "$agent"
code=$?
if kill -0 "$agent" 2>/dev/null; then wait "$agent"; code=$?; fi
[ "$code" -eq 0 ] || exit "$code"
{after}"""


# After an upload that failed for good (its last line says so, and the operator reads it from this pod's log):
# the pod stays, and with it the results in its output directory, until `dtjob results upload` uploads them
# or the job is deleted; the operator fails the job ResultsUploadFailed and keeps this pod.
KEEP_RESULTS = """trap 'kill "$!" 2>/dev/null; exit 143' TERM
while :; do sleep 3600 & wait $!; done
"""


def torchrun_worker_script(spec: JobSpec, index: int, uid: str, attempt: int) -> str:
    """The worker's shell: wait for the rendezvous name, run torchrun, and on worker 0 (rank 0's) upload the
    results with spec.output, keeping them on the pod when that upload failed for good."""
    command = torchrun_command(spec, index, uid, attempt)
    upload = ""
    if index == 0 and spec.output is not None:
        prefix = run_prefix(spec.output.target.prefix, spec.namespace, spec.name, uid)
        retry = spec.output.upload_retry_seconds
        upload = shlex.join(results_upload_command(spec.name, OUTPUT_DIR, prefix, retry))
        upload = f"{upload} && exit 0\n{KEEP_RESULTS}"
    unshared = UNSHARED_STORE if spec.elastic is not None else ""
    return unshared + _wait_for_rendezvous_host(spec) + _run_then(command, upload)
