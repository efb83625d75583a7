"""`dtjob results upload JOB`: upload the results a job kept on its pod after its own upload failed for good
(ResultsUploadFailed). DESCRIPTION says what it does and what its token reaches (`--help` prints it)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dtjob.azure.errors import StorageFailure
from dtjob.cli import blob_access as blob_cli
from dtjob.cli import kube_access as kube_cli
from dtjob.cli.run_location import run_location
from dtjob.contract import results_upload
from dtjob.contract.results_upload import ResultsRecord
from dtjob.contract.transfer_report import ExitCode
from dtjob.desired.command import results_upload_later_script
from dtjob.names import WORKER_CONTAINER, Access, output_url
from dtjob.printable import printable
from dtjob.spec.storage import Output
from dtjob.state.status import SAS_SCOPE_DIRECTORY
from dtjob.timefmt import format_time

# How long the upload's token outlives --retry-for: the transfer itself, however large the results. The
# command in the pod is stopped then too: its token is of no use after it.
UPLOAD_SAS_MARGIN = timedelta(minutes=30)
# What of the pod's output is kept to read the upload's report from: its last lines.
SAID_KEPT_CHARS = 64 * 1024
DESCRIPTION = f"""\
The upload runs in the pod the operator kept (status.output.results.keptOnPod), and only while that pod is
the one of keptOnPodUID: a later pod of the same name holds nothing. As the job's own upload did, it runs
there with a write SAS signed from your credentials and handed over stdin. The token is signed only for the
run's location in status, the one the namespace's storage policy allowed (a spec.output edited since is
refused), create and write only, and as narrow as the account allows: on a hierarchical-namespace account
(status.output.sasScope Directory) a directory SAS for the run's own directory; elsewhere a container SAS,
which code in that pod could use to write anywhere in the container while it lives. It lives --retry-for plus
{UPLOAD_SAS_MARGIN.seconds // 60} minutes. A --sas you bring is used as given. Once the upload succeeds, the
job is annotated dtjob.io/results-uploaded with a record of it (the job's UID, the attempt, the kept pod, the
files and bytes uploaded); the operator checks that storage holds them, then marks the job Succeeded and
frees the pod."""


def add_parser(commands: Any) -> None:
    upload = commands.add_parser(
        "upload",
        help="upload the results a job kept on its pod after its own upload failed (ResultsUploadFailed)",
        description=DESCRIPTION,
    )
    upload.add_argument("job", metavar="JOB", help="the DistributedTrainingJob's name")
    kube_cli.add_kube_args(upload)
    blob_cli.add_credential_args(
        upload,
        sas_needs=" with create and write on the run's directory or its container (used as given)",
        key_use=" to sign the upload's write SAS with",
    )
    upload.add_argument(
        "--retry-for", type=int, default=120, metavar="SECONDS",
        help="keep retrying while storage refuses, for this long (default 120); the SAS signed for the "
        f"upload lives this long plus {UPLOAD_SAS_MARGIN.seconds // 60} minutes",
    )  # fmt: skip
    upload.add_argument(
        "--wait", type=int, default=60, metavar="SECONDS",
        help="then wait this long for the operator to mark the job Succeeded (default 60; 0: do not wait)",
    )  # fmt: skip
    upload.set_defaults(func=run_upload)


@dataclass(frozen=True)
class KeptResults:
    """Where a job's kept results are and where they go: the pod (name and UID), the run's location as the
    operator allowed it, and the attempt that failed to upload them."""

    pod: str
    pod_uid: str
    output: Output
    prefix: str
    directory_scoped: bool
    job_uid: str
    attempt: int


def kept_results_pod(job: dict[str, Any]) -> tuple[str, str]:
    """(name, UID) of the pod holding results that the job's own upload did not get into storage.
    StorageFailure naming why there is nothing to upload."""
    name = job["metadata"]["name"]
    results = ((job.get("status") or {}).get("output") or {}).get("results") or {}
    state, pod, pod_uid = results.get("state"), results.get("keptOnPod"), results.get("keptOnPodUID")
    if state == results_upload.FAILED and pod and pod_uid:
        return str(pod), str(pod_uid)
    if state == results_upload.UPLOADED:
        raise StorageFailure(
            ExitCode.OK, f"job {name}'s results are already uploaded: {results.get('message')}"
        )
    if state == results_upload.FAILED:
        raise StorageFailure(
            ExitCode.NOT_FOUND,
            f"job {name}'s results upload failed and no pod the operator can name kept them: "
            f"{results.get('message')}",
        )
    phase = (job.get("status") or {}).get("phase") or "Pending"
    said = f"results {state}: {results.get('message')}" if state else "no results upload yet"
    raise StorageFailure(
        ExitCode.USAGE, f"job {name} has no results waiting for an upload (it is {phase}, {said})"
    )


def kept_results(job: dict[str, Any]) -> KeptResults:
    """The kept pod and the run's location: the one in status, which the storage policy allowed. A
    spec.output that names another location now is refused (StorageFailure, USAGE)."""
    meta, status = job["metadata"], job.get("status") or {}
    pod, pod_uid = kept_results_pod(job)
    output, prefix = run_location(job)
    target = output.target
    wanted = output_url(target.container_url, target.prefix, meta["namespace"], meta["name"], meta["uid"])
    allowed = (status.get("output") or {}).get("url")
    if wanted != allowed:
        raise StorageFailure(
            ExitCode.USAGE,
            f"job {meta['name']}: spec.output names {wanted}, not the run's location {allowed} "
            "(status.output.url, the one the storage policy allowed): put spec.output back to upload there",
        )
    directory = (status.get("output") or {}).get("sasScope") == SAS_SCOPE_DIRECTORY
    attempt = status.get("restarts")
    return KeptResults(
        pod, pod_uid, output, prefix, directory, str(meta["uid"]), attempt if isinstance(attempt, int) else 0
    )


def upload_sas(args: argparse.Namespace, kept: KeptResults) -> str:
    """The upload's write token: the caller's --sas as given, else one signed now with the caller's account
    key or Entra ID identity (a user delegation SAS): create+write, for the run's directory where the account
    allows it, else for its container, living --retry-for plus UPLOAD_SAS_MARGIN."""
    from dtjob.azure.sas import mint_with_account_key, mint_with_user_delegation

    target = kept.output.target
    credential, _hint = blob_cli.credential(args.sas, args.account_key, target.account_name)
    if isinstance(credential, str):
        return credential
    now = datetime.now(UTC)
    start, expiry = now - timedelta(minutes=5), now + timedelta(seconds=args.retry_for) + UPLOAD_SAS_MARGIN
    directory = kept.prefix.rstrip("/") if kept.directory_scoped else None
    where = (target.endpoint, target.account_name)
    if isinstance(credential, dict):
        key = str(credential["account_key"])
        sas = mint_with_account_key(*where, key, target.container, Access.OUTPUT, start, expiry, directory)
    else:
        sas = mint_with_user_delegation(
            *where, credential, target.container, Access.OUTPUT, start, expiry, directory
        )
    return sas.token


def run_upload(args: argparse.Namespace) -> int:
    if args.retry_for < 0 or args.wait < 0:
        print("dtjob results: --retry-for and --wait must not be negative", file=sys.stderr)
        return int(ExitCode.USAGE)
    try:
        cluster = kube_cli.connect(args)
        kept = _kept_in_running_pod(cluster, args.job)
    except (StorageFailure, kube_cli.KubeFailure) as err:
        print(f"dtjob results: {err}", file=sys.stderr)
        return int(err.code)
    target = kept.output.target
    try:
        token = upload_sas(args, kept)
    except Exception as err:
        return blob_cli.fail("dtjob results", err, f"container {target.container}", "the credentials")
    said = ""

    def relay(text: str) -> None:
        nonlocal said
        said = (said + text)[-SAID_KEPT_CHARS:]
        sys.stderr.write(printable(text))
        sys.stderr.flush()

    script = results_upload_later_script(args.job, kept.prefix, args.retry_for)
    print(
        f"uploading the results kept on pod {kept.pod} to {target.container_url}/{kept.prefix}",
        file=sys.stderr,
    )
    try:
        stdin = f"{target.container_url}\n{token}\n"
        ends = args.retry_for + UPLOAD_SAS_MARGIN.total_seconds()
        code = cluster.exec_in_pod(kept.pod, WORKER_CONTAINER, ["sh", "-c", script], stdin, relay, ends)
    except kube_cli.KubeFailure as err:
        print(f"dtjob results: {err}", file=sys.stderr)
        return int(err.code)
    report = results_upload.latest_report(said)
    counts = results_upload.done_counts(report.message) if report is not None else None
    if code != 0 or report is None or report.state != results_upload.UPLOADED or counts is None:
        print(f"dtjob results: the upload on pod {kept.pod} failed (exit {code}); the results stay there",
              file=sys.stderr)  # fmt: skip
        return code or int(ExitCode.STORAGE)
    at = format_time(datetime.now(UTC))
    record = ResultsRecord(kept.job_uid, kept.attempt, kept.pod, kept.pod_uid, *counts, at)
    try:
        cluster.annotate_job(args.job, results_upload.ANNOTATION_UPLOADED_LATER, record.to_annotation())
    except kube_cli.KubeFailure as err:
        print(f"dtjob results: uploaded, but could not record it on the job: {err}", file=sys.stderr)
        return int(err.code)
    print(f"uploaded: {report.message}")
    return _wait_succeeded(cluster, args.job, args.wait)


def _kept_in_running_pod(cluster: kube_cli.Cluster, name: str) -> KeptResults:
    """The job's kept results, while the very pod that kept them (its UID) runs; StorageFailure otherwise."""
    kept = kept_results(cluster.read_job(name))
    try:
        pod = cluster.read_pod(kept.pod)
    except kube_cli.KubeFailure as err:
        raise StorageFailure(
            ExitCode.NOT_FOUND, f"pod {kept.pod}, which kept the results, cannot be read: {err}"
        ) from None
    uid = (pod.get("metadata") or {}).get("uid")
    if uid != kept.pod_uid:
        raise StorageFailure(
            ExitCode.NOT_FOUND,
            f"pod {kept.pod} is not the one that kept the results (UID {kept.pod_uid}, this one {uid}): "
            "they were lost with it",
        )
    pod_phase = (pod.get("status") or {}).get("phase")
    if pod_phase != "Running":
        raise StorageFailure(
            ExitCode.NOT_FOUND, f"pod {kept.pod} is {pod_phase}: the results it kept cannot be read"
        )
    return kept


def _wait_succeeded(cluster: kube_cli.Cluster, name: str, seconds: int) -> int:
    deadline = time.monotonic() + seconds
    while seconds and time.monotonic() < deadline:
        try:
            status = cluster.read_job(name).get("status") or {}
        except kube_cli.KubeFailure as err:
            print(f"dtjob results: {err}", file=sys.stderr)
            return int(err.code)
        if status.get("phase") == "Succeeded":
            print(f"job {name} is Succeeded: {printable(str(status.get('message')))}")
            return int(ExitCode.OK)
        time.sleep(2)
    if seconds:
        print(
            f"the operator has not marked job {name} Succeeded yet; it will once it finds the results in "
            "storage",
            file=sys.stderr,
        )
    return int(ExitCode.OK)
