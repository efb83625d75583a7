"""`dtjob fileserver create --apply` and `delete` against the real API server (Azure's side played by the ARM
stand-in): the PV and claim it writes bind, jobs using the printed stanzas pass the CRD's schema, and delete
refuses while such a job is unfinished."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import GROUP, PLURAL, VERSION, install_crd, kubectl
from tests.azure.fileserver_arm import CREATE, aks_player, run

pytestmark = pytest.mark.integration


@pytest.fixture
def account(core_v1: client.CoreV1Api) -> Iterator[str]:
    """A fresh account name; the cluster-scoped PV it leads to is removed afterwards (the namespace's
    deletion would not)."""
    name = f"fs{uuid.uuid4().hex[:10]}"
    yield name
    for pv in core_v1.list_persistent_volume(label_selector=f"dtjob.io/fileserver={name}").items:
        core_v1.delete_persistent_volume(str(pv.metadata.name))


def job_manifest(name: str, volume: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DistributedTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "framework": "pytorch",
            "workers": 2,
            "gpusPerWorker": 4,
            "dataset": {"source": "imagenet", "dataDir": "/data/imagenet", "volume": volume},
        },
    }


def printed_volume(out: str) -> dict[str, Any]:
    volume: dict[str, Any] = yaml.safe_load(out)["volume"]
    return volume


def test_apply_binds_and_jobs_using_the_stanzas_are_accepted_then_delete_waits_for_them(
    kubeconfig: str,
    core_v1: client.CoreV1Api,
    api_client: client.ApiClient,
    namespace: str,
    account: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    install_crd(kubeconfig)
    player = aks_player()
    create = [*CREATE[:-1], account, "--size-gib", "512"]
    kube = ["--kubeconfig", kubeconfig]

    # Without --apply: the inline NFS stanza.
    assert run(create, player) == 0
    nfs_volume = printed_volume(capsys.readouterr().out)
    assert nfs_volume["nfs"] == {"server": f"{account}.file.core.windows.net", "path": f"/{account}/datasets"}

    # With --apply: a PV and a bound claim, and the stanza that uses the claim.
    assert run([*create, "--apply", "-n", namespace, "--claim-name", "imagenet", *kube], player) == 0
    out, err = capsys.readouterr()
    assert printed_volume(out) == {"mountPath": "/data", "persistentVolumeClaim": {"claimName": "imagenet"}}
    pv_name = f"dtjob-{account}-datasets"
    assert f"PersistentVolume {pv_name} created" in err
    assert f"PersistentVolumeClaim {namespace}/imagenet created" in err
    pv = core_v1.read_persistent_volume(pv_name)
    assert (pv.spec.nfs.server, pv.spec.nfs.path) == (
        f"{account}.file.core.windows.net",
        f"/{account}/datasets",
    )
    assert pv.spec.mount_options == ["vers=4", "minorversion=1", "sec=sys"]
    assert pv.spec.capacity == {"storage": "512Gi"}
    assert pv.spec.persistent_volume_reclaim_policy == "Retain"
    assert pv.spec.access_modes == ["ReadWriteMany"]

    def bound() -> bool:
        claim = core_v1.read_namespaced_persistent_volume_claim("imagenet", namespace)
        return bool(claim.status.phase == "Bound" and claim.spec.volume_name == pv_name)

    wait_for(bound, timeout=60, interval=0.5, what="the claim bound to the file server's PV")
    assert core_v1.read_persistent_volume(pv_name).status.phase == "Bound"

    # Again: nothing changes, in Azure or in the cluster.
    before = len(player.requests)
    assert run([*create, "--apply", "-n", namespace, "--claim-name", "imagenet", *kube], player) == 0
    err = capsys.readouterr().err
    assert f"PersistentVolume {pv_name} unchanged" in err and "nothing changed in Azure" in err
    assert {r.method for r in player.requests[before:]} == {"GET"}

    # The CRD's schema accepts jobs with either printed stanza.
    for name, volume in (("inline-nfs", nfs_volume), ("via-claim", printed_volume(out))):
        manifest = json.dumps(job_manifest(name, volume))
        done = kubectl(kubeconfig, "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=manifest)
        assert done.returncode == 0, done.stderr

    # A job on the claim (no operator runs here, so it never finishes) holds the share.
    custom = client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, job_manifest("r50", printed_volume(out))
    )
    delete = ["fileserver", "delete", "--subscription", "sub-1", "-g", "ml-rg", "--account", account, "--yes"]
    assert run([*delete, *kube], player) == 1
    err = capsys.readouterr().err
    assert (
        f"in use by 1 unfinished job(s): {namespace}/r50 (no phase yet; spec.dataset.volume: claim imagenet)"
        in err
    )
    assert account in player.accounts and not any(r.method == "DELETE" for r in player.requests)

    # Once it has finished, the share, the account (it held nothing else), the PV and the claim go.
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "r50", {"status": {"phase": "Succeeded"}}
    )
    assert run([*delete, *kube], player) == 0
    assert account not in player.accounts
    err = capsys.readouterr().err
    assert (
        f"PersistentVolumeClaim {namespace}/imagenet deleted" in err
        and f"PersistentVolume {pv_name} deleted" in err
    )

    def gone() -> bool:
        selector = f"dtjob.io/fileserver={account}"
        return not core_v1.list_persistent_volume(label_selector=selector).items and not (
            core_v1.list_namespaced_persistent_volume_claim(namespace).items
        )

    wait_for(
        gone, timeout=60, interval=0.5, what="the PV and the claim deleted (protection finalizers lifted)"
    )
