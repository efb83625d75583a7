"""The recording fake (tests/unit/recording_kube.py) and the real client against the API server keep one
contract: the same get-or-create, owner-checked delete and guarded-write scenarios run against both, so the
unit tests that rely on the fake test what the operator meets in a cluster."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from dtjob.kube.client import Conflict, Kube, KubeClient
from dtjob.reconcile.deletes import delete_owned, delete_pods, remove_pod_finalizer
from dtjob.reconcile.ensure import Applied, ensure, ensure_all
from dtjob.reconcile.reads import list_nodes

from tests.unit.recording_kube import RecordingKube

pytestmark = pytest.mark.integration
Json = dict[str, Any]
HOLD = (
    "dtjob.io/test-hold"  # a finalizer nothing removes but the test: keeps a deleted object "being deleted"
)


@dataclass
class Backend:
    kube: Kube
    namespace: str

    def owner(self, name: str) -> Json:
        """An ownerReference to a real object (the garbage collector removes what points at none)."""
        self.kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": self._meta(name)})
        found = self.kube.get("ConfigMap", self.namespace, name)
        assert found is not None
        return {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": found["metadata"]["uid"]}

    def config_map(self, name: str, owner: Json, data: dict[str, str], **meta: Any) -> Json:
        metadata = {**self._meta(name), "ownerReferences": [owner], **meta}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}

    def secret(self, name: str, owner: Json, token: str) -> Json:
        metadata = {**self._meta(name), "ownerReferences": [owner]}
        return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "stringData": {"token": token}}

    def pod(self, name: str, owner: Json, **meta: Any) -> Json:
        metadata = {**self._meta(name), "labels": {"app": "contract"}, "ownerReferences": [owner], **meta}
        spec = {"containers": [{"name": "c", "image": "registry.invalid/none:1"}], "nodeName": "nowhere"}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}

    def _meta(self, name: str) -> Json:
        return {"name": name, "namespace": self.namespace}


@pytest.fixture(params=["recording", "api-server"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "recording":
        return Backend(RecordingKube(), "ml")
    return Backend(KubeClient(request.getfixturevalue("operator_api")), request.getfixturevalue("namespace"))


def token_of(secret: Json) -> str:
    """A Secret's token: the API server keeps stringData as base64 data; the fake keeps it as written."""
    data = secret.get("data") or {}
    return base64.b64decode(data["token"]).decode() if "token" in data else str(secret["stringData"]["token"])


def gone_or_going(kube: Kube, kind: str, namespace: str, name: str) -> bool:
    found = kube.get(kind, namespace, name)
    return found is None or bool(found["metadata"].get("deletionTimestamp"))


def test_create_then_ours_unchanged_then_drift_patched(backend: Backend) -> None:
    kube, ns, ours = backend.kube, backend.namespace, backend.owner("ours")
    assert ensure(kube, backend.config_map("hostfile", ours, {"hosts": "a"})) is Applied.CREATED
    assert ensure(kube, backend.config_map("hostfile", ours, {"hosts": "a"})) is Applied.UNCHANGED
    assert ensure(kube, backend.config_map("hostfile", ours, {"hosts": "a b"})) is Applied.UPDATED
    assert (kube.get("ConfigMap", ns, "hostfile") or {})["data"] == {"hosts": "a b"}


def test_fields_the_api_server_fills_in_are_not_drift(backend: Backend) -> None:
    ours = backend.owner("ours")
    ports = [{"name": "ssh", "port": 22}]
    meta = {"name": "workers", "namespace": backend.namespace, "ownerReferences": [ours]}
    spec = {"clusterIP": "None", "selector": {"a": "b"}, "ports": ports}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}
    assert ensure_all(backend.kube, [service]) == [Applied.CREATED]
    assert ensure(backend.kube, service) is Applied.UNCHANGED  # targetPort, protocol: defaulted, not drift


def test_a_name_another_owner_holds_is_not_ours_and_left_alone(backend: Backend) -> None:
    kube, ns = backend.kube, backend.namespace
    theirs, ours = backend.owner("theirs"), backend.owner("ours")
    assert kube.create(backend.config_map("hostfile", theirs, {"hosts": "old"}))
    assert ensure(kube, backend.config_map("hostfile", ours, {"hosts": "new"})) is Applied.NOT_OURS
    assert (kube.get("ConfigMap", ns, "hostfile") or {})["data"] == {"hosts": "old"}


def test_a_name_being_deleted_is_a_conflict_to_retry(backend: Backend) -> None:
    kube, ns, ours = backend.kube, backend.namespace, backend.owner("ours")
    assert kube.create(backend.pod("w-0", ours, finalizers=[HOLD]))
    assert kube.delete("Pod", ns, "w-0")
    with pytest.raises(Conflict, match="being deleted"):
        ensure(kube, backend.pod("w-0", ours))
    uid = (kube.get("Pod", ns, "w-0") or {})["metadata"]["uid"]
    assert remove_pod_finalizer(kube, ns, "w-0", uid, HOLD)
    kube.delete("Pod", ns, "w-0", grace_period_s=0)
    assert kube.get("Pod", ns, "w-0") is None


def test_deletes_take_only_what_is_ours_and_only_the_object_read(backend: Backend) -> None:
    kube, ns = backend.kube, backend.namespace
    theirs, ours = backend.owner("theirs"), backend.owner("ours")
    kube.create(backend.secret("mine", ours, "a"))
    kube.create(backend.secret("shared", theirs, "a"))
    delete_owned(kube, "Secret", ns, "shared", ours["uid"])
    assert kube.get("Secret", ns, "shared") is not None
    stale_uid = str(uuid.uuid4())
    assert not kube.delete("Secret", ns, "mine", uid=stale_uid), "a failed UID precondition deletes nothing"
    assert kube.get("Secret", ns, "mine") is not None
    delete_owned(kube, "Secret", ns, "mine", ours["uid"])
    assert kube.get("Secret", ns, "mine") is None
    delete_owned(kube, "Secret", ns, "mine", ours["uid"])  # already gone: nothing to do
    assert not kube.delete("Secret", ns, "mine")


def test_a_worlds_pods_are_deleted_by_label_only_when_ours(backend: Backend) -> None:
    kube, ns = backend.kube, backend.namespace
    theirs, ours = backend.owner("theirs"), backend.owner("ours")
    kube.create(backend.pod("w-0", ours))
    kube.create(backend.pod("w-1", theirs))
    assert {p["metadata"]["name"] for p in kube.list("Pod", ns, labels="app=contract")} == {"w-0", "w-1"}
    delete_pods(kube, ns, "app=contract", ours["uid"])
    assert gone_or_going(kube, "Pod", ns, "w-0") and not gone_or_going(kube, "Pod", ns, "w-1")


def test_a_finalizer_comes_off_only_the_pod_read(backend: Backend) -> None:
    kube, ns, ours = backend.kube, backend.namespace, backend.owner("ours")
    kube.create(backend.pod("w-0", ours, finalizers=[HOLD]))
    uid = (kube.get("Pod", ns, "w-0") or {})["metadata"]["uid"]
    assert not remove_pod_finalizer(kube, ns, "w-0", str(uuid.uuid4()), HOLD), "another pod of that name"
    assert not remove_pod_finalizer(kube, ns, "w-0", uid, "dtjob.io/not-there")
    assert remove_pod_finalizer(kube, ns, "w-0", uid, HOLD)
    assert not (kube.get("Pod", ns, "w-0") or {"metadata": {}})["metadata"].get("finalizers")
    assert kube.delete("Pod", ns, "w-0", grace_period_s=0)


def test_writes_guarded_by_a_resource_version_that_moved_on_conflict(backend: Backend) -> None:
    kube, ns, ours = backend.kube, backend.namespace, backend.owner("ours")
    kube.create(backend.config_map("hostfile", ours, {"hosts": "a"}))
    version = (kube.get("ConfigMap", ns, "hostfile") or {})["metadata"]["resourceVersion"]
    guarded = {"metadata": {"resourceVersion": version}, "data": {"hosts": "b"}}
    kube.patch("ConfigMap", ns, "hostfile", guarded)  # moves the version on
    with pytest.raises(Conflict):
        kube.patch("ConfigMap", ns, "hostfile", guarded)
    assert (kube.get("ConfigMap", ns, "hostfile") or {})["data"] == {"hosts": "b"}
    assert kube.patch("ConfigMap", ns, "nothing-here", {"data": {}}) is None

    kube.create(backend.secret("sas", ours, "one"))
    version = (kube.get("Secret", ns, "sas") or {})["metadata"]["resourceVersion"]
    kube.replace(backend.secret("sas", ours, "two"), version)
    with pytest.raises(Conflict):
        kube.replace(backend.secret("sas", ours, "three"), version)
    assert token_of(kube.get("Secret", ns, "sas") or {}) == "two"


def test_reads_of_what_is_not_there(backend: Backend) -> None:
    kube, ns = backend.kube, backend.namespace
    assert kube.get("Secret", ns, "absent") is None
    assert (
        kube.get("PodGroup", ns, "absent", "scheduling.volcano.sh/v1beta1") is None
    )  # or no such API at all
    assert kube.list("Pod", ns, labels="app=nothing") == []
    assert isinstance(list_nodes(kube, "dtjob.io/contract=none"), list)
