"""runPolicy.scheduling.topology: parsed and refused by field, Kueue's TAS annotations on a queued job's
workers, pod affinity to the job's own workers without Kueue (added to the user's affinity, never replacing
it), a stable worker-index label, and a job message that says the workers wait for one domain.
tests/integration/test_topology.py runs the affinity under the real kube-scheduler."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from dtjob import desired
from dtjob.desired.common import owner_reference
from dtjob.gang import kueue
from dtjob.gang.placement import shortfall
from dtjob.machine import decide
from dtjob.spec.parse import SpecError
from dtjob.state.observed import Observed, PodState
from dtjob.state.status import JobStatus

from tests.unit.operator_fixtures import job_spec

OWNER = owner_reference("rn50", "uid-1")
RACK = "topology.example.net/rack"
NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
WORKER_TERM = {
    "labelSelector": {"matchLabels": {"dtjob.io/job-name": "rn50", "dtjob.io/role": "worker"}},
    "topologyKey": RACK,
}
USER_AFFINITY = {
    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "sku", "operator": "In", "values": ["nd96"]}]}]}},
    "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname"}]},
    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 5, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "noisy"}},
                                          "topologyKey": "kubernetes.io/hostname"}}]},
}  # fmt: skip


def topology_spec(mode: str | None = None, workers: int = 3, **scheduling: Any) -> Any:
    topology = {"key": RACK, **({"mode": mode} if mode else {})}
    return job_spec(workers=workers, runPolicy={"scheduling": {"topology": topology, **scheduling}})


# --- the spec ----------------------------------------------------------------------------------------------


def test_topology_defaults_to_required_and_takes_preferred() -> None:
    topology = topology_spec().run_policy.scheduling.topology
    assert topology is not None and (topology.key, topology.mode, topology.required) == (
        RACK,
        "required",
        True,
    )
    preferred = topology_spec("preferred").run_policy.scheduling.topology
    assert preferred is not None and (preferred.mode, preferred.required) == ("preferred", False)
    assert job_spec().run_policy.scheduling.topology is None


@pytest.mark.parametrize(
    ("topology", "field", "words"),
    [
        ({}, "spec.runPolicy.scheduling.topology.key", "is required"),
        ({"mode": "preferred"}, "spec.runPolicy.scheduling.topology.key", "is required"),
        ({"key": "rack name"}, "spec.runPolicy.scheduling.topology.key", "is not a valid key"),
        ({"key": "-rack"}, "spec.runPolicy.scheduling.topology.key", "is not a valid key"),
        ({"key": "a" * 254 + "/rack"}, "spec.runPolicy.scheduling.topology.key", "prefix is longer"),
        ({"key": 7}, "spec.runPolicy.scheduling.topology.key", "must be a string"),
        ({"key": RACK, "mode": "strict"}, "spec.runPolicy.scheduling.topology.mode", "required, preferred"),
        ("rack", "spec.runPolicy.scheduling.topology", "must be an object"),
    ],
)  # fmt: skip
def test_bad_topology_is_refused_naming_its_field(topology: Any, field: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        job_spec(runPolicy={"scheduling": {"topology": topology}})
    assert err.value.path == field and words in err.value.message, (err.value.path, err.value.message)


# --- the pods ----------------------------------------------------------------------------------------------


def test_without_kueue_required_is_required_pod_affinity_to_the_jobs_workers() -> None:
    spec = topology_spec()
    for index in range(3):
        pod = desired.worker_pod(spec, OWNER, index, 0)
        assert pod["spec"]["affinity"] == {
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [WORKER_TERM]}
        }
        # The term selects by labels every worker carries, whatever its index or attempt.
        labels = pod["metadata"]["labels"]
        assert WORKER_TERM["labelSelector"]["matchLabels"].items() <= labels.items()
        assert not [k for k in pod["metadata"]["annotations"] if k.startswith("kueue.x-k8s.io/podset-")]


def test_without_kueue_preferred_weighs_the_domain_at_one_hundred() -> None:
    pod = desired.worker_pod(topology_spec("preferred"), OWNER, 0, 0)
    assert pod["spec"]["affinity"] == {
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": WORKER_TERM}
            ]
        }
    }


@pytest.mark.parametrize("mode", ["required", "preferred"])
@pytest.mark.parametrize("where", ["placement", "template"])
def test_the_users_affinity_is_kept_and_the_topology_term_added(mode: str, where: str) -> None:
    scheduling = {"topology": {"key": RACK, "mode": mode}}
    if where == "placement":
        spec = job_spec(
            workers=2, placement={"affinity": USER_AFFINITY}, runPolicy={"scheduling": scheduling}
        )
    else:
        template = {"spec": {"affinity": USER_AFFINITY}}
        spec = job_spec(workers=2, worker={"template": template}, runPolicy={"scheduling": scheduling})
    affinity = desired.worker_pod(spec, OWNER, 1, 0)["spec"]["affinity"]
    assert affinity["nodeAffinity"] == USER_AFFINITY["nodeAffinity"]
    assert affinity["podAntiAffinity"] == USER_AFFINITY["podAntiAffinity"]
    theirs = USER_AFFINITY["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    required = affinity["podAffinity"].get("requiredDuringSchedulingIgnoredDuringExecution")
    preferred = affinity["podAffinity"].get("preferredDuringSchedulingIgnoredDuringExecution")
    if mode == "required":
        assert required == [*theirs, WORKER_TERM] and preferred is None
    else:
        assert required == theirs and preferred == [{"weight": 100, "podAffinityTerm": WORKER_TERM}]
    # The spec's own affinity object is left as it was (the next world builds from it again).
    assert USER_AFFINITY["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == theirs
    assert len(theirs) == 1


@pytest.mark.parametrize(
    ("mode", "annotation"),
    [("required", "kueue.x-k8s.io/podset-required-topology"),
     ("preferred", "kueue.x-k8s.io/podset-preferred-topology")],
)  # fmt: skip
def test_with_kueue_the_workers_carry_its_tas_annotation_and_no_affinity(mode: str, annotation: str) -> None:
    spec = topology_spec(mode, queueName="team-a")
    pod = desired.worker_pod(spec, OWNER, 2, 0)
    assert pod["metadata"]["annotations"] == {kueue.POD_GROUP_TOTAL_COUNT: "4", annotation: RACK}
    assert "affinity" not in pod["spec"]
    # A launcher on the CPU pool is a member of Kueue's group but no host: it asks for no domain.
    launcher = desired.launcher_pod(spec, OWNER, 0)
    assert launcher["metadata"]["annotations"] == {kueue.POD_GROUP_TOTAL_COUNT: "4"}
    assert "affinity" not in launcher["spec"]


def test_a_launcher_that_runs_ranks_follows_the_workers_domain() -> None:
    spec = job_spec(
        workers=2, launcher={"runAsWorker": True}, runPolicy={"scheduling": {"topology": {"key": RACK}}}
    )
    pod_spec = desired.launcher_pod(spec, OWNER, 0)["spec"]
    assert pod_spec["affinity"] == {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [WORKER_TERM]}
    }
    # A launcher on the CPU pool is no host of the world: it goes where it fits.
    plain = job_spec(workers=2, runPolicy={"scheduling": {"topology": {"key": RACK}}})
    assert "affinity" not in desired.launcher_pod(plain, OWNER, 0)["spec"]


def test_with_kueue_a_launcher_that_runs_ranks_shares_the_workers_podset_group() -> None:
    """The launcher's pod is unlike the workers' (a PodSet of its own): one PodSet group gives both one
    domain, where Kueue pins them by node selector, so neither gets the affinity."""
    scheduling = {"topology": {"key": RACK}, "queueName": "team-a"}
    spec = job_spec(workers=2, launcher={"runAsWorker": True}, runPolicy={"scheduling": scheduling})
    launcher = desired.launcher_pod(spec, OWNER, 0)
    worker = desired.worker_pod(spec, OWNER, 0, 0)
    wanted = {
        kueue.POD_GROUP_TOTAL_COUNT: "3",
        "kueue.x-k8s.io/podset-required-topology": RACK,
        "kueue.x-k8s.io/podset-group-name": "hosts",
    }
    assert launcher["metadata"]["annotations"] == worker["metadata"]["annotations"] == wanted
    assert "affinity" not in launcher["spec"] and "affinity" not in worker["spec"]


def test_with_a_gang_scheduler_the_same_affinity_applies() -> None:
    spec = topology_spec(gang={"scheduler": "coscheduling"})
    pod = desired.worker_pod(spec, OWNER, 0, 0)
    assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    assert pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        WORKER_TERM
    ]


def test_every_worker_keeps_its_index_label_across_world_attempts() -> None:
    spec = topology_spec()
    for index in range(3):
        first = desired.worker_pod(spec, OWNER, index, 0)["metadata"]["labels"]
        restarted = desired.worker_pod(spec, OWNER, index, 4)["metadata"]["labels"]
        assert first["dtjob.io/worker-index"] == restarted["dtjob.io/worker-index"] == str(index)
        assert (first["dtjob.io/attempt"], restarted["dtjob.io/attempt"]) == ("0", "4")


# --- the job's message -------------------------------------------------------------------------------------

UNSCHEDULABLE = (
    "Unschedulable: 0/6 nodes are available: 2 Insufficient nvidia.com/gpu, "
    "4 node(s) didn't match pod affinity rules"
)


def worker(index: int, **kw: Any) -> PodState:
    fields: dict[str, Any] = {
        "name": f"rn50-worker-{index}", "role": "worker", "attempt": 0, "index": index, "phase": "Pending",
        "scheduled": False, "ready": False, "deleting": False, "created": NOW,
    }  # fmt: skip
    fields.update(kw)
    return PodState(**fields)


def split_world() -> tuple[PodState, ...]:
    """Two workers bound in one rack, the third fits no node there."""
    placed = tuple(worker(i, scheduled=True, phase="Running") for i in range(2))
    return (*placed, worker(2, unschedulable=True, reason=UNSCHEDULABLE))


def test_a_world_that_fits_no_single_domain_says_its_workers_wait_for_one() -> None:
    d = decide(topology_spec(), Observed(pods=split_world()), JobStatus(phase="Pending"), NOW)
    assert d.status.phase == "Pending"
    assert d.status.message == (
        f"0/3 workers ready; 2 placed; the 3 workers wait for one {RACK} domain with room for all of them "
        f"(runPolicy.scheduling.topology required); rn50-worker-2: {UNSCHEDULABLE}"
    )


def test_preferred_or_no_topology_says_only_the_pods_verdict() -> None:
    for spec in (topology_spec("preferred"), job_spec(workers=3)):
        d = decide(spec, Observed(pods=split_world()), JobStatus(phase="Pending"), NOW)
        assert d.status.message == f"0/3 workers ready; rn50-worker-2: {UNSCHEDULABLE}"


def test_workers_kueue_holds_wait_for_admission_in_one_domain() -> None:
    pods = tuple(worker(i, gated=True) for i in range(3))
    d = decide(topology_spec(queueName="team-a"), Observed(pods=pods), JobStatus(phase="Pending"), NOW)
    assert d.status.message == (
        f"0/3 workers ready; 3 worker pod(s) wait for admission by Kueue; the 3 workers wait for one {RACK} "
        "domain with room for all of them (runPolicy.scheduling.topology required)"
    )


def test_a_gangs_shortfall_names_the_domain_too() -> None:
    spec = topology_spec(gang={"scheduler": "coscheduling", "scheduleTimeoutSeconds": 5})
    text = shortfall(spec, 3, split_world(), None, "scheduler-plugins-scheduler")
    assert f"still waiting; the 3 workers wait for one {RACK} domain with room for all of them" in text
    assert text.endswith(f"rn50-worker-2: {UNSCHEDULABLE}")
