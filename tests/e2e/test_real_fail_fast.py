"""A world whose image cannot be pulled, on the real node: the kubelet's ErrImagePull/ImagePullBackOff fails
the job at runPolicy.startupDeadlineSeconds, naming the pod and the pull error, and the world is freed."""

from __future__ import annotations

import pytest

from testbed.azurite import Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from tests.e2e.real_jobs import create_tiny_job, new_container

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_an_image_that_cannot_be_pulled_fails_at_the_startup_deadline(
    real_jobs: Jobs, real_operator: OperatorProcess, node_azurite: Azurite
) -> None:
    name = "nopull"
    create_tiny_job(
        real_jobs,
        name,
        node_azurite,
        new_container(node_azurite),
        # No registry answers inside the test bed: the kubelet reports ErrImagePull, then backs off.
        image="localhost/dtjob/absent:1",
        imagePullPolicy="IfNotPresent",
        runPolicy={"backoffLimit": 2, "startupDeadlineSeconds": 20, "cleanPodPolicy": "Running"},
    )
    status = real_jobs.wait_phase(name, "Failed", "Succeeded", timeout=180)
    cond = real_jobs.condition(name, "Failed")
    assert cond and cond["reason"] == "StartupDeadlineExceeded", status
    assert f"{name}-worker-" in cond["message"]
    assert "ErrImagePull" in cond["message"] or "ImagePullBackOff" in cond["message"], cond["message"]
    assert status["restarts"] == 0
    wait_for(lambda: not real_jobs.live_workers(name), timeout=60, what="the world freed")
