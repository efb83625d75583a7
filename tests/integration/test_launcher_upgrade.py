"""An operator upgraded while a world an earlier release started runs: that world's launcher is a batch Job
(its pod made by kube-controller-manager's Job controller), and the new operator runs it to its end, neither
restarting the world nor making a launcher pod beside it.

Pods are simulated by kwok: a Job's pod succeeds after sim.dtjob.io/run-duration, or on cue."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from dtjob import desired, names
from dtjob.config import load_config
from dtjob.desired.common import owner_reference
from dtjob.spec.parse import parse_spec
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess

pytestmark = pytest.mark.integration

LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}


def legacy_launcher_job(job: dict[str, Any]) -> dict[str, Any]:
    """The launcher Job an earlier release made for the job's first world, its pod already released: the
    launcher's pod as the operator builds it, as the Job's template, with the Job's own labels."""
    meta = job["metadata"]
    pod = desired.launcher_pod(parse_spec(job, load_config()), owner_reference(meta["name"], meta["uid"]), 0)
    pod["spec"].pop("schedulingGates")
    kept = {key: value for key, value in pod["metadata"].items() if key in ("labels", "annotations")}
    template = {"metadata": kept}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": names.launcher_name(meta["name"]),
            "labels": pod["metadata"]["labels"],
            "ownerReferences": pod["metadata"]["ownerReferences"],
        },
        "spec": {
            "backoffLimit": 0, "completions": 1, "parallelism": 1,
            "template": {**template, "spec": pod["spec"]},
        },
    }  # fmt: skip


def test_a_world_whose_launcher_is_an_earlier_releases_job_runs_to_its_end(
    jobs: Jobs, operator: OperatorProcess, kubeconfig: str, namespace: str, tmp_path: Path
) -> None:
    jobs.create("upgraded", launcher=LONG_LAUNCHER)
    jobs.wait_phase("upgraded", "Running", timeout=120)
    operator.stop()
    # The world as an earlier release left it: the same workers, the launcher a Job whose pod runs.
    pod = jobs.launcher("upgraded")
    assert pod is not None
    jobs.core.delete_namespaced_pod(str(pod.metadata.name), namespace, grace_period_seconds=0)
    wait_for(lambda: jobs.launcher("upgraded") is None, timeout=60, what="the launcher pod gone")
    legacy = legacy_launcher_job(jobs.get("upgraded") or {})
    jobs.batch.create_namespaced_job(namespace, cast(client.V1Job, legacy))  # the client sends a dict as is

    def job_pod_running() -> client.V1Pod | None:
        found = [p for p in jobs.pods("upgraded", "launcher") if p.status.phase == "Running"]
        return found[0] if found else None

    legacy_pod = wait_for(job_pod_running, timeout=60, what="the launcher Job's pod running")
    assert legacy_pod.metadata.owner_references[0].kind == "Job"
    workers = {p.metadata.name: p.metadata.uid for p in jobs.live_workers("upgraded")}
    assert len(workers) == 2

    upgraded = OperatorProcess(kubeconfig, namespace, tmp_path / "operator-upgraded.log")
    upgraded.start()
    try:
        wait_for(lambda: upgraded.reconciles() >= 2, timeout=60, what="reconciles by the new operator")
        status = jobs.status("upgraded")
        assert status["phase"] == "Running" and status["restarts"] == 0, status
        assert status["launcher"]["pod"] == legacy_pod.metadata.name
        # No launcher pod of its own beside the Job's, and the world untouched.
        assert [p.metadata.name for p in jobs.pods("upgraded", "launcher")] == [legacy_pod.metadata.name]
        assert {p.metadata.name: p.metadata.uid for p in jobs.live_workers("upgraded")} == workers

        # The Job's pod ends the world: the job succeeds on it, with no restart spent.
        jobs.annotate_pod(legacy_pod.metadata.name, {"sim.dtjob.io/outcome": "Succeeded"})
        status = jobs.wait_phase("upgraded", "Succeeded", "Failed", timeout=60)
        succeeded = jobs.condition("upgraded", "Succeeded")
        assert succeeded and succeeded["reason"] == "LauncherSucceeded", status
        assert status["restarts"] == 0
        assert jobs.launcher("upgraded") is None  # never a launcher pod of the new kind for that world
        wait_for(lambda: not jobs.live_workers("upgraded"), timeout=60, what="the idle workers freed")
    finally:
        upgraded.stop()
