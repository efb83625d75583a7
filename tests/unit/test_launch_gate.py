"""The launcher made with its world and held by the operator's scheduling gate: the gate on its pods whatever
a template says, what counts as held, and its release by UID."""

from __future__ import annotations

from typing import Any

from dtjob import desired, names
from dtjob.reconcile.deletes import remove_pod_gate
from dtjob.state.observed import launcher_state, pod_state

from tests.unit.operator_fixtures import job_spec
from tests.unit.recording_kube import RecordingKube

OWNER = {"apiVersion": "dtjob.io/v1", "kind": "DistributedTrainingJob", "name": "rn50", "uid": "uid-job"}


def template_gates(**launcher: Any) -> list[str]:
    job = desired.launcher_job(job_spec(launcher=launcher), OWNER, 0)
    return [g["name"] for g in job["spec"]["template"]["spec"]["schedulingGates"]]


def test_the_gate_comes_first_once_whatever_the_template_says() -> None:
    assert template_gates() == [names.LAUNCH_GATE]
    assert template_gates(template={"spec": {"schedulingGates": []}}) == [names.LAUNCH_GATE]
    # A template's own gate holds the launcher longer; naming ours cannot move or double it.
    own = {"spec": {"schedulingGates": [{"name": "team.io/hold"}, {"name": names.LAUNCH_GATE}]}}
    assert template_gates(template=own) == [names.LAUNCH_GATE, "team.io/hold"]


def pod(name: str, *gates: str, phase: str = "Pending", uid: str = "uid-p") -> dict[str, Any]:
    labels = {names.ROLE_LABEL: names.ROLE_LAUNCHER, names.ATTEMPT_LABEL: "0"}
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "labels": labels},
        "spec": {"schedulingGates": [{"name": g} for g in gates]},
        "status": {"phase": phase},
    }


JOB = {"metadata": {"name": "rn50-launcher", "labels": {names.ATTEMPT_LABEL: "0"}}, "status": {}}


def test_a_launcher_is_held_until_a_pod_of_it_is_released_or_runs() -> None:
    held = launcher_state(JOB, [pod_state(pod("rn50-launcher-a", names.LAUNCH_GATE))])
    assert held.held and held.held_pod is not None and held.held_pod.name == "rn50-launcher-a"
    # No pod yet: the Job controller has not made it, and nothing has launched.
    assert launcher_state(JOB, []).held
    # Only the operator's gate counts: Kueue's, or a template's, is not a hold of the operator's.
    other = launcher_state(JOB, [pod_state(pod("rn50-launcher-a", "team.io/hold"))])
    assert not other.held and other.held_pod is None
    released = launcher_state(JOB, [pod_state(pod("rn50-launcher-a"))])
    assert not released.held and released.launched
    ready = launcher_state({**JOB, "status": {"ready": 1}}, [])
    assert ready.launched


def test_the_release_takes_off_the_first_gate_without_a_read() -> None:
    kube = RecordingKube()
    kube.put(pod("rn50-launcher-a", names.LAUNCH_GATE, "team.io/hold"))
    assert remove_pod_gate(kube, "ml", "rn50-launcher-a", "uid-p", names.LAUNCH_GATE)
    assert kube.calls == [("patch", "Pod", "rn50-launcher-a")]
    left = kube.objects[("Pod", "ml", "rn50-launcher-a")]["spec"]["schedulingGates"]
    assert left == [{"name": "team.io/hold"}]


def test_a_gate_a_webhook_put_first_is_kept_and_ours_found_by_a_read() -> None:
    kube = RecordingKube()
    kube.put(pod("rn50-launcher-a", "webhook.io/first", names.LAUNCH_GATE))
    assert remove_pod_gate(kube, "ml", "rn50-launcher-a", "uid-p", names.LAUNCH_GATE)
    assert [c[0] for c in kube.calls] == ["patch", "get", "patch"]
    left = kube.objects[("Pod", "ml", "rn50-launcher-a")]["spec"]["schedulingGates"]
    assert left == [{"name": "webhook.io/first"}]


def test_a_pod_made_again_under_the_name_is_not_released_for_the_one_observed() -> None:
    kube = RecordingKube()
    kube.put(pod("rn50-launcher-a", names.LAUNCH_GATE, uid="uid-new"))
    assert not remove_pod_gate(kube, "ml", "rn50-launcher-a", "uid-old", names.LAUNCH_GATE)
    gates = kube.objects[("Pod", "ml", "rn50-launcher-a")]["spec"]["schedulingGates"]
    assert gates == [{"name": names.LAUNCH_GATE}]
