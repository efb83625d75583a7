"""One reconcile of one job, one way: read it, parse, observe, decide, record, act, record the results.

The status is written before the actions (it records intent, e.g. restarts+1, that the actions then carry
out); what the actions produce (the log upload, the SAS revocation) is written after them, so the status never
claims what has not happened. Blocking (the Kubernetes client is synchronous); the controller runs it in a
worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from dtjob import metrics, names
from dtjob.config import OperatorConfig
from dtjob.desired.common import owner_reference
from dtjob.desired.owned import owner_uids
from dtjob.kube.client import ApiNotServed, Forbidden, Kube, NotOurs, Rejected
from dtjob.machine import decide, invalid_spec, with_results
from dtjob.reconcile.act import act
from dtjob.reconcile.observe import observe
from dtjob.reconcile.refusals import child_not_ours, create_forbidden, gang_api_missing
from dtjob.reconcile.storage_act import delete_sas_secrets
from dtjob.reconcile.storage_observe import StorageRefused
from dtjob.spec.parse import JobSpec, SpecError, parse_spec
from dtjob.state.decision import Event, SasSecretsDeleted
from dtjob.state.observed import Children
from dtjob.state.status import FINISHED, JobStatus, status_from_dict

log = logging.getLogger(__name__)
Json = dict[str, Any]


def reconcile(
    kube: Kube,
    config: OperatorConfig,
    namespace: str,
    name: str,
    children: Children,
    now: datetime | None = None,
) -> float | None:
    """Returns seconds until this job needs another look without any event (deadline, TTL), or None."""
    now = now or datetime.now(UTC)
    job = kube.get_job(namespace, name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return None  # gone or going: ownerReferences let the garbage collector remove the children
    meta = job["metadata"]
    prev = status_from_dict(job.get("status"))
    try:
        spec = parse_spec(job, config)
    except SpecError as err:
        decision = invalid_spec(prev, err.path, err.message, now, meta.get("generation"))
        version = _record(kube, job, decision.status, decision.events, now)
        if prev.phase not in FINISHED:
            # An edit the operator rejects mid-run: nothing of the old world may go on holding GPUs or tokens.
            _delete_world(kube, namespace, name, str(meta["uid"]), _owns(children.launcher, str(meta["uid"])))
            delete_sas_secrets(kube, namespace, name, str(meta["uid"]))
            status, events = with_results(decision.status, [SasSecretsDeleted()])
            _record(kube, {**job, "status": decision.status.to_dict()}, status, events, now, version)
        return decision.requeue_after

    observed = observe(kube, config, spec, job, prev, children, now)
    decision = decide(spec, observed, prev, now)
    version = _record(kube, job, decision.status, decision.events, now)
    # Counted once recorded: a Conflict in _record means the next reconcile decides the restart again.
    if decision.status.restarts > prev.restarts:
        restarting = decision.status.condition("Restarting")
        metrics.world_restarted(restarting.reason if restarting is not None else "")
    owner = owner_reference(name, meta["uid"])
    try:
        results = act(
            kube, config, spec, owner, decision.actions, observed.children, decision.status.output_url, now
        )
    except Rejected as err:
        _fail(kube, namespace, name, "spec", str(err), "ChildRejected", now)
        return None
    except Forbidden as err:
        return _forbidden(kube, namespace, name, str(err), now)
    except NotOurs as err:
        return _wait_for_name(kube, namespace, name, str(err), now)
    except ApiNotServed as err:
        return _wait_for_api(kube, spec, str(err), now)
    except StorageRefused as refused:
        if not refused.blocker.fatal:
            raise  # credentials that vanished since observe(): the retry sees them missing and waits
        _fail(kube, namespace, name, "spec", refused.blocker.message, refused.blocker.reason, now)
        return None
    if results:
        status, events = with_results(decision.status, results)
        _record(kube, {**job, "status": decision.status.to_dict()}, status, events, now, version)
    return decision.requeue_after


def _record(
    kube: Kube,
    job: Mapping[str, Any],
    status: JobStatus,
    events: Sequence[Event],
    now: datetime,
    resource_version: str | None = None,
) -> str:
    """The one place status is written: patched only when it changed, guarded by the resourceVersion it was
    decided from (a stale read never overwrites newer status). Returns the resourceVersion after it."""
    meta = job["metadata"]
    version = resource_version or str(meta["resourceVersion"])
    new = status.to_dict()
    if _changed(job.get("status") or {}, new):
        version = kube.patch_status(meta["namespace"], meta["name"], new, version)
    for event in events:
        kube.emit_event(job, event.type, event.reason, event.message, now)
    return version


def _fail(kube: Kube, namespace: str, name: str, path: str, message: str, reason: str, now: datetime) -> None:
    """Something the schema let through but the API server or Azure refused: Failed with its message, and no
    half world left."""
    job = kube.get_job(namespace, name)
    if job is None:
        return
    prev = status_from_dict(job.get("status"))
    decision = invalid_spec(prev, path, message, now, job["metadata"].get("generation"), reason=reason)
    _record(kube, job, decision.status, decision.events, now)
    _delete_world(kube, namespace, name, str(job["metadata"]["uid"]))


def _forbidden(kube: Kube, namespace: str, name: str, message: str, now: datetime) -> float | None:
    """A child refused with 403: Failed naming the field (Pod Security admission) and no world left, or a
    waiting condition quoting the API server (a quota, RBAC) and another try later."""
    job = kube.get_job(namespace, name)
    if job is None:
        return None
    meta = job["metadata"]
    decision = create_forbidden(status_from_dict(job.get("status")), message, now, meta.get("generation"))
    _record(kube, job, decision.status, decision.events, now)
    if decision.status.phase in FINISHED:
        _delete_world(kube, namespace, name, str(meta["uid"]))
    return decision.requeue_after


def _wait_for_name(kube: Kube, namespace: str, name: str, child: str, now: datetime) -> float | None:
    job = kube.get_job(namespace, name)
    if job is None:
        return None
    decision = child_not_ours(
        status_from_dict(job.get("status")), child, now, job["metadata"].get("generation")
    )
    _record(kube, job, decision.status, decision.events, now)
    return decision.requeue_after


def _wait_for_api(kube: Kube, spec: JobSpec, api: str, now: datetime) -> float | None:
    job = kube.get_job(spec.namespace, spec.name)
    if job is None:
        return None
    prev = status_from_dict(job.get("status"))
    decision = gang_api_missing(prev, spec, api, now, job["metadata"].get("generation"))
    _record(kube, job, decision.status, decision.events, now)
    return decision.requeue_after


def _delete_world(kube: Kube, namespace: str, name: str, uid: str, launcher_ours: bool = True) -> None:
    """The pods and the launcher Job of the job `uid`: pods by owner, never by label alone; the launcher Job
    when it is ours (after this pass's creates it is: a create never takes a name another owner holds)."""
    kube.delete_pods(namespace, f"{names.JOB_NAME_LABEL}={name}", uid)
    if launcher_ours:
        kube.delete_batch_job(namespace, names.launcher_name(name))


def _owns(child: Mapping[str, Any] | None, uid: str) -> bool:
    return child is not None and uid in owner_uids(child)


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the patch would change anything; a null in it (a field to remove) equals an absent field."""
    return any(_present(old.get(key)) != _present(value) for key, value in new.items())


def _present(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _present(v) for k, v in value.items() if v is not None}
    return value


__all__ = ["Children", "reconcile"]
