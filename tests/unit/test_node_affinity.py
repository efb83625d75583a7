"""A job's required node affinity as the operator matches it against its pool's nodes (the GPU check of
preflight): the scheduler's reading of each operator, compiled once per check, and none past its bound."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob.gang.node_affinity import AFFINITY_CHECK_MAX, Unmatched, required_terms
from dtjob.reconcile.preflight import preflight

from tests.unit.operator_fixtures import job_spec
from tests.unit.test_node_list_reuse import StaleNodes

NODE = {"metadata": {"name": "gpu-7", "labels": {"pool": "gpu", "gen": "5"}}}


def affinity(*expressions: dict[str, Any], fields: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    term: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields:
        term["matchFields"] = list(fields)
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        ({"key": "pool", "operator": "In", "values": ["cpu", "gpu"]}, True),
        ({"key": "pool", "operator": "In", "values": ["cpu"]}, False),
        ({"key": "pool", "operator": "NotIn", "values": ["cpu"]}, True),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, True),
        ({"key": "pool", "operator": "NotIn", "values": ["gpu"]}, False),
        ({"key": "pool", "operator": "Exists"}, True),
        ({"key": "zone", "operator": "Exists"}, False),
        ({"key": "zone", "operator": "DoesNotExist"}, True),
        ({"key": "gen", "operator": "Gt", "values": ["4"]}, True),
        ({"key": "gen", "operator": "Lt", "values": ["5"]}, False),
        ({"key": "gen", "operator": "Gt", "values": ["x"]}, False),
        ({"key": "pool", "operator": "Gt", "values": ["1"]}, False),
        ({"key": "pool", "operator": "Sometimes", "values": ["gpu"]}, False),
    ],
)
def test_each_operator_reads_as_the_scheduler_reads_it(expression: dict[str, Any], matches: bool) -> None:
    (term,) = required_terms(affinity(expression))
    assert term.matches(NODE) is matches


def test_fields_name_the_node_and_an_empty_term_matches_none() -> None:
    by_name = affinity(fields=({"key": "metadata.name", "operator": "In", "values": ["gpu-7"]},))
    assert required_terms(by_name)[0].matches(NODE)
    assert not required_terms(affinity())[0].matches(NODE)
    assert required_terms(None) == () and required_terms({"nodeAffinity": {}}) == ()


def test_an_affinity_past_the_bound_is_not_matched_and_the_job_gets_the_benefit() -> None:
    """An editor's megabyte of NotIn values would be matched against every node of the pool at every check
    of every waiting job: past the bound the GPU check is the scheduler's."""
    huge = affinity(
        {"key": "pool", "operator": "NotIn", "values": [f"v{i}" for i in range(AFFINITY_CHECK_MAX)]}
    )
    with pytest.raises(Unmatched):
        required_terms(huge)
    small = [{"metadata": {"name": "n2"}, "status": {"allocatable": {"nvidia.com/gpu": "2"}}}]
    kube = StaleNodes(nodes=small, stale=small)
    assert preflight(kube, job_spec(gpusPerWorker=4, placement={"affinity": huge})) is None
    assert kube.fresh_calls == [False], "the pool is listed (its selector checked), not matched"
    empty_terms: dict[str, Any] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{}] * (AFFINITY_CHECK_MAX + 1)}}}  # fmt: skip
    with pytest.raises(Unmatched):
        required_terms(empty_terms)
    for malformed in ({"nodeAffinity": ["x"]}, affinity({"key": "pool", "operator": "In", "values": 7}),
                      {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                          "nodeSelectorTerms": ["pool"]}}}):  # fmt: skip
        with pytest.raises(Unmatched):
            required_terms(malformed)
        assert preflight(kube, job_spec(gpusPerWorker=4, placement={"affinity": malformed})) is None
    fits = affinity({"key": "pool", "operator": "NotIn", "values": ["cpu"]})
    blocker = preflight(kube, job_spec(gpusPerWorker=4, placement={"affinity": fits}))
    assert blocker is not None and blocker.reason == "InsufficientGPUsPerNode", blocker
    assert "spec.placement.affinity" in blocker.message


def test_the_worker_template_s_tolerations_and_affinity_decide_the_pool_as_they_decide_the_pods() -> None:
    """A GPU pool tainted for one team (beside the taint the operator tolerates itself): a job that tolerates
    it in its worker template lands there, so preflight counts that pool, and does not fail the job for good
    on the untainted system nodes; an affinity the template sets narrows the pool as it narrows the pods."""
    system = {
        "metadata": {"name": "sys-0", "labels": {"zone": "2"}},
        "status": {"allocatable": {"nvidia.com/gpu": "0"}},
    }
    gpu = {
        "metadata": {"name": "gpu-0", "labels": {"zone": "1"}},
        "spec": {"taints": [{"key": "team", "value": "vision", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }
    kube = StaleNodes(nodes=[system, gpu], stale=[system, gpu])
    toleration = {"key": "team", "operator": "Equal", "value": "vision", "effect": "NoSchedule"}
    untolerated = preflight(kube, job_spec(gpusPerWorker=4))
    assert untolerated is not None and untolerated.reason == "InsufficientGPUsPerNode", untolerated
    tolerated = {"template": {"spec": {"tolerations": [toleration]}}}
    assert preflight(kube, job_spec(gpusPerWorker=4, worker=tolerated)) is None
    zone_2 = affinity({"key": "zone", "operator": "In", "values": ["2"]})
    narrowed = {"template": {"spec": {"tolerations": [toleration], "affinity": zone_2}}}
    blocker = preflight(kube, job_spec(gpusPerWorker=4, worker=narrowed))
    assert blocker is not None and blocker.reason == "InsufficientGPUsPerNode", blocker
