"""Where a job's results and logs live in the output container, and the log upload the operator runs before
it deletes pods (so logs survive cleanPodPolicy).

Layout: `<container>/<prefix>/<namespace>/<job>/<uid>/` holds what rank 0 uploads (checkpoints, final model,
metrics JSON) and `logs/<pod>.log` for the launcher and every worker. The uid keeps a re-created job with the
same name from overwriting an earlier run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dtjob.azure.download import directory_prefix

if TYPE_CHECKING:
    from azure.storage.blob import ContainerClient

    from dtjob.azure.sas import ContainerSas

LOGS_DIR = "logs"


def run_prefix(prefix: str, namespace: str, job: str, uid: str) -> str:
    """`<prefix>/<namespace>/<job>/<uid>/` (the blob prefix of one run; no leading slash)."""
    return directory_prefix(prefix) + f"{namespace}/{job}/{uid}/"


def output_url(container_url: str, prefix: str, namespace: str, job: str, uid: str) -> str:
    """The run's URL for the job's status. Built from the container URL only, so it never carries a SAS."""
    return f"{container_url.split('?', 1)[0].rstrip('/')}/{run_prefix(prefix, namespace, job, uid)}"


def log_blob_name(
    prefix: str, namespace: str, job: str, uid: str, pod: str, attempt: int | None = None
) -> str:
    """`logs/<pod>.log` for the final world, `logs/attempt-<n>/<pod>.log` for one a restart replaced."""
    folder = LOGS_DIR if attempt is None else f"{LOGS_DIR}/attempt-{attempt}"
    return f"{run_prefix(prefix, namespace, job, uid)}{folder}/{pod}.log"


def upload_logs(
    client: ContainerClient,
    prefix: str,
    namespace: str,
    job: str,
    uid: str,
    logs: Mapping[str, str],
    attempt: int | None = None,
) -> list[str]:
    """Upload each pod's log text as `logs/<pod>.log` under the run's prefix; returns the blob names.
    Overwrites, so a retried cleanup uploads the fuller log."""
    from azure.storage.blob import ContentSettings

    names = []
    for pod, text in sorted(logs.items()):
        name = log_blob_name(prefix, namespace, job, uid, pod, attempt)
        client.upload_blob(
            name,
            text.encode(),
            overwrite=True,
            content_settings=ContentSettings(content_type="text/plain; charset=utf-8"),
        )
        names.append(name)
    return names


def upload_logs_with_sas(
    sas: ContainerSas,
    prefix: str,
    namespace: str,
    job: str,
    uid: str,
    logs: Mapping[str, str],
    attempt: int | None = None,
) -> list[str]:
    """`upload_logs` with the job's output SAS (what the operator holds after minting `<job>-sas-out`)."""
    from dtjob.azure.clients import container_client

    client = container_client(sas.container_url, sas.token)
    return upload_logs(client, prefix, namespace, job, uid, logs, attempt)
