"""The staging Job of a job with spec.dataset.stageFrom (dtjob.stager.job builds it; this fills it from the
spec): it runs on the CPU pool as the stager image's user, writes the data volume, and sees the input SAS only
as mounted files."""

from __future__ import annotations

from dtjob.desired.common import STAGER_UID, Json, pod_security_context
from dtjob.desired.pods import data_volume
from dtjob.spec import JobSpec
from dtjob.stager.job import staging_job as build_staging_job


def staging_job(spec: JobSpec, owner: Json, image: str) -> Json:
    staging, volume, data = spec.dataset.staging, spec.dataset.volume, data_volume(spec)
    assert staging is not None and volume is not None and data is not None  # parse_spec guarantees them
    job = build_staging_job(
        spec.name,
        spec.namespace,
        owner,
        staging.source.source.prefix,
        staging.destination,
        staging.source.concurrency,
        data_volume=data,
        data_mount_path=volume.mount_path,
        image=image,
        node_selector=spec.placement.launcher_node_selector,
        tolerations=spec.placement.launcher_tolerations,
        active_deadline_seconds=spec.run_policy.active_deadline_seconds,
        # fsGroup makes the group-readable SAS files readable, and the data volume writable where it supports
        # fsGroup (an NFS share's own ownership decides instead).
        pod_security_context=pod_security_context(STAGER_UID),
    )
    if staging.pod_annotations:
        job["spec"]["template"]["metadata"]["annotations"] = dict(staging.pod_annotations)
    return job
