"""One LIST of the jobs' metadata confirms the operator's copies of them (dtjob.runtime.job_copies), on the
real API server: it answers a PartialObjectMetadataList for the custom resource (metadata, no spec or
status), and a job deleted meanwhile is named as gone."""

from __future__ import annotations

import pytest
from dtjob import KIND
from dtjob.kube.client import KubeClient
from dtjob.kube.connect import ApiClient
from dtjob.kube.rest import METADATA_ONLY, list_pages
from dtjob.runtime.cached_kube import CachedKube

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs

pytestmark = pytest.mark.integration


def test_one_list_of_the_jobs_metadata_confirms_their_copies_and_names_the_deleted(
    jobs: Jobs, operator_api: ApiClient, namespace: str
) -> None:
    jobs.create("kept")
    jobs.create("deleted")
    items, _ = list_pages(operator_api, KIND, namespace, (), dict, METADATA_ONLY)
    assert sorted(item["metadata"]["name"] for item in items) == ["deleted", "kept"]
    assert all(item["metadata"].get("uid") and "spec" not in item and "status" not in item for item in items)

    kube = CachedKube(KubeClient(operator_api), operator_api)
    assert kube.confirm_jobs(namespace) == [], "no copy held: nothing listed"
    for name in ("kept", "deleted"):
        assert kube.get(KIND, namespace, name) is not None  # read, and kept as a copy
    jobs.delete("deleted")
    wait_for(lambda: jobs.get("deleted") is None, timeout=30, what="the job deleted")
    assert kube.confirm_jobs(namespace) == [(namespace, "deleted")]
    assert kube.confirm_jobs(None) == [(namespace, "deleted")], "the whole cluster's LIST says the same"
