"""One reconcile of one job, one way: read it, parse, observe, decide, record, act, record the results.

The status is written before the actions (it records intent, e.g. restarts+1, that the actions then carry
out); what the actions produce (the log upload, the SAS revocation, a refusal) is written after them, so the
status never claims what has not happened. A refusal that fails the job then deletes its world. Blocking (the
Kubernetes client is synchronous); the controller runs it in a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from dtjob import metrics
from dtjob.config import OperatorConfig
from dtjob.desired.common import owner_reference
from dtjob.desired.owned import owner_uids
from dtjob.kube.client import Kube
from dtjob.machine import decide, invalid_spec, settle, with_results, wound_down
from dtjob.machine.admission import admitted_group
from dtjob.machine.prebuilt import admitted_world
from dtjob.reconcile import reads
from dtjob.reconcile.act import act, delete_world
from dtjob.reconcile.dispatch import dispatch, finish_prebuilt
from dtjob.reconcile.observe import observe
from dtjob.reconcile.storage_act import delete_sas_secrets
from dtjob.spec.managed_by import dispatched
from dtjob.spec.parse import JobSpec, SpecError, parse_spec
from dtjob.state.decision import Action, Decision, DeletePod, Event, SasSecretsDeleted
from dtjob.state.observed import Children, Observed
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
    job = reads.get_job(kube, namespace, name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return None  # gone or going: ownerReferences let the garbage collector remove the children
    if dispatched(job):
        return dispatch(kube, config, job, now)  # its Workload, and nothing else: it runs on a worker cluster
    meta = job["metadata"]
    prev = status_from_dict(job.get("status"))
    try:
        spec = parse_spec(job, config)
    except SpecError as err:
        decision = invalid_spec(prev, err.path, err.message, now, meta.get("generation"))
        version = _record(kube, job, decision.status, decision.events, now)
        if prev.phase not in FINISHED:
            # An edit the operator rejects mid-run: nothing of the old world may go on holding GPUs or tokens.
            uid = str(meta["uid"])
            delete_world(kube, namespace, name, uid, _owns(children.launcher, uid))
            delete_sas_secrets(kube, namespace, name, uid)
            status, events = with_results(decision.status, [SasSecretsDeleted()])
            _record(kube, {**job, "status": decision.status.to_dict()}, status, events, now, version)
        finish_prebuilt(kube, job, decision.status, now)
        return decision.requeue_after

    observed = observe(kube, config, spec, job, prev, children, now)
    spec = admitted_world(spec, observed.prebuilt)  # on a worker cluster, what Kueue admitted of it
    spec = admitted_group(spec, observed, prev.restarts)  # a world Kueue admitted keeps its size
    decision = decide(spec, observed, prev, now)
    version = _record(kube, job, decision.status, decision.events, now)
    # Counted once recorded: a Conflict in _record means the next reconcile decides the restart again.
    if decision.status.restarts > prev.restarts:
        restarting = decision.status.condition("Restarting")
        metrics.world_restarted(restarting.reason if restarting is not None else "")
    _count_workers_off_nodes(observed, decision.actions)
    owner = owner_reference(name, meta["uid"])
    output = decision.status.output_url
    results = act(kube, config, spec, owner, decision.actions, observed.children, output, now)
    if not results:
        # On a worker cluster, after the status it ends with.
        finish_prebuilt(kube, job, decision.status, now, wound_down(spec, decision.status, now))
        if version != str(meta["resourceVersion"]) and _settled(spec, observed, decision, now):
            reads.job_settled(kube, meta["namespace"], meta["name"], version)
        return decision.requeue_after
    after = settle(decision, results, spec, now)
    _record(kube, {**job, "status": decision.status.to_dict()}, after.status, after.events, now, version)
    act(kube, config, spec, owner, after.actions, observed.children, output, now)  # a failed job's world goes
    finish_prebuilt(kube, job, after.status, now, wound_down(spec, after.status, now))
    return after.requeue_after


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
        version = reads.patch_status(kube, meta["namespace"], meta["name"], new, version)
    for event in events:
        kube.emit_event(job, event.type, event.reason, event.message, now)
    return version


def _settled(spec: JobSpec, observed: Observed, decision: Decision, now: datetime) -> bool:
    """Whether a pass that only changed the status left the job where another pass would change nothing: the
    same observations decided again from the status it wrote give no action, no event and the same status. A
    pass that acted is not settled: its actions' children, and their watch events, bring the next one."""
    if decision.actions or spec.prebuilt_workload is not None:
        return False
    again = decide(spec, observed, decision.status, now)
    return not again.actions and not again.events and again.status == decision.status


def _count_workers_off_nodes(observed: Observed, actions: Sequence[Action]) -> None:
    """Each worker deleted while its node reports a problem (once per pod: dtjob.metrics)."""
    deleted = {a.name for a in actions if isinstance(a, DeletePod)}
    for pod in observed.workers():
        if pod.node_problem is not None and pod.name in deleted:
            metrics.worker_off_node(pod.node_problem.node, pod.node_problem.condition, pod.uid)


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
