"""act(): carry out a Decision's actions in order, against the API server and Blob Storage.

Every action is idempotent (create-if-absent, delete-if-present), so a crash halfway and a rerun converge.
Returns what the status must record: the log upload's outcome, a minted SAS token's digest, the SAS Secrets'
deletion, a pod force-deleted, and a refusal: the first action the API server or Azure refuses (Rejected,
Forbidden, a name another owner holds, the PodGroup API not served, credentials refused for good), or that the
operator refuses itself (a pod naming what is not the job's: dtjob.reconcile.pod_trust), ends the run with a
Refused result, which dtjob.machine.refusals turns into a condition. What is no outcome of the job
propagates: a lost leadership, a conflict, an API error, and credentials that vanished since they were
observed (the retry observes them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from dtjob import desired, gang, metrics, names
from dtjob.config import OperatorConfig
from dtjob.desired.sshkeys import generate_keypair
from dtjob.gang import kueue
from dtjob.gang.pod_groups import POD_GROUP_KIND
from dtjob.kube.client import ApiNotServed, Forbidden, Kube, NotOurs, Rejected
from dtjob.names import Access
from dtjob.reconcile import deletes, pod_trust, storage_act
from dtjob.reconcile.ensure import Applied, ensure_all
from dtjob.reconcile.storage_observe import StorageRefused
from dtjob.spec.managed_by import unqueued
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import (
    Action,
    CreateLauncher,
    CreateStagingJob,
    CreateWorker,
    DeleteJob,
    DeleteLauncher,
    DeletePod,
    DeletePodGroup,
    DeleteSasSecrets,
    DeleteWorld,
    EnsureWorld,
    FinishKueueGroup,
    ForceDeletePod,
    LogsUploaded,
    MintSas,
    PodForceDeleted,
    PublishHosts,
    RefusalKind,
    Refused,
    ReleaseLauncher,
    ReleasePod,
    Result,
    RetireSelector,
    SasSecretsDeleted,
    UploadLogs,
)
from dtjob.state.observed import PodState

log = logging.getLogger(__name__)
Json = dict[str, Any]
# The Kubernetes client's refusals, and what kind of refusal each is.
_REFUSALS: tuple[tuple[type[Exception], RefusalKind], ...] = (
    (Rejected, RefusalKind.REJECTED),
    (Forbidden, RefusalKind.FORBIDDEN),
    (NotOurs, RefusalKind.NOT_OURS),
    (ApiNotServed, RefusalKind.API_NOT_SERVED),
)
_REFUSED = tuple(cls for cls, _ in _REFUSALS)


def act(
    kube: Kube,
    config: OperatorConfig,
    spec: JobSpec,
    owner: Json,
    actions: Sequence[Action],
    pods: Sequence[PodState],
    output_url: str | None,
    now: datetime,
) -> list[Result]:
    """`pods`: every pod of the job as observed (whose logs UploadLogs reads); `output_url`: the run's folder.
    Stops at the first refused action: its Refused is the last result."""
    results: list[Result] = []
    for step in _steps(actions):
        try:
            result = _run_step(kube, config, spec, owner, step, pods, output_url, now)
        except StorageRefused as refused:
            if not refused.blocker.fatal:
                raise  # credentials that vanished since observe(): the retry sees them missing and waits
            blocker = refused.blocker
            result = Refused(RefusalKind.STORAGE, _first(step), blocker.message, blocker.reason)
        except _REFUSED as err:
            kind = next(kind for cls, kind in _REFUSALS if isinstance(err, cls))
            result = Refused(kind, _first(step), str(err))
        if result is not None:
            results.append(result)
        if isinstance(result, Refused):
            break
    return results


def _run_step(
    kube: Kube,
    config: OperatorConfig,
    spec: JobSpec,
    owner: Json,
    step: Action | list[CreateWorker],
    pods: Sequence[PodState],
    output_url: str | None,
    now: datetime,
) -> Result | None:
    if isinstance(step, list):  # a world's worker pods: created at once, or none of them
        workers = [desired.worker_pod(spec, owner, w.index, w.attempt, w.avoid_nodes) for w in step]
        return _create_pods(kube, config, spec, owner, step[0], workers)
    pod_bearing = _pod_bearing(config, spec, owner, step)
    if pod_bearing is not None:
        return _create_pods(kube, config, spec, owner, step, pod_bearing)
    return _run(kube, config, spec, owner, step, pods, output_url, now)


def _pod_bearing(config: OperatorConfig, spec: JobSpec, owner: Json, action: Action) -> list[Json] | None:
    """The pod, or batch Job of pods, an action creates, built from the spec as it is now; None for any
    other."""
    match action:
        case CreateLauncher(attempt=attempt, outside_kueue_group=outside):
            return [desired.launcher_pod(unqueued(spec) if outside else spec, owner, attempt)]
        case CreateStagingJob():
            return [desired.staging_job(spec, owner, config.stager_image)]
    return None


def _first(step: Action | list[CreateWorker]) -> Action:
    return step[0] if isinstance(step, list) else step


def _steps(actions: Sequence[Action]) -> list[Action | list[CreateWorker]]:
    """The actions in order, each a step of its own but for a run of CreateWorker, which is one step."""
    steps: list[Action | list[CreateWorker]] = []
    for action in actions:
        last = steps[-1] if steps else None
        if isinstance(action, CreateWorker) and isinstance(last, list):
            last.append(action)
        elif isinstance(action, CreateWorker):
            steps.append([action])
        else:
            steps.append(action)
    return steps


def _run(
    kube: Kube,
    config: OperatorConfig,
    spec: JobSpec,
    owner: Json,
    action: Action,
    pods: Sequence[PodState],
    output_url: str | None,
    now: datetime,
) -> Result | None:
    ns = spec.namespace
    match action:
        case MintSas(access=access, not_after=not_after):
            return storage_act.mint_sas(kube, spec, Access(access), not_after, owner, now, config)
        case EnsureWorld():
            if gang.pod_group_api(spec) is not None:
                # Before anything else: a cluster without the gang scheduler's API gets nothing of the world.
                worker = desired.worker_pod(spec, owner, 0, 0)
                _ensure(kube, desired.pod_group(spec, owner, worker))
            _ensure_all(kube, _world_objects(config, spec, owner))
        case PublishHosts(hosts=hosts, published=published):
            _publish(kube, desired.hosts_slice(spec, owner, hosts), published)
        case RetireSelector(slices=slices):
            _ensure(kube, desired.workers_service(spec, owner))  # ours: its selector goes with the drift
            deletes.delete_service_slices(kube, ns, names.service_name(spec.name), slices)
        case DeletePod(name=pod, uid=uid):
            deletes.delete_pod(kube, ns, pod, uid)
        case ForceDeletePod(name=pod, uid=uid, overdue_s=overdue):
            return PodForceDeleted(pod, overdue) if deletes.force_delete_pod(kube, ns, pod, uid) else None
        case ReleasePod(name=pod, uid=uid):
            deletes.remove_pod_finalizer(kube, ns, pod, uid, kueue.POD_FINALIZER)
        case FinishKueueGroup(name=pod, uid=uid):
            deletes.annotate_pod(kube, ns, pod, uid, kueue.RETRIABLE_IN_GROUP, kueue.NOT_RETRIABLE)
        case ReleaseLauncher(name=pod, uid=uid):
            deletes.remove_pod_gate(kube, ns, pod, uid, names.LAUNCH_GATE)
        case DeleteLauncher():
            deletes.delete_launcher(kube, ns, spec.name, str(owner["uid"]))
        case DeletePodGroup():
            api = gang.pod_group_api(spec)
            if api is not None:
                name = names.pod_group_name(spec.name)
                deletes.delete_owned(kube, POD_GROUP_KIND, ns, name, str(owner["uid"]), api)
        case UploadLogs(attempt=attempt):
            return _upload_logs(kube, spec, str(owner["uid"]), pods, attempt, output_url, config, now)
        case DeleteSasSecrets():
            storage_act.delete_sas_secrets(kube, ns, spec.name, str(owner["uid"]))
            return SasSecretsDeleted()
        case DeleteWorld(launcher=launcher):
            delete_world(kube, ns, spec.name, str(owner["uid"]), launcher)
        case DeleteJob():
            log.info("ttlSecondsAfterFinished elapsed: deleting %s/%s", ns, spec.name)
            deletes.delete_training_job(kube, ns, spec.name, str(owner["uid"]))
    return None


def delete_world(kube: Kube, namespace: str, name: str, uid: str, launcher: bool = True) -> None:
    """The pods of the job `uid` (its launcher's among them) by owner, never by label alone (those created a
    moment ago too); when `launcher`, a legacy launcher Job too, only while `uid` owns it."""
    deletes.delete_pods(kube, namespace, f"{names.JOB_NAME_LABEL}={name}", uid)
    if launcher:
        deletes.delete_launcher(kube, namespace, name, uid)


def _ensure(kube: Kube, obj: Json) -> None:
    _ensure_all(kube, [obj])


def _create_pods(
    kube: Kube, config: OperatorConfig, spec: JobSpec, owner: Json, action: Action, objs: Sequence[Json]
) -> Refused | None:
    """Pods, or batch Jobs of pods, each built from the spec as it is now, created only when what they name
    is the job's to hand out (dtjob.desired.pod_trust); otherwise none of them, and the refusal."""
    verdict = pod_trust.untrusted(kube, config, spec, str(owner["uid"]), objs)
    if verdict is not None:
        kind = RefusalKind.UNTRUSTED if verdict.fatal else RefusalKind.SECRET_MISSING
        return Refused(kind, action, verdict.message, verdict.reason, verdict.field)
    _ensure_all(kube, objs)
    return None


def _publish(kube: Kube, endpoint_slice: Json, published: bool) -> None:
    """The slice's hosts: one patch of the slice observed as ours, else ensured (created, or read, its owner
    checked and its hosts brought in line)."""
    meta = endpoint_slice["metadata"]
    body = {key: endpoint_slice[key] for key in ("endpoints", "ports")}
    if not (published and kube.patch(endpoint_slice["kind"], meta["namespace"], meta["name"], body)):
        _ensure(kube, endpoint_slice)


def _world_objects(config: OperatorConfig, spec: JobSpec, owner: Json) -> list[Json]:
    """What the world needs before its pods: the headless Service, and for an MPI world its SSH key Secret
    and hostfile; with the operator's networkPolicy option, the policies that admit only the job's pods."""
    world = [desired.workers_service(spec, owner)]
    if spec.torchrun is None:
        # A fresh key pair costs microseconds; an existing Secret keeps its keys (Secrets are never
        # patched), so creating first spares a read in the common case.
        keys = generate_keypair(comment=f"dtjob-{spec.name}")
        world = [desired.ssh_secret(spec, owner, keys), desired.hostfile_config_map(spec, owner), *world]
    if config.network_policy:
        world.append(desired.network_policy(spec, owner))
        if spec.torchrun is None:  # no launcher in a torchrun world
            world.append(desired.launcher_network_policy(spec, owner))
    return world


def _ensure_all(kube: Kube, objs: Sequence[Json]) -> None:
    """Each of `objs` at once; NotOurs naming the first whose name another owner's object holds."""
    for obj, applied in zip(objs, ensure_all(kube, objs), strict=True):
        if applied is Applied.NOT_OURS:
            raise NotOurs(f"{obj['kind']} {obj['metadata']['name']}")


def _upload_logs(
    kube: Kube,
    spec: JobSpec,
    uid: str,
    pods: Iterable[PodState],
    attempt: int | None,
    output_url: str | None,
    config: OperatorConfig,
    now: datetime,
) -> LogsUploaded:
    """At the end every pod's log; before a restart (best effort, once) the failed attempt's."""
    folder = names.logs_folder(output_url or "", attempt)
    if attempt is not None:
        pods = [p for p in pods if p.attempt == attempt]
    upload = storage_act.upload_pod_logs(
        kube, spec, uid, pods, attempt=attempt, cap_bytes=config.log_cap_bytes, config=config, now=now
    )
    metrics.logs_uploaded(upload.uploaded, len(upload.missing))
    return LogsUploaded(
        attempt, upload.uploaded, folder, upload.missing, upload.error, upload.truncated, upload.cap_bytes
    )
