"""Pure builders for the Kubernetes side of staging and results: the staging Job, the SAS Secret volumes, the
rank-0 upload command, and reading a finished stager's outcome back from its pod.

Nothing here does I/O; the operator's apply layer creates what these return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dtjob.config import DEFAULT_STAGER_IMAGE
from dtjob.names import (
    ROLE_STAGER,
    SECRET_TOKEN_KEY,
    SECRET_URL_KEY,
    STAGER_CONTAINER,
    Access,
    labels,
    sas_secret_name,
    staging_job_name,
)
from dtjob.transfer_report import ExitCode, ProgressSnapshot, parse_progress

Json = dict[str, Any]

SAS_MOUNT_ROOT = "/var/run/dtjob"
# Transient failures (a node lost, a throttled account) are worth a retry; resumability makes retries cheap.
STAGER_BACKOFF_LIMIT = 2

EXIT_REASONS = {
    ExitCode.USAGE: "the stager could not read its SAS Secret files",
    ExitCode.DENIED: "the input SAS was denied (403)",
    ExitCode.NOT_FOUND: "the input container or prefix does not exist",
    ExitCode.LOCAL_IO: "the stager could not write to the data volume",
    ExitCode.STORAGE: "Blob Storage returned an error",
    ExitCode.INTEGRITY: "a downloaded file did not match its Content-MD5",
}


def sas_mount_path(access: Access) -> str:
    return f"{SAS_MOUNT_ROOT}/sas-{access.value}"


def sas_volume(job: str, access: Access) -> Json:
    """The pod volume for `<job>-sas-in|out`; group-readable only (the pod's fsGroup)."""
    return {
        "name": f"sas-{access.value}",
        "secret": {"secretName": sas_secret_name(job, access), "defaultMode": 0o440},
    }


def sas_volume_mount(access: Access) -> Json:
    """Mounted as a directory, never with subPath: subPath mounts do not receive Secret updates, and the
    token must follow rotation."""
    return {"name": f"sas-{access.value}", "mountPath": sas_mount_path(access), "readOnly": True}


def _credential_args(access: Access, job: str) -> list[str]:
    return [
        "--container-url-file",
        f"{sas_mount_path(access)}/{SECRET_URL_KEY}",
        "--sas-file",
        f"{sas_mount_path(access)}/{SECRET_TOKEN_KEY}",
        "--credentials-hint",
        f"Secret {sas_secret_name(job, access)}",
    ]


def stager_args(job: str, prefix: str, destination: str, concurrency: int) -> list[str]:
    """Arguments for `python -m dtjob.stager` (the image's entrypoint) in the staging Job."""
    return [
        "download",
        *_credential_args(Access.INPUT, job),
        "--prefix",
        prefix,
        "--dest",
        destination,
        "--concurrency",
        str(concurrency),
        "--progress-interval",
        "10",
    ]


def results_upload_command(job: str, source_dir: str, run_prefix: str, python: str = "python") -> list[str]:
    """What rank 0 (or a post step) runs after training to upload the output directory to the run's prefix
    (see dtjob.azure.results.run_prefix); it needs `<job>-sas-out` mounted via sas_volume/sas_volume_mount."""
    return [
        python,
        "-m",
        "dtjob.stager",
        "upload",
        *_credential_args(Access.OUTPUT, job),
        "--src",
        source_dir,
        "--prefix",
        run_prefix,
        # The output SAS is create+write only: nothing to list, so every file is uploaded.
        "--overwrite",
        "--termination-file",
        "/dev/null",
    ]


def staging_job(
    job: str,
    namespace: str,
    owner_reference: Json,
    prefix: str,
    destination: str,
    concurrency: int,
    data_volume: Json,
    data_mount_path: str,
    image: str = DEFAULT_STAGER_IMAGE,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Json] = (),
    active_deadline_seconds: int | None = None,
    pod_security_context: Json | None = None,
) -> Json:
    """The staging Job: one pod that copies `<container>/<prefix>` to `destination` on the data volume.

    `data_volume` is the pod volume the workers use (named anything; NFS or a PVC) and `data_mount_path`
    where the workers mount it, so `destination` means the same path to the stager and to training. The
    pod sees the SAS only as files of the mounted `<job>-sas-in` Secret, group-readable, so
    `pod_security_context` must set an fsGroup the stager's user belongs to (dtjob.desired.staging passes
    the image's user)."""
    volume_name = str(data_volume["name"])
    # Workers may mount the dataset read-only; the stager is the one writer.
    writable = {
        k: ({**v, "readOnly": False} if isinstance(v, dict) and "readOnly" in v else v)
        for k, v in data_volume.items()
    }
    pod_spec: Json = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": STAGER_CONTAINER,
                "image": image,
                "args": stager_args(job, prefix, destination, concurrency),
                "volumeMounts": [
                    {"name": volume_name, "mountPath": data_mount_path},
                    sas_volume_mount(Access.INPUT),
                ],
                "resources": {
                    "requests": {"cpu": "1", "memory": "512Mi"},
                    "limits": {"memory": "2Gi"},
                },
                # The stager writes its final progress JSON (with the failure reason) there.
                "terminationMessagePolicy": "FallbackToLogsOnError",
                # The restricted Pod Security Standard; the stager writes only the data volume.
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
        "volumes": [writable, sas_volume(job, Access.INPUT)],
    }
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod_spec["tolerations"] = list(tolerations)
    if pod_security_context:
        pod_spec["securityContext"] = pod_security_context
    job_labels = labels(job, "staging", ROLE_STAGER)
    spec: Json = {
        "backoffLimit": STAGER_BACKOFF_LIMIT,
        "template": {"metadata": {"labels": job_labels}, "spec": pod_spec},
    }
    if active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = active_deadline_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": staging_job_name(job),
            "namespace": namespace,
            "labels": job_labels,
            "ownerReferences": [owner_reference],
        },
        "spec": spec,
    }


@dataclass(frozen=True)
class StagingOutcome:
    phase: str  # Running | Succeeded | Failed
    progress: ProgressSnapshot | None
    reason: str = ""  # for Failed: one line naming what to fix


def _terminated(pod: Json) -> Json | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == STAGER_CONTAINER:
            state = status.get("state") or {}
            terminated = state.get("terminated")
            return terminated if isinstance(terminated, dict) else None
    return None


def _snapshot(message: str) -> ProgressSnapshot | None:
    try:
        return ProgressSnapshot.from_json(message)
    except (ValueError, TypeError):
        return None


def staging_outcome(job: Json, pods: Sequence[Json], log_tail: str = "") -> StagingOutcome:
    """Where staging stands, from the staging Job, its pods (newest last) and optionally the running pod's
    log tail (for live progress). A failure's reason comes from the stager's termination message."""
    conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []}
    last_terminated = next((t for t in (_terminated(p) for p in reversed(pods)) if t is not None), None)
    snap = _snapshot(str(last_terminated.get("message") or "")) if last_terminated else None
    if (conditions.get("Complete") or {}).get("status") == "True":
        return StagingOutcome("Succeeded", snap)
    if (conditions.get("Failed") or {}).get("status") == "True":
        reason = snap.reason if snap is not None and snap.reason else ""
        if not reason and last_terminated is not None:
            code = last_terminated.get("exitCode")
            known = {int(c): text for c, text in EXIT_REASONS.items()}
            reason = known.get(code, "") if isinstance(code, int) else ""
            reason = reason or f"the stager exited with status {code}"
        if not reason:
            failed = conditions["Failed"]
            reason = f"staging Job failed: {failed.get('reason', '')} {failed.get('message', '')}".strip()
        return StagingOutcome("Failed", snap, reason)
    return StagingOutcome("Running", parse_progress(log_tail) if log_tail else snap)
