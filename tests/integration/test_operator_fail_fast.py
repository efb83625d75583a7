"""Fail fast, for the right reason, on the real API server and scheduler (kwok-simulated GPU pool): a world
that cannot be scheduled fails at runPolicy.startupDeadlineSeconds and frees what it holds; under
restartPolicy ExitCode the launcher's exit code 1 fails the job without spending a restart."""

from __future__ import annotations

import pytest

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess

pytestmark = pytest.mark.integration


def test_a_world_that_cannot_be_scheduled_fails_at_the_startup_deadline(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    # Five workers of 4 GPUs on a pool of four 4-GPU nodes: one never fits, four hold their GPUs meanwhile.
    jobs.create("toowide", workers=5, runPolicy={"startupDeadlineSeconds": 10})
    wait_for(
        lambda: len([p for p in jobs.pods("toowide", "worker") if p.spec.node_name]) == 4,
        timeout=60,
        what="four workers bound",
    )
    status = jobs.wait_phase("toowide", "Failed", timeout=90)
    cond = jobs.condition("toowide", "Failed")
    assert cond and cond["reason"] == "StartupDeadlineExceeded", status
    assert "toowide-worker-" in cond["message"] and "Unschedulable" in cond["message"]
    assert "(runPolicy.startupDeadlineSeconds)" in cond["message"]
    assert status["restarts"] == 0
    wait_for(lambda: not jobs.live_workers("toowide"), timeout=60, what="the GPUs freed")


def test_exit_code_policy_fails_a_users_error_without_a_restart(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    # The simulated launcher fails with exit code 1 (what a Python traceback in the training script gives).
    failing = {"podAnnotations": {"sim.dtjob.io/outcome": "Failed"}}
    jobs.create("usererr", launcher=failing, runPolicy={"restartPolicy": "ExitCode", "backoffLimit": 3})
    jobs.create("retried", launcher=failing, runPolicy={"backoffLimit": 3})
    status = jobs.wait_phase("usererr", "Failed", timeout=120)
    cond = jobs.condition("usererr", "Failed")
    assert cond and cond["reason"] == "LauncherFailed" and status["restarts"] == 0
    assert "exit code 1 is permanent under runPolicy.restartPolicy ExitCode" in cond["message"]
    assert "launcher pod usererr-launcher failed: " in cond["message"]
    # The default policy (OnFailure) restarts the world for the same exit.
    wait_for(lambda: jobs.status("retried").get("restarts", 0) >= 1, timeout=120, what="a restart")
