"""The MPI world as the real API server stores it: no API token in its pods, each pod only its half of the
SSH key pair, and (with the chart's networkPolicy option) a NetworkPolicy the API server accepts."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess

pytestmark = pytest.mark.integration

LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}


@pytest.fixture
def operator_env() -> dict[str, str]:
    return {"DTJOB_NETWORK_POLICY": "true"}


def ssh_items(pod: client.V1Pod) -> list[str]:
    volume = next(v for v in pod.spec.volumes if v.name == "ssh")
    return [item.path for item in volume.secret.items]


def test_pods_get_no_token_and_only_their_half_of_the_key_pair(
    jobs: Jobs, operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    jobs.create("hardened", launcher=LONG_LAUNCHER)
    launcher = wait_for(
        lambda: next(iter(jobs.pods("hardened", "launcher")), None), timeout=90, what="the launcher pod"
    )
    workers = jobs.pods("hardened", "worker")
    assert len(workers) == 2
    for pod in [*workers, launcher]:
        assert pod.spec.automount_service_account_token is False, pod.metadata.name
        # The ServiceAccount admission plugin adds no token volume to such a pod.
        assert not [v for v in pod.spec.volumes if v.name.startswith("kube-api-access")], pod.metadata.name
    assert [ssh_items(w) for w in workers] == [["authorized_keys"], ["authorized_keys"]]
    assert ssh_items(launcher) == ["id_ed25519"]

    policy = client.NetworkingV1Api(api_client).read_namespaced_network_policy("hardened-mpi", jobs.ns)
    uid = (jobs.get("hardened") or {})["metadata"]["uid"]
    assert policy.metadata.owner_references[0].uid == uid
    selected = {"dtjob.io/job-name": "hardened", "dtjob.io/mpi-host": "true"}
    assert policy.spec.pod_selector.match_labels == selected
    assert policy.spec.policy_types == ["Ingress"]
    rules = policy.spec.ingress or []
    assert len(rules) == 1 and rules[0].ports is None
    peers = rules[0]._from or []
    assert len(peers) == 1
    assert peers[0].pod_selector.match_labels == {"dtjob.io/job-name": "hardened"}
    assert peers[0].namespace_selector is None and peers[0].ip_block is None


def test_a_job_that_asks_gets_the_token(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("withtoken", automountServiceAccountToken=True, launcher=LONG_LAUNCHER)
    wait_for(lambda: len(jobs.pods("withtoken", "worker")) == 2, timeout=60, what="workers")
    for pod in jobs.pods("withtoken", "worker"):
        assert pod.spec.automount_service_account_token is True


def test_foreign_storage_endpoints_are_refused_at_apply_or_by_the_operator(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    identity = {"authMode": "workloadIdentity"}
    # No install of the operator could accept it: the API server refuses it at apply.
    with pytest.raises(ApiException) as refused:
        jobs.create("exfil", output={"endpoint": "https://attacker.example.com", "container": "runs",
                                     "credentials": identity})  # fmt: skip
    assert refused.value.status == 422
    assert "spec.output.endpoint" in str(refused.value.body)
    # Path-style, as an emulator would be: only the operator knows this host is not an allowed emulator.
    jobs.create("pathstyle", output={"endpoint": "https://attacker.example.com/acct1", "container": "runs",
                                     "credentials": identity})  # fmt: skip
    jobs.wait_phase("pathstyle", "Failed", timeout=60)
    failed = jobs.condition("pathstyle", "Failed")
    assert failed and failed["message"].startswith(
        "spec.output.endpoint: host 'attacker.example.com' is not an Azure Blob Storage endpoint"
    ), failed
    assert not jobs.pods("pathstyle")
    assert "user delegation key" not in operator.log_path.read_text(errors="replace")


def _matches(selector: client.V1LabelSelector | None, labels: dict[str, str] | None) -> bool:
    assert selector is not None and not selector.match_expressions
    return all((labels or {}).get(k) == v for k, v in (selector.match_labels or {}).items())


def test_the_launcher_accepts_only_its_own_workers(
    jobs: Jobs, operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    """The launcher's MPI control ports (ORTE/PRRTE, Hydra, horovodrun's services, on ports picked at run
    time) take connections from this job's workers and from nothing else: the policy the API server stores
    selects the launcher pod, and admits the workers and no other pod of the namespace."""
    jobs.create("guarded", launcher=LONG_LAUNCHER)
    jobs.create("neighbour", launcher=LONG_LAUNCHER)
    launcher = wait_for(
        lambda: next(iter(jobs.pods("guarded", "launcher")), None), timeout=90, what="launcher"
    )
    wait_for(lambda: len(jobs.pods("neighbour", "worker")) == 2, timeout=90, what="the other job's workers")
    policy = client.NetworkingV1Api(api_client).read_namespaced_network_policy(
        "guarded-launcher-mpi", jobs.ns
    )
    assert policy.metadata.owner_references[0].uid == (jobs.get("guarded") or {})["metadata"]["uid"]
    assert policy.spec.policy_types == ["Ingress"]
    assert _matches(policy.spec.pod_selector, launcher.metadata.labels)
    for pod in jobs.pods("guarded", "worker"):
        assert not _matches(policy.spec.pod_selector, pod.metadata.labels)  # the workers have their own
    (rule,) = policy.spec.ingress or []
    assert rule.ports is None  # the control ports are chosen at run time
    (peer,) = rule._from or []
    assert peer.namespace_selector is None and peer.ip_block is None
    workers = jobs.pods("guarded", "worker")
    assert len(workers) == 2 and all(_matches(peer.pod_selector, w.metadata.labels) for w in workers)
    others = [launcher, *jobs.pods("neighbour", "worker"), *jobs.pods("neighbour", "launcher")]
    assert not any(_matches(peer.pod_selector, p.metadata.labels) for p in others)
