"""An elastic torchrun world on the real node (spec.torchrun with spec.elastic): worker 1's pod deleted
mid-training with a grace period, as a spot eviction does, while its node takes no new pod. The other agents
re-rendezvous without it (torchrun's c10d rendezvous, its store on worker 0), and the DDP trainer resumes
from its last on-disk commit at the smaller size, with no counted restart; the operator replaces the worker,
whose agent joins once the node takes pods again, and the world grows back and finishes every planned step
with identical weights on every rank. Measured and printed: seconds from the deletion to training at the
smaller size, from the replacement being Ready to it training, and the steps redone.

Timings come from rank 0's progress records (`updatedAt`, one per step) in worker 0's log and the pods'
conditions, all on this machine's clock.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from testbed.azurite import Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from tests.e2e.real_jobs import (
    at,
    create_tiny_job,
    new_container,
    paced_workers,
    pod_logs,
    progress_in,
    run_metrics,
    tiny_model,
    tiny_training,
    wait_finished,
)
from tests.e2e.test_real_elastic import (
    cordoned,
    evict_worker,
    first_at_size,
    replacement_ready,
    trained_to,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

# resnet-tiny on workers limited to a quarter of a core (paced_workers), as the Horovod world
# (test_real_elastic.py). DDP trains fast there: 18 steps a second at 2 ranks and batch 2 in CI, where 400
# steps ended before the replacement joined. Each resize restarts every rank's process (its imports
# included), and the replacement's pod must start: batch 32 costs each step some 1.6 times as much CPU,
# and the steps below keep the smaller world training for minutes at that pace.
STEPS = 2000
BATCH = 32
COMMIT_EVERY = 20
LOG_EVERY = 5
FULL = 3


def rank0_records(jobs: Jobs, name: str) -> list[dict[str, Any]]:
    """Every progress record rank 0 printed so far, from worker 0's live log (rank 0 always runs there);
    none before its container starts."""
    try:
        return progress_in(jobs.core.read_namespaced_pod_log(f"{name}-worker-0", jobs.ns, container="worker"))
    except ApiException:
        return []


def regrown_after(jobs: Jobs, name: str, joined_at: float) -> dict[str, Any] | None:
    """Rank 0's first record in the full world after the replacement was Ready; fails at once if the
    smaller world trained the last step (the run was too short for this machine to show a regrowth)."""
    records = rank0_records(jobs, name)
    ended = [r for r in records if int(r["step"]) == STEPS and r["worldSize"] < FULL]
    assert not ended, f"the smaller world trained the last step before the replacement joined: {ended[-1]}"
    return first_at_size(records, FULL, joined_at)


def shrank_and_grew_back(sizes: list[int]) -> bool:
    """The world trained at 3 ranks, then at 2, then at 3 again (the processes' starts, in order; a
    straggler's agent at the first rendezvous may add a start at 2 before the first at 3)."""
    after_full = sizes[sizes.index(FULL) :] if FULL in sizes else []
    return FULL - 1 in after_full and sizes[-1] == FULL


def test_an_elastic_torchrun_world_loses_a_worker_trains_on_and_grows_back_without_a_restart(
    real_jobs: Jobs,
    real_operator: OperatorProcess,
    node_azurite: Azurite,
    capsys: pytest.CaptureFixture[str],
) -> None:
    container = new_container(node_azurite)
    name = "elastic-ddp"
    create_tiny_job(
        real_jobs, name, node_azurite, container, workers=3, torchrun={},
        elastic={"minWorkers": 2, "maxWorkers": 3, "commitEverySteps": COMMIT_EVERY},
        hyperparameters=tiny_training(stepsPerEpoch=STEPS, batchSizePerGpu=BATCH, logInterval=LOG_EVERY),
        **tiny_model(torchrun=True), **paced_workers(),
    )  # fmt: skip
    wait_for(
        lambda: trained_to(real_jobs, name, rank0_records, FULL, 6),
        timeout=600, interval=0.5, what=f"{name} training",
    )  # fmt: skip
    worker_0 = str(real_jobs.core.read_namespaced_pod(f"{name}-worker-0", real_jobs.ns).metadata.uid)
    node = str(real_jobs.core.read_namespaced_pod(f"{name}-worker-1", real_jobs.ns).spec.node_name)
    with cordoned(real_jobs, node):
        deleted_at, old_uid = evict_worker(real_jobs, name)
        smaller = wait_for(
            lambda: first_at_size(rank0_records(real_jobs, name), FULL - 1, deleted_at),
            timeout=240, interval=1, what=f"{name} training at 2 ranks",
        )  # fmt: skip
    try:
        joined_at = wait_for(
            lambda: replacement_ready(real_jobs, name, old_uid), timeout=180, interval=0.5,
            what="the replacement Ready",
        )  # fmt: skip
        regrown = wait_for(
            lambda: regrown_after(real_jobs, name, joined_at), timeout=240, interval=1,
            what=f"{name} training at 3 ranks again",
        )  # fmt: skip
    except AssertionError as err:
        raise AssertionError(f"{err}\n{pod_logs(real_jobs, name, node_azurite, container)}") from None
    # The same worker 0 (the rendezvous store, rank 0) all along.
    assert str(real_jobs.core.read_namespaced_pod(f"{name}-worker-0", real_jobs.ns).metadata.uid) == worker_0
    status = wait_finished(real_jobs, name, timeout=900, azurite=node_azurite, container=container)
    finished_after = time.time() - deleted_at

    # No counted restart, and the loss said as an event.
    assert status["restarts"] == 0, json.dumps(status, indent=1)
    said = [str(e.reason) for e in real_jobs.events(name)]
    assert "WorkerLost" in said and "Restarting" not in said, said
    metrics = run_metrics(node_azurite, container, real_jobs, name)
    assert shrank_and_grew_back(metrics["worldSizes"]), metrics
    assert metrics["runner"] == "torchrun" and metrics["weightsConsistent"] is True, metrics
    assert metrics["globalStep"] == STEPS, metrics
    # Each start (the shrink, the growth) resumed from the last commit: at most COMMIT_EVERY steps redone.
    restarts = len(metrics["worldSizes"]) - 1
    assert 0 <= metrics["stepsRedone"] <= COMMIT_EVERY * restarts, metrics
    with capsys.disabled():  # in the run's output even when the test passes
        print(
            f"\n[e2e] elastic torchrun: training at 2 ranks {at(smaller) - deleted_at:.1f}s after the pod's "
            f"deletion; the replacement training {at(regrown) - joined_at:.1f}s after it was Ready; "
            f"{metrics['stepsRedone']} step(s) redone; restarts 0; full again at step {regrown['step']} of "
            f"{STEPS}; finished {finished_after:.0f}s after the deletion"
        )
