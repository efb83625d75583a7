"""act(): carry out a Decision's actions in order, against the API server and Blob Storage.

Every action is idempotent (create-if-absent, delete-if-present), so a crash halfway and a rerun converge.
Returns what the status must record: the log upload's outcome, the SAS Secrets' deletion, a pod force-deleted.
Raises Rejected, Forbidden or StorageRefused when the API server or Azure refuses something the spec asked
for, and NotOurs when a child's name is held by another owner's object.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from dtjob import desired, kueue, metrics, names, storage
from dtjob.actions import (
    Action,
    CreateLauncher,
    CreateStagingJob,
    CreateWorker,
    DeleteJob,
    DeleteLauncher,
    DeletePod,
    DeletePodGroup,
    DeleteSasSecrets,
    EnsureWorld,
    ForceDeletePod,
    LogsUploaded,
    MintSas,
    PodForceDeleted,
    ReleasePod,
    Result,
    SasSecretsDeleted,
    UploadLogs,
)
from dtjob.config import OperatorConfig
from dtjob.desired.gang import gang_scheduler
from dtjob.desired.owned import is_ours
from dtjob.kube import Applied, Kube, NotOurs
from dtjob.names import Access
from dtjob.observed import pod_state
from dtjob.spec import JobSpec
from dtjob.sshkeys import generate_keypair

log = logging.getLogger(__name__)
Json = dict[str, Any]


def act(
    kube: Kube,
    config: OperatorConfig,
    spec: JobSpec,
    owner: Json,
    actions: Sequence[Action],
    pods: Iterable[Mapping[str, Any]],
    output_url: str | None,
    now: datetime,
) -> list[Result]:
    """`pods` are the job's pods as observed (whose logs UploadLogs reads); `output_url` the run's folder."""
    results: list[Result] = []
    for action in actions:
        result = _run(kube, config, spec, owner, action, pods, output_url, now)
        if result is not None:
            results.append(result)
    return results


def _run(
    kube: Kube,
    config: OperatorConfig,
    spec: JobSpec,
    owner: Json,
    action: Action,
    pods: Iterable[Mapping[str, Any]],
    output_url: str | None,
    now: datetime,
) -> Result | None:
    ns = spec.namespace
    match action:
        case MintSas(access=access, not_after=not_after):
            storage.mint_sas(kube, spec, Access(access), not_after, owner, now, config)
        case EnsureWorld():
            if spec.run_policy.scheduling.gang is not None:
                # Before anything else: a cluster without the gang scheduler's API gets nothing of the world.
                worker = desired.worker_pod(spec, owner, 0, 0)
                _ensure(kube, desired.pod_group(spec, owner, worker))
            ssh = kube.get_secret(ns, names.ssh_secret_name(spec.name))
            if ssh is None:
                keys = generate_keypair(comment=f"dtjob-{spec.name}")
                _ensure(kube, desired.ssh_secret(spec, owner, keys))
            elif not is_ours(ssh, {"metadata": {"ownerReferences": [owner]}}):
                raise NotOurs(f"Secret {names.ssh_secret_name(spec.name)}")
            _ensure(kube, desired.hostfile_config_map(spec, owner))
            _ensure(kube, desired.workers_service(spec, owner))
            if config.network_policy:
                _ensure(kube, desired.network_policy(spec, owner))
        case CreateWorker(index=index, attempt=attempt):
            _ensure(kube, desired.worker_pod(spec, owner, index, attempt))
        case CreateLauncher(attempt=attempt):
            _ensure(kube, desired.launcher_job(spec, owner, attempt))
        case DeletePod(name=pod):
            kube.delete_pod(ns, pod)
        case ForceDeletePod(name=pod, uid=uid, overdue_s=overdue):
            return PodForceDeleted(pod, overdue) if kube.force_delete_pod(ns, pod, uid) else None
        case ReleasePod(name=pod, uid=uid):
            kube.remove_pod_finalizer(ns, pod, uid, kueue.POD_FINALIZER)
        case DeleteLauncher():
            kube.delete_batch_job(ns, names.launcher_name(spec.name))
        case DeletePodGroup():
            gang = gang_scheduler(spec)
            if gang is not None:
                kube.delete_pod_group(gang.api_version, ns, names.pod_group_name(spec.name))
        case CreateStagingJob():
            _ensure(kube, desired.staging_job(spec, owner, config.stager_image))
        case UploadLogs(attempt=attempt):
            return _upload_logs(
                kube, spec, str(owner["uid"]), pods, attempt, output_url, config.log_cap_bytes
            )
        case DeleteSasSecrets():
            storage.delete_sas_secrets(kube, ns, spec.name)
            return SasSecretsDeleted()
        case DeleteJob():
            log.info("ttlSecondsAfterFinished elapsed: deleting %s/%s", ns, spec.name)
            kube.delete_training_job(ns, spec.name)
    return None


def _ensure(kube: Kube, obj: Json) -> None:
    if kube.ensure(obj) is Applied.NOT_OURS:
        raise NotOurs(f"{obj['kind']} {obj['metadata']['name']}")


def _upload_logs(
    kube: Kube,
    spec: JobSpec,
    uid: str,
    pods: Iterable[Mapping[str, Any]],
    attempt: int | None,
    output_url: str | None,
    cap_bytes: int,
) -> LogsUploaded:
    """At the end every pod's log; before a restart (best effort, once) the failed attempt's."""
    folder = names.logs_folder(output_url or "", attempt)
    if attempt is not None:
        pods = [p for p in pods if pod_state(p).attempt == attempt]
    upload = storage.upload_pod_logs(kube, spec, uid, pods, attempt=attempt, cap_bytes=cap_bytes)
    metrics.logs_uploaded(upload.uploaded, len(upload.missing))
    return LogsUploaded(
        attempt, upload.uploaded, folder, upload.missing, upload.error, upload.truncated, upload.cap_bytes
    )
