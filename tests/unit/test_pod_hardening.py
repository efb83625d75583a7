"""What the MPI world's pods do not get: an API token, the private key where it is not used, root over SSH,
and (with the option on) traffic from anything but the job's own pods."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob import desired, names
from dtjob.desired.command import SSH_KEY_PATH, launcher_script, worker_sshd_script
from dtjob.desired.common import SSH_DIR, SSH_KEY_FILE, owner_reference
from dtjob.desired.sshkeys import generate_keypair

from tests.unit.operator_fixtures import job_spec

OWNER = owner_reference("rn50", "uid-1")


def pod_specs(**spec: Any) -> dict[str, dict[str, Any]]:
    parsed = job_spec(**spec)
    return {
        "worker": desired.worker_pod(parsed, OWNER, 0, 0)["spec"],
        "launcher": desired.launcher_pod(parsed, OWNER, 0)["spec"],
    }


def ssh_files(pod_spec: dict[str, Any]) -> list[str]:
    volume = next(v for v in pod_spec["volumes"] if v["name"] == "ssh")
    mount = next(m for m in pod_spec["containers"][0]["volumeMounts"] if m["name"] == "ssh")
    assert mount["mountPath"] == SSH_DIR and mount["readOnly"]
    return [item["path"] for item in volume["secret"]["items"]]


def test_no_service_account_token_unless_the_job_asks() -> None:
    for role, pod_spec in pod_specs().items():
        assert pod_spec["automountServiceAccountToken"] is False, role
    for role, pod_spec in pod_specs(automountServiceAccountToken=True).items():
        assert pod_spec["automountServiceAccountToken"] is True, role


@pytest.mark.parametrize("run_as_worker", [False, True])
def test_the_private_key_is_only_on_the_launcher(run_as_worker: bool) -> None:
    specs = pod_specs(launcher={"runAsWorker": run_as_worker})
    assert ssh_files(specs["worker"]) == ["authorized_keys"]
    assert ssh_files(specs["launcher"]) == [SSH_KEY_FILE]
    # What each side reads is what it gets: the launcher's ssh client the identity, workers' sshd the keys.
    assert f"{SSH_DIR}/{SSH_KEY_FILE}" == SSH_KEY_PATH
    script = launcher_script(job_spec(launcher={"runAsWorker": run_as_worker}))
    assert f"IdentityFile {SSH_KEY_PATH}" in script
    assert f"-o AuthorizedKeysFile={SSH_DIR}/authorized_keys" in worker_sshd_script()
    # And the Secret has the files the items name.
    secret = desired.ssh_secret(job_spec(), OWNER, generate_keypair("t"))
    assert {"authorized_keys", SSH_KEY_FILE} <= set(secret["stringData"])


def test_sshd_refuses_root() -> None:
    script = worker_sshd_script()
    assert "-o PermitRootLogin=no " in script
    assert "prohibit-password" not in script


def test_network_policy_admits_only_the_jobs_own_pods() -> None:
    policy = desired.network_policy(job_spec(), OWNER)
    assert policy["kind"] == "NetworkPolicy" and policy["metadata"]["name"] == "rn50-mpi"
    assert policy["metadata"]["ownerReferences"] == [OWNER]
    spec = policy["spec"]
    selected = spec["podSelector"]["matchLabels"]
    assert selected == {names.JOB_NAME_LABEL: "rn50", names.MPI_HOST_LABEL: "true"}
    assert spec["policyTypes"] == ["Ingress"]
    # One rule: from this job's pods in this namespace (no namespaceSelector, no ipBlock), on any port.
    assert spec["ingress"] == [{"from": [{"podSelector": {"matchLabels": {names.JOB_NAME_LABEL: "rn50"}}}]}]
    # Every MPI host is selected, and every pod of the job is admitted.
    worker = desired.worker_pod(job_spec(), OWNER, 1, 0)
    launcher = desired.launcher_pod(job_spec(), OWNER, 0)
    for pod in (worker, launcher):
        assert pod["metadata"]["labels"][names.JOB_NAME_LABEL] == "rn50"
    assert all(worker["metadata"]["labels"].get(k) == v for k, v in selected.items())
