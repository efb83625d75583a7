"""Every pod the operator creates meets the Kubernetes `restricted` Pod Security Standard, so the MPI world
and the stager start in a namespace that enforces it, and run as the images' own unprivileged users.

The rules are those of https://kubernetes.io/docs/concepts/security/pod-security-standards/ (restricted,
which includes baseline), as far as the operator's pods could break them."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob import desired
from dtjob.desired.common import STAGER_UID, TRAINING_UID, owner_reference
from dtjob.spec.parse import JobSpec

from tests.unit.operator_fixtures import job_spec

Json = dict[str, Any]
OWNER = owner_reference("rn50", "uid-1")
STAGER_IMAGE = "ghcr.io/dtjob/stager:test"

RESTRICTED_VOLUME_TYPES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
    "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip
ALLOWED_ADDED_CAPABILITIES = {"NET_BIND_SERVICE"}

CREDS = {"authMode": "accountKey", "secretRef": {"name": "storage-key"}}
SPECS: dict[str, dict[str, Any]] = {
    "synthetic": {},
    "imagenet-pvc-staged-output-checkpoints": {
        "dataset": {
            "source": "imagenet",
            "volume": {"persistentVolumeClaim": {"claimName": "imagenet"}, "mountPath": "/data"},
            "dataDir": "/data/imagenet",
            "stageFrom": {"account": "acct1", "container": "datasets", "prefix": "in", "credentials": CREDS},
        },
        "output": {"account": "acct1", "container": "results", "credentials": CREDS},
        "checkpoints": {"persistentVolumeClaim": {"claimName": "ckpt"}, "mountPath": "/checkpoints"},
    },
    "launcher-runs-ranks": {
        "launcher": {"runAsWorker": True},
        "output": {"account": "acct1", "container": "results", "credentials": CREDS},
        "checkpoints": {"persistentVolumeClaim": {"claimName": "ckpt"}},
    },
}


def pods(spec: JobSpec) -> dict[str, Json]:
    """Every pod spec the operator creates for `spec`: workers, the launcher's, the stager's."""
    built = {f"worker-{i}": desired.worker_pod(spec, OWNER, i, 0)["spec"] for i in range(spec.workers)}
    built["launcher"] = desired.launcher_pod(spec, OWNER, 0)["spec"]
    if spec.dataset.staging is not None:
        built["stager"] = desired.staging_job(spec, OWNER, STAGER_IMAGE)["spec"]["template"]["spec"]
    return built


def restricted_violations(pod: Json) -> list[str]:
    """What in one pod spec breaks the restricted Pod Security Standard (empty when it complies)."""
    found: list[str] = []
    context: Json = pod.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(host):
            found.append(f"{host} is set")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            found.append(f"volume {volume['name']}: {', '.join(sorted(kinds - RESTRICTED_VOLUME_TYPES))}")
    if context.get("runAsUser") == 0:
        found.append("pod runAsUser is 0")
    containers = [
        c for kind in ("initContainers", "containers", "ephemeralContainers") for c in pod.get(kind) or []
    ]
    for container in containers:
        name = container["name"]
        own: Json = container.get("securityContext") or {}
        if own.get("privileged"):
            found.append(f"{name}: privileged")
        if own.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        capabilities = own.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{name}: capabilities do not drop ALL")
        if not set(capabilities.get("add") or []) <= ALLOWED_ADDED_CAPABILITIES:
            found.append(f"{name}: adds capabilities {capabilities['add']}")
        if own.get("runAsNonRoot", context.get("runAsNonRoot")) is not True:
            found.append(f"{name}: runAsNonRoot is not true")
        if own.get("runAsUser") == 0:
            found.append(f"{name}: runAsUser is 0")
        seccomp = (own.get("seccompProfile") or context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile is {seccomp!r}, not RuntimeDefault or Localhost")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            found.append(f"{name}: hostPort")
    return found


@pytest.mark.parametrize("overrides", SPECS.values(), ids=SPECS.keys())
def test_every_pod_meets_the_restricted_pod_security_standard(overrides: dict[str, Any]) -> None:
    built = pods(job_spec(**overrides))
    assert built, "no pods built"
    for what, pod in built.items():
        assert restricted_violations(pod) == [], what


@pytest.mark.parametrize("overrides", SPECS.values(), ids=SPECS.keys())
def test_pods_run_as_their_images_user_with_its_group(overrides: dict[str, Any]) -> None:
    """A numeric user (kubelet cannot check runAsNonRoot for the images' named `USER dtjob`), and fsGroup,
    through which the user reads the group-readable Secret files kubelet writes owned by root."""
    for what, pod in pods(job_spec(**overrides)).items():
        uid = STAGER_UID if what == "stager" else TRAINING_UID
        assert pod["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": uid,
            "fsGroup": uid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        }, what
        for volume in pod["volumes"]:
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] == 0o440, f"{what}: {volume['name']}"
        (container,) = pod["containers"]
        # Only the stager never writes outside its volumes; sshd, ssh and the ranks write /tmp and $HOME.
        assert container["securityContext"].get("readOnlyRootFilesystem", False) is (what == "stager"), what


def test_the_representative_specs_cover_every_pod_kind_and_volume() -> None:
    """The specs above exercise what the PSS check must see: a stager, rank 0's SAS and checkpoint mounts."""
    built = {what: pod for overrides in SPECS.values() for what, pod in pods(job_spec(**overrides)).items()}
    assert {"worker-0", "worker-1", "launcher", "stager"} <= set(built)
    volume_names = {v["name"] for pod in built.values() for v in pod["volumes"]}
    assert volume_names >= {"ssh", "mpi", "data", "sas-in", "sas-out", "checkpoints", "dshm", "output"}


def test_an_nfs_volume_is_the_one_thing_restricted_forbids() -> None:
    """Restricted admits no inline nfs volume: in such a namespace, give the share to the job as a PVC."""
    spec = job_spec(dataset={"source": "imagenet", "volume": {"nfs": {"server": "10.0.0.4", "path": "/x"}}})
    assert restricted_violations(pods(spec)["worker-0"]) == ["volume data: nfs"]


def test_the_check_catches_what_the_pods_used_to_miss() -> None:
    bare = {
        "containers": [{"name": "c", "ports": [{"containerPort": 22, "hostPort": 22}]}],
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
        "hostNetwork": True,
    }
    assert restricted_violations(bare) == [
        "hostNetwork is set",
        "volume h: hostPath",
        "c: allowPrivilegeEscalation is not false",
        "c: capabilities do not drop ALL",
        "c: runAsNonRoot is not true",
        "c: seccompProfile is None, not RuntimeDefault or Localhost",
        "c: hostPort",
    ]
