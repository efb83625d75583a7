"""Where a job's results and logs live in the output container, and the log upload the operator runs before
it deletes pods (so logs survive cleanPodPolicy).

Layout: `<container>/<prefix>/<namespace>/<job>/<uid>/` holds what rank 0 uploads (checkpoints, final model,
metrics JSON) and `logs/<pod>.log` for the launcher and every worker (streamed there by dtjob.azure.logs, cut
to the operator's log cap). The uid keeps a re-created job with the same name from overwriting an earlier run.
"""

from __future__ import annotations

from dtjob.azure.download import directory_prefix

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
