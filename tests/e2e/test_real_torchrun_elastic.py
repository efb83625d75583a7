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
    training_at_step,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

# resnet-tiny on workers limited to a quarter of a core (paced_workers), as the Horovod world
# (test_real_elastic.py): DDP trains some 4 steps a second there, and every resize restarts every rank's
# process (its imports included). Full again at step 206 of 600 alone.
STEPS = 400
COMMIT_EVERY = 5


def rank0_records(jobs: Jobs, name: str) -> list[dict[str, Any]]:
    """Every progress record rank 0 printed so far, from worker 0's live log (rank 0 always runs there)."""
    return progress_in(jobs.core.read_namespaced_pod_log(f"{name}-worker-0", jobs.ns, container="worker"))


def shrank_and_grew_back(sizes: list[int]) -> bool:
    """The world trained at 3 ranks, then at 2, then at 3 again (the processes' starts, in order; a
    straggler's agent at the first rendezvous may add a start at 2 before the first at 3)."""
    after_full = sizes[sizes.index(3) :] if 3 in sizes else []
    return 2 in after_full and sizes[-1] == 3


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
        hyperparameters=tiny_training(stepsPerEpoch=STEPS), **tiny_model(torchrun=True), **paced_workers(),
    )  # fmt: skip
    wait_for(lambda: training_at_step(real_jobs, name, 6), timeout=600, interval=0.5, what=f"{name} training")
    worker_0 = str(real_jobs.core.read_namespaced_pod(f"{name}-worker-0", real_jobs.ns).metadata.uid)
    node = str(real_jobs.core.read_namespaced_pod(f"{name}-worker-1", real_jobs.ns).spec.node_name)
    with cordoned(real_jobs, node):
        deleted_at, old_uid = evict_worker(real_jobs, name)
        smaller = wait_for(
            lambda: first_at_size(rank0_records(real_jobs, name), 2, deleted_at), timeout=240, interval=1,
            what=f"{name} training at 2 ranks",
        )  # fmt: skip
    try:
        joined_at = wait_for(
            lambda: replacement_ready(real_jobs, name, old_uid), timeout=180, interval=0.5,
            what="the replacement Ready",
        )  # fmt: skip
        regrown = wait_for(
            lambda: first_at_size(rank0_records(real_jobs, name), 3, joined_at), timeout=240, interval=1,
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
