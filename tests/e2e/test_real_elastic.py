"""Elastic Horovod on the real node: a worker's pod deleted mid-training with a grace period, as a spot
eviction or a drain does, while its node takes no new pod (cordoned, as a spot pool without capacity). The
world trains on at the smaller size without a restart (`restarts` 0, the launcher pod the same), grows back
once the node takes pods again and the replacement is Ready, finishes every planned step, and every rank ends
with the same weights. The cordon holds the replacement back until the smaller world has trained: on two
cores a replacement can be Ready a few seconds after the deletion, before Horovod has re-formed the world,
and the world would go from three workers straight back to three. Measured and printed: seconds from the
deletion to training at the smaller size, from the replacement being Ready to it training, and the steps
redone; the restart a fixed world makes instead is measured in test_real_data.py.

The job is a PyTorch one: what the operator does (the hosts it publishes, the replacement, no restart) is the
same for every framework, and each trainer's own shrink and growth (TensorFlow's and Keras's votes on
leaving) runs in tests/training/test_elastic.py, on ranks without pods, in a fraction of the time.

Timings come from the trainers' own progress records (`updatedAt`, one per step) in the launcher's log and
the pods' conditions, all on this machine's clock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from testbed.azurite import Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from tests.e2e.real_jobs import (
    at,
    create_tiny_job,
    live_launcher_records,
    new_container,
    paced_workers,
    pod_logs,
    progress_records,
    run_metrics,
    tiny_model,
    tiny_training,
    wait_finished,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

# resnet-tiny on workers limited to a quarter of a core (paced_workers): the world trains a step every 2 s
# or so at little CPU, rather than ResNet-50's 10-20 s steps on both cores. Enough steps for the world to be
# full again before the end: it was full again at step 16 and 21 of 60 (the eviction comes after step 5,
# and the world stops training while the replacement's rank starts).
STEPS = 60
# Past a step, with room: a PyTorch rank leaves at its next step after the SIGTERM (a few seconds on paced
# workers), and a rank killed before it left is noticed only at Gloo's timeout (120 s in elastic worlds).
GRACE_SECONDS = 60


def first_at_size(records: list[dict[str, Any]], size: int, after: float) -> dict[str, Any] | None:
    """The first record at `size` ranks later than `after`."""
    return next((r for r in records if r["worldSize"] == size and at(r) > after), None)


def ready_since(jobs: Jobs, pod: str) -> float | None:
    """When the pod turned Ready (its condition's time), or None while it is not."""
    try:
        found = jobs.core.read_namespaced_pod(pod, jobs.ns)
    except ApiException:  # gone between the list and the read
        return None
    for cond in found.status.conditions or []:
        if cond.type == "Ready" and cond.status == "True":
            return float(cond.last_transition_time.timestamp())
    return None


def trained_to(
    jobs: Jobs, name: str, records: Callable[[Jobs, str], list[dict[str, Any]]], size: int, step: int
) -> dict[str, Any] | None:
    """Rank 0's first record at `step` or later in a world of `size` ranks, from its live log (`records`);
    fails once the job has ended or restarted. Not from the job's status: that takes progress up only at
    the operator's next log read, by when a fast world may be hundreds of steps on, too near its end to lose
    a worker and grow back."""
    status = jobs.status(name)
    assert status.get("phase") not in ("Succeeded", "Failed") and not status.get("restarts"), json.dumps(
        status, indent=1
    )
    return next((r for r in records(jobs, name) if r["worldSize"] == size and int(r["step"]) >= step), None)


def evict_worker(jobs: Jobs, name: str) -> tuple[float, str]:
    """Delete worker 1's pod with a grace period, as an eviction does; returns when, and the pod's UID."""
    pod = f"{name}-worker-1"
    uid = str(jobs.core.read_namespaced_pod(pod, jobs.ns).metadata.uid)
    deleted_at = time.time()
    jobs.core.delete_namespaced_pod(pod, jobs.ns, grace_period_seconds=GRACE_SECONDS)
    return deleted_at, uid


@contextmanager
def cordoned(jobs: Jobs, node: str) -> Iterator[None]:
    """`node` takes no new pod until the block ends (its running pods stay)."""
    jobs.core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        yield
    finally:
        jobs.core.patch_node(node, {"spec": {"unschedulable": None}})


def trained_at_size(jobs: Jobs, name: str, size: int, after: float) -> dict[str, Any] | None:
    """Rank 0's first progress record at `size` workers later than `after`, from the launcher's live log."""
    return first_at_size(live_launcher_records(jobs, name), size, after)


def replacement_ready(jobs: Jobs, name: str, old_uid: str) -> float | None:
    pod = f"{name}-worker-1"
    live = [p for p in jobs.live_workers(name) if p.metadata.name == pod and str(p.metadata.uid) != old_uid]
    return ready_since(jobs, pod) if live else None


def resize_times(
    records: list[dict[str, Any]], deleted_at: float, joined_at: float, full: int
) -> tuple[float, float, int, int]:
    """(seconds from the deletion to the first step at the smaller size, seconds from the replacement's
    Ready to the first step at full size again, steps redone: the last step numbered before the shrink
    minus the step the smaller world resumed after, the step the full world trained again at)."""
    before = [r for r in records if r["worldSize"] == full and at(r) <= deleted_at]
    smaller = next(r for r in records if r["worldSize"] < full and at(r) > deleted_at)
    regrown = next(r for r in records if r["worldSize"] == full and at(r) > at(smaller))
    last_full = [r for r in records if r["worldSize"] == full and at(r) < at(smaller)][-1]
    redone = max(0, int(last_full["step"]) - (int(smaller["step"]) - 1))
    assert before, "no step at full size before the deletion"
    return at(smaller) - deleted_at, at(regrown) - joined_at, redone, int(regrown["step"])


def test_an_elastic_world_loses_a_worker_trains_on_and_grows_back_without_a_restart(
    real_jobs: Jobs,
    real_operator: OperatorProcess,
    node_azurite: Azurite,
    capsys: pytest.CaptureFixture[str],
) -> None:
    container = new_container(node_azurite)
    name = "elastic-pytorch"
    create_tiny_job(
        real_jobs, name, node_azurite, container, workers=3,
        elastic={"minWorkers": 2, "maxWorkers": 3, "commitEverySteps": 5},
        hyperparameters=tiny_training(stepsPerEpoch=STEPS), **tiny_model(), **paced_workers(),
    )  # fmt: skip
    wait_for(
        lambda: trained_to(real_jobs, name, live_launcher_records, 3, 5),
        timeout=600, interval=0.5, what=f"{name} training",
    )  # fmt: skip
    launcher = real_jobs.status(name)["launcher"]["pod"]
    # The same launcher pod to the end: a restart's launcher has the same name, and a new uid.
    launcher_uid = real_jobs.core.read_namespaced_pod(launcher, real_jobs.ns).metadata.uid
    node = str(real_jobs.core.read_namespaced_pod(f"{name}-worker-1", real_jobs.ns).spec.node_name)
    with cordoned(real_jobs, node):
        deleted_at, old_uid = evict_worker(real_jobs, name)
        wait_for(
            lambda: trained_at_size(real_jobs, name, 2, deleted_at), timeout=180, interval=1,
            what=f"{name} training at 2 workers",
        )  # fmt: skip
    try:
        joined_at = wait_for(
            lambda: replacement_ready(real_jobs, name, old_uid),
            timeout=180,
            interval=0.5,
            what="the replacement Ready",
        )
    except AssertionError as err:
        raise AssertionError(f"{err}\n{pod_logs(real_jobs, name, None, '')}") from None
    status = wait_finished(real_jobs, name, timeout=900, azurite=node_azurite, container=container)
    finished_after = time.time() - deleted_at
    said = [str(e.reason) for e in real_jobs.events(name)]
    final_launcher = real_jobs.launcher(name)
    same_launcher = final_launcher is not None and final_launcher.metadata.uid == launcher_uid
    if status["restarts"] != 0 or status["launcher"]["pod"] != launcher or not same_launcher:
        # The replaced world's logs (logs/attempt-0/) say why it ended: a CI run keeps nothing else.
        logs = pod_logs(real_jobs, name, node_azurite, container, lines=80)
        raise AssertionError(f"{json.dumps(status, indent=1)}\nevents: {said}\n{logs}")
    assert "WorkerLost" in said and "Restarting" not in said, said
    metrics = run_metrics(node_azurite, container, real_jobs, name)
    assert metrics["worldSizes"][0] == 3 and 2 in metrics["worldSizes"] and metrics["worldSizes"][-1] == 3, (
        metrics
    )
    assert metrics["globalStep"] == STEPS and metrics["weightsConsistent"] is True, metrics
    records = progress_records(real_jobs, node_azurite, container, name)
    shrink, grow, redone, regrown_at = resize_times(records, deleted_at, joined_at, full=3)
    with capsys.disabled():  # in the run's output even when the test passes
        print(
            f"\n[e2e] elastic pytorch: training at 2 workers {shrink:.1f}s after the pod's deletion; the "
            f"replacement training {grow:.1f}s after it was Ready; {redone} step(s) redone (stepsRedone "
            f"{metrics.get('stepsRedone')}); restarts 0; full again at step {regrown_at} of {STEPS}; "
            f"finished {finished_after:.0f}s after the deletion"
        )
