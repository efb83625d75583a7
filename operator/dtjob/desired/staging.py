"""The staging Job of a job with spec.dataset.stageFrom: one pod on the CPU pool that copies
`<container>/<prefix>` onto the data volume as the stager image's user. It sees the input SAS only as files of
the mounted `<job>-sas-in` Secret, group-readable through the pod's fsGroup."""

from __future__ import annotations

from dataclasses import replace

from dtjob import names
from dtjob.desired.command import stager_download_args
from dtjob.desired.common import STAGER_UID, Json, container_security_context, metadata, pod_security_context
from dtjob.desired.pods import pod_volume, sas_volume, sas_volume_mount
from dtjob.names import Access
from dtjob.spec import validators as rules
from dtjob.spec.parse import DataVolume, JobSpec

# Transient failures (a node lost, a throttled account) are worth a retry; resumability makes retries cheap.
STAGER_BACKOFF_LIMIT = 2


def staging_job(spec: JobSpec, owner: Json, image: str) -> Json:
    """The staging Job. The data volume is mounted where the workers mount it, so the destination means the
    same path to the stager and to training."""
    staging, volume = spec.dataset.staging, spec.dataset.volume
    assert staging is not None and volume is not None  # parse_spec guarantees them
    data = pod_volume(rules.DATA_VOLUME, _writable(volume))
    container: Json = {
        "name": names.STAGER_CONTAINER,
        "image": image,
        "args": stager_download_args(
            spec.name, staging.source.source.prefix, staging.destination, staging.source.concurrency
        ),
        "volumeMounts": [
            {"name": data["name"], "mountPath": volume.mount_path},
            sas_volume_mount(Access.INPUT),
        ],
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        # The stager writes its final progress JSON (with the failure reason) there.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # The restricted Pod Security Standard; the stager writes only the data volume.
        "securityContext": container_security_context(read_only_root=True),
    }
    pod_spec: Json = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [data, sas_volume(spec.name, Access.INPUT)],
        # fsGroup makes the group-readable SAS files readable, and the data volume writable where it supports
        # fsGroup (an NFS share's own ownership decides instead).
        "securityContext": pod_security_context(STAGER_UID),
    }
    if spec.stager_pull_secrets:  # the stager image is the installer's, as are these
        pod_spec["imagePullSecrets"] = [{"name": s} for s in spec.stager_pull_secrets]
    if spec.placement.launcher_node_selector:
        pod_spec["nodeSelector"] = dict(spec.placement.launcher_node_selector)
    if spec.placement.launcher_tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.placement.launcher_tolerations]
    labels = names.labels(spec.name, "staging", names.ROLE_STAGER)
    template: Json = {"metadata": {"labels": labels}, "spec": pod_spec}
    if staging.pod_annotations:
        template["metadata"]["annotations"] = dict(staging.pod_annotations)
    job_spec: Json = {"backoffLimit": STAGER_BACKOFF_LIMIT, "template": template}
    if spec.run_policy.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.run_policy.active_deadline_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(names.staging_job_name(spec.name), spec.namespace, labels, owner),
        "spec": job_spec,
    }


def _writable(volume: DataVolume) -> DataVolume:
    """Workers may mount the dataset read-only; the stager is the one writer."""
    return replace(
        volume,
        nfs=replace(volume.nfs, read_only=False) if volume.nfs else None,
        pvc=replace(volume.pvc, read_only=False) if volume.pvc else None,
    )
