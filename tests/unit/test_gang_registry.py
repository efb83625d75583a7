"""The schedulers behind one interface: the registry knows exactly the gang schedulers the spec (and the CRD)
accept, a job joins Kueue and its gang scheduler together, and the layers above ask the registry rather than
a scheduler's name."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from dtjob import desired, gang
from dtjob.desired.common import owner_reference
from dtjob.gang import kueue
from dtjob.gang.base import GangScheduler
from dtjob.gang.registry import GANG_SCHEDULERS
from dtjob.spec.run import GANG_SCHEDULERS as SPEC_GANG_SCHEDULERS

from tests.unit.operator_fixtures import job_spec

OWNER = owner_reference("rn50", "uid-1")
CRD = Path(__file__).parents[2] / "crds" / "dtjob.io_distributedtrainingjobs.yaml"


def _gang_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    scheduling = spec["properties"]["runPolicy"]["properties"]["scheduling"]
    return dict(scheduling["properties"]["gang"])


def test_the_registry_knows_exactly_the_schedulers_the_spec_and_the_crd_accept() -> None:
    assert tuple(GANG_SCHEDULERS) == SPEC_GANG_SCHEDULERS
    assert list(GANG_SCHEDULERS) == _gang_schema()["properties"]["scheduler"]["enum"]
    for name, scheduler in GANG_SCHEDULERS.items():
        assert scheduler.name == name and scheduler.scheduler_name and scheduler.pod_group_api
        assert scheduler.installed_by


@pytest.mark.parametrize("name", list(GANG_SCHEDULERS))
def test_a_gang_scheduler_is_asked_for_its_pod_group_and_names(name: str) -> None:
    spec = job_spec(workers=2, runPolicy={"scheduling": {"gang": {"scheduler": name}}})
    scheduler = gang.gang_scheduler(spec)
    assert scheduler is GANG_SCHEDULERS[name] and gang.schedulers(spec) == (scheduler,)
    assert gang.pod_group_api(spec) == scheduler.pod_group_api
    group = desired.pod_group(spec, OWNER, desired.worker_pod(spec, OWNER, 0, 0))
    assert group["apiVersion"] == scheduler.pod_group_api and group["spec"]["minMember"] == 2
    assert gang.scheduler_name(spec) == scheduler.scheduler_name
    said = f"spec.runPolicy.scheduling.gang.scheduler {name}: the cluster does not serve PodGroup (x/v1); "
    assert scheduler.api_not_served(spec, "PodGroup (x/v1)").startswith(f"{said}install ")


def test_kueue_admits_and_the_gang_scheduler_places_the_same_world() -> None:
    spec = job_spec(
        workers=2, runPolicy={"scheduling": {"queueName": "team-a", "gang": {"scheduler": "coscheduling"}}}
    )
    assert [s.name for s in gang.schedulers(spec)] == ["kueue", "coscheduling"]
    worker = desired.worker_pod(spec, OWNER, 1, 0)
    labels, annotations = worker["metadata"]["labels"], worker["metadata"]["annotations"]
    assert labels[kueue.QUEUE_NAME_LABEL] == "team-a" and labels[kueue.POD_GROUP_NAME_LABEL] == "rn50"
    assert labels["scheduling.x-k8s.io/pod-group"] == "rn50"
    assert annotations == {kueue.POD_GROUP_TOTAL_COUNT: "3"}  # the two workers and the launcher
    assert worker["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    # The launcher joins both: the PodGroup, and Kueue's group on the same queue, counted in its total.
    launcher = desired.launcher_pod(spec, OWNER, 0)
    launcher_labels = launcher["metadata"]["labels"]
    assert launcher_labels["scheduling.x-k8s.io/pod-group"] == "rn50"
    assert launcher_labels[kueue.QUEUE_NAME_LABEL] == "team-a"
    assert launcher_labels[kueue.POD_GROUP_NAME_LABEL] == "rn50"
    assert launcher["metadata"]["annotations"][kueue.POD_GROUP_TOTAL_COUNT] == "3"


def test_kueue_alone_needs_no_pod_group_no_scheduler_name_and_no_gang_condition() -> None:
    spec = job_spec(workers=2, runPolicy={"scheduling": {"queueName": "team-a"}})
    assert [s.name for s in gang.schedulers(spec)] == ["kueue"]
    assert gang.gang_scheduler(spec) is None and gang.pod_group_api(spec) is None
    assert gang.scheduler_name(spec) is None
    assert kueue.Kueue().gang_scheduled(spec, {}, 2, None, None, datetime.now(UTC)) is None


def test_a_scheduler_that_asks_nothing_adds_nothing_to_the_pods() -> None:
    class Plain(GangScheduler):
        name = "plain"

    spec = job_spec()
    assert (Plain().pod_labels(spec, "worker"), Plain().pod_annotations(spec, "worker")) == ({}, {})
    assert Plain().pod_group_spec(spec, {}) is None and Plain.scheduler_name is None


def test_a_pod_group_of_the_users_own_is_joined_by_coscheduling_s_label() -> None:
    spec = job_spec(runPolicy={"scheduling": {"podGroup": "mine"}})
    assert gang.pod_labels(spec, "worker") == {
        "scheduling.x-k8s.io/pod-group": "mine",
        "kueue.x-k8s.io/pod-group-name": "rn50",
    }
    assert gang.pod_group_api(spec) is None
