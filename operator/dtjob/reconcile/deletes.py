"""Deletes over the thin client (dtjob.kube.client.Kube) that touch only what is ours: each object is read (or
was observed), its owner checked (a name, or a label, is anyone's to set), and deleted on the condition of the
UID that was read, so nothing created in between is ever deleted. Delete-if-present: a 404 is success."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from dtjob import KIND, names
from dtjob.desired.owned import owner_uids
from dtjob.kube.client import Conflict, Kube, identity_of
from dtjob.state.hosts import StaleSlice

log = logging.getLogger(__name__)


def delete_owned(
    kube: Kube, kind: str, namespace: str, name: str, owner_uid: str, api_version: str | None = None,
    background: bool = False,
) -> None:  # fmt: skip
    """Delete the object only while `owner_uid` owns it (a Secret, a PodGroup, a staging Job: the name
    alone may be another owner's). A cluster that does not serve the kind's API has none to delete.
    `background`: the object goes at once and the garbage collector removes its dependents."""
    kube.check_leader()  # a standby reads nothing it could not act on
    found = kube.get(kind, namespace, name, api_version)
    if found is None:
        return
    if owner_uid not in owner_uids(found):
        log.warning("left %s %s/%s alone: it is not owned by %s", kind, namespace, name, owner_uid)
        return
    uid = (found.get("metadata") or {}).get("uid")
    kube.delete(kind, namespace, name, api_version, uid=uid, background=background)


def delete_pods(kube: Kube, namespace: str, label_selector: str, owner_uid: str) -> None:
    """Delete the pods the selector finds that `owner_uid` owns, each only while it is the pod listed."""
    kube.check_leader()  # a standby lists nothing it could not act on
    for pod in kube.list("Pod", namespace, labels=label_selector, keep=identity_of):
        meta = pod["metadata"]
        if owner_uid in owner_uids(pod):
            kube.delete("Pod", namespace, meta["name"], uid=meta.get("uid"))


def delete_pod(kube: Kube, namespace: str, name: str, uid: str) -> None:
    """The pod observed with `uid`; a pod of that name with another UID (created since) stays."""
    if not uid:
        log.warning("left Pod %s/%s alone: deleted only by the UID it was observed with, and it had none",
                    namespace, name)  # fmt: skip
        return
    kube.delete("Pod", namespace, name, uid=uid)


def force_delete_pod(kube: Kube, namespace: str, name: str, uid: str) -> bool:
    """Delete a pod at once, without its kubelet's confirmation (grace period 0), and only while it is the
    pod with `uid`. False when it is gone already or was replaced."""
    if not kube.delete("Pod", namespace, name, uid=uid, grace_period_s=0):
        return False
    log.warning(
        "force-deleted Pod %s/%s (uid %s): still terminating past its grace period", namespace, name, uid
    )
    return True


def remove_pod_finalizer(kube: Kube, namespace: str, name: str, uid: str, finalizer: str) -> bool:
    """Take `finalizer` off the pod while it is the pod with `uid` (a JSON patch whose tests fail on any other
    pod, or on a list changed since the read). False: gone, replaced, or the finalizer is off."""
    pod = kube.get("Pod", namespace, name)
    meta = (pod or {}).get("metadata") or {}
    present = list(meta.get("finalizers") or ())
    if meta.get("uid") != uid or finalizer not in present:
        return False
    at = f"/metadata/finalizers/{present.index(finalizer)}"
    if not _remove_listed(kube, namespace, name, uid, at, at, finalizer):
        return False  # changed since the read: the next reconcile looks again
    log.info("removed finalizer %s from Pod %s/%s", finalizer, namespace, name)
    return True


def annotate_pod(kube: Kube, namespace: str, name: str, uid: str, key: str, value: str) -> bool:
    """Set annotation `key` on a pod that has annotations, only while it is the pod with `uid`. False: gone or
    replaced."""
    path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
    patch = [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "add", "path": path, "value": value},
    ]
    try:
        return kube.patch("Pod", namespace, name, patch) is not None
    except Conflict:
        return False


def remove_pod_gate(kube: Kube, namespace: str, name: str, uid: str, gate: str) -> bool:
    """Take scheduling gate `gate` off the pod while it is the pod with `uid`. First where the operator puts
    it (the first gate), without a read; where a webhook put another before it, at the index a read finds.
    False: gone, replaced, or the gate is off."""
    removed = _remove_listed(
        kube, namespace, name, uid, "/spec/schedulingGates/0", "/spec/schedulingGates/0/name", gate
    )
    if not removed:
        pod = kube.get("Pod", namespace, name) or {}
        gates = [str(g.get("name")) for g in (pod.get("spec") or {}).get("schedulingGates") or ()]
        if (pod.get("metadata") or {}).get("uid") != uid or gate not in gates:
            return False
        at = f"/spec/schedulingGates/{gates.index(gate)}"
        if not _remove_listed(kube, namespace, name, uid, at, f"{at}/name", gate):
            return False  # changed since the read: the next reconcile looks again
    log.info("released Pod %s/%s (gate %s off)", namespace, name, gate)
    return True


def _remove_listed(
    kube: Kube, namespace: str, name: str, uid: str, path: str, tested: str, value: str
) -> bool:
    """Remove the list item at `path` of the pod while it is the pod with `uid` and `tested` holds `value`
    (a JSON patch whose tests fail otherwise). False: the pod is gone, or a test failed."""
    patch = [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": tested, "value": value},
        {"op": "remove", "path": path},
    ]
    try:
        return kube.patch("Pod", namespace, name, patch) is not None
    except Conflict:
        return False


def delete_launcher(kube: Kube, namespace: str, job_name: str, job_uid: str) -> None:
    """The job's launcher Job, made by an earlier release of the operator (today's launcher is a pod, deleted
    as one), while `job_uid` owns it, on the condition of the UID it was listed with; background: the Job goes
    at once and the garbage collector removes its pod."""
    kube.check_leader()  # a standby lists nothing it could not act on
    name = names.launcher_name(job_name)
    selector = f"{names.JOB_NAME_LABEL}={job_name},{names.ROLE_LABEL}={names.ROLE_LAUNCHER}"
    for found in kube.list("Job", namespace, labels=selector, keep=identity_of):
        meta = found["metadata"]
        if meta["name"] == name and job_uid in owner_uids(found):
            kube.delete("Job", namespace, name, uid=meta.get("uid"), background=True)


def delete_service_slices(kube: Kube, namespace: str, service: str, slices: Iterable[StaleSlice]) -> None:
    """What Kubernetes' controllers made for the Service `service` (the job's: ensured just before), each
    under the UID it was observed with: an EndpointSlice controller's slice only while that Service owns it;
    a mirrored slice, and the Endpoints object of the Service's name it mirrors (whose UID the slice names
    as its owner): the Endpoints controller left it when the selector went, and it would be mirrored again."""
    found = kube.get("Service", namespace, service)
    owner = str(((found or {}).get("metadata") or {}).get("uid") or "")
    for stale in slices:
        if stale.mirrored:
            for endpoints_uid in stale.owners:
                kube.delete("Endpoints", namespace, service, uid=endpoints_uid)
            kube.delete("EndpointSlice", namespace, stale.name, uid=stale.uid)
        elif owner and owner in stale.owners:
            kube.delete("EndpointSlice", namespace, stale.name, uid=stale.uid)
        else:
            what = f"EndpointSlice {namespace}/{stale.name}"
            log.warning("left %s alone: it is not owned by Service %s", what, service)


def delete_training_job(kube: Kube, namespace: str, name: str, uid: str) -> None:
    """The DistributedTrainingJob with `uid` (its TTL elapsed): one created again under its name stays."""
    kube.delete(KIND, namespace, name, uid=uid, background=True)
