"""The installer's pull Secrets (chart jobImagePullSecrets, DTJOB_IMAGE_PULL_SECRETS) reach every job's pods,
beside the spec's own; one missing in the job's namespace keeps the job waiting, naming where it came from.
Before: the chart's imagePullSecrets reached the operator's own pod only, and jobs pulling from the same
private registry failed with ErrImagePull."""

from __future__ import annotations

import pytest
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def operator_env() -> dict[str, str]:
    return {"DTJOB_IMAGE_PULL_SECRETS": "registry-creds"}


def test_the_installers_pull_secrets_reach_every_pod_and_a_missing_one_is_named(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create("pulled", imagePullSecrets=[{"name": "team-creds"}])
    for name in ("team-creds", "registry-creds"):
        wait_for(
            lambda name=name: (  # type: ignore[misc]
                (cond := jobs.condition("pulled", "Created")) and name in cond["message"] and cond
            ),
            timeout=60, what=f"Created=False naming {name}",
        )  # fmt: skip
        cond = jobs.condition("pulled", "Created")
        assert cond and cond["reason"] == "ImagePullSecretNotFound", cond
        if name == "registry-creds":
            assert "DTJOB_IMAGE_PULL_SECRETS" in cond["message"], cond
        assert not jobs.pods("pulled")
        secret = client.V1Secret(
            metadata=client.V1ObjectMeta(name=name),
            type="kubernetes.io/dockerconfigjson",
            string_data={".dockerconfigjson": '{"auths": {}}'},
        )
        jobs.core.create_namespaced_secret(jobs.ns, secret)
    pods = wait_for(lambda: jobs.pods("pulled", "worker") or None, timeout=60, what="workers")
    for pod in pods:
        assert [s.name for s in pod.spec.image_pull_secrets] == ["team-creds", "registry-creds"]
