"""The installer's pull Secrets (chart jobImagePullSecrets, DTJOB_IMAGE_PULL_SECRETS) reach the pods that run
the installer's images, beside the spec's own; one missing in the job's namespace keeps the job waiting,
naming where it came from. A job that brings its own image gets only its own, and never waits for the
installer's. Before: the chart's imagePullSecrets reached the operator's own pod only, and jobs pulling from
the same private registry failed with ErrImagePull."""

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


def test_a_job_with_its_own_image_neither_gets_nor_waits_for_the_installers(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    """Before: its pods carried the installer's registry credentials too, and it waited, naming
    DTJOB_IMAGE_PULL_SECRETS, until the installer's Secret existed in its namespace."""
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name="team-creds"), type="kubernetes.io/dockerconfigjson",
        string_data={".dockerconfigjson": '{"auths": {}}'},
    )  # fmt: skip
    jobs.core.create_namespaced_secret(jobs.ns, secret)
    jobs.create("own", image="registry.example/team/trainer:2", imagePullSecrets=[{"name": "team-creds"}])
    pods = wait_for(lambda: jobs.pods("own", "worker") or None, timeout=60, what="workers")
    for pod in pods:
        assert [s.name for s in pod.spec.image_pull_secrets] == ["team-creds"]
    assert (jobs.condition("own", "Created") or {}).get("reason") != "ImagePullSecretNotFound"
