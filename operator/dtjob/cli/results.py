"""`dtjob results download JOB DIR`: fetch a run's results (rank 0's models and metrics) from Blob Storage.
`dtjob results upload JOB`: upload them again when the job's own upload failed for good (ResultsUploadFailed).

The job's own `spec.output` and UID say where its run lives (`<prefix>/<namespace>/<job>/<uid>/`), so the user
names the job, not a blob path. Both use the caller's credentials (--sas-file, --account-key-file, their
environment variables, or DefaultAzureCredential), never the operator's. The download is resumable: a second
run downloads only what is missing or changed. The pods' logs under `logs/` are left out unless --with-logs.

The upload runs on the pod that kept the results (status.output.results.keptOnPod), as the job's own did,
with a short write-only SAS signed from the caller's credentials and handed over stdin. Once it succeeds, it
records the uploader's last line on the job (dtjob.io/results-uploaded); the operator then marks the job
Succeeded and frees the pod.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dtjob.azure.errors import StorageFailure
from dtjob.cli import blob_access as blob_cli
from dtjob.cli import kube_access as kube_cli
from dtjob.contract import results_upload
from dtjob.contract.transfer_report import ExitCode
from dtjob.desired.command import results_upload_later_script
from dtjob.desired.owned import owner_uids
from dtjob.names import LOGS_DIR, WORKER_CONTAINER, Access, run_prefix
from dtjob.spec.reader import SpecError
from dtjob.spec.storage import Output, parse_output
from dtjob.timefmt import format_time

FINISHED_PHASES = ("Succeeded", "Failed")


def register(subparsers: Any) -> None:
    results = subparsers.add_parser("results", help="download a job's results from Blob Storage")
    commands = results.add_subparsers(dest="results_command", required=True, metavar="SUBCOMMAND")
    download = commands.add_parser(
        "download", help="download a job's results (its run under spec.output) into a directory (resumable)"
    )
    download.add_argument("job", metavar="JOB", help="the DistributedTrainingJob's name")
    download.add_argument("dest", type=Path, metavar="DIR", help="local directory (created if missing)")
    kube_cli.add_kube_args(download)
    download.add_argument("--with-logs", action="store_true", help=f"also the pods' logs (under {LOGS_DIR}/)")
    blob_cli.add_credential_args(download, sas_needs=" with read and list")
    download.add_argument(
        "--concurrency", type=blob_cli.parallelism, default=8, help="parallel downloads (default 8)"
    )
    download.add_argument("--no-progress", action="store_true", help="no progress bar")
    download.set_defaults(func=run_download)

    upload = commands.add_parser(
        "upload",
        help="upload the results a job kept on its pod after its own upload failed (ResultsUploadFailed)",
    )
    upload.add_argument("job", metavar="JOB", help="the DistributedTrainingJob's name")
    kube_cli.add_kube_args(upload)
    blob_cli.add_credential_args(
        upload,
        sas_needs=" with create and write on the output container",
        key_use=" to sign a write SAS with",
    )
    upload.add_argument(
        "--retry-for", type=int, default=120, metavar="SECONDS",
        help="keep retrying while storage refuses, for this long (default 120)",
    )  # fmt: skip
    upload.add_argument(
        "--wait", type=int, default=60, metavar="SECONDS",
        help="then wait this long for the operator to mark the job Succeeded (default 60; 0: do not wait)",
    )  # fmt: skip
    upload.set_defaults(func=run_upload)


def run_location(job: dict[str, Any]) -> tuple[Output, str]:
    """(the job's parsed spec.output, its run's blob prefix). Raises StorageFailure(USAGE) when the job
    writes no results."""
    meta = job.get("metadata") or {}
    emulators = {h.strip() for h in os.environ.get("DTJOB_EMULATOR_HOSTS", "").split(",") if h.strip()}
    try:
        output = parse_output((job.get("spec") or {}).get("output"), emulator_hosts=emulators)
    except SpecError as err:
        raise StorageFailure(ExitCode.USAGE, f"job {meta.get('name')}: {err}") from None
    if output is None:
        raise StorageFailure(
            ExitCode.USAGE, f"job {meta.get('name')} has no spec.output: it uploads no results"
        )
    prefix = run_prefix(output.target.prefix, str(meta["namespace"]), str(meta["name"]), str(meta["uid"]))
    return output, prefix


def run_download(args: argparse.Namespace) -> int:
    try:
        job = kube_cli.connect(args).read_job(args.job)
        run_location(job)
    except (StorageFailure, kube_cli.KubeFailure) as err:
        print(f"dtjob results: {err}", file=sys.stderr)
        return int(err.code)
    phase = (job.get("status") or {}).get("phase") or "Pending"
    if phase not in FINISHED_PHASES:
        print(
            f"dtjob results: job {args.job} is {phase}; its results may not be complete yet", file=sys.stderr
        )
    try:
        done = download_results(
            job, args.dest, args.sas, args.account_key, args.concurrency, args.with_logs, not args.no_progress
        )
    except KeyboardInterrupt:
        print("dtjob results: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except StorageFailure as err:
        print(f"dtjob results: {err}", file=sys.stderr)
        return int(err.code)
    print(
        f"downloaded {done.files} file(s), {done.bytes} bytes in {done.elapsed_s:.1f}s "
        f"({done.skipped} already there) from {done.source} to {args.dest}"
    )
    return int(ExitCode.OK)


@dataclass(frozen=True)
class Downloaded:
    """What one download of a run's results did."""

    files: int  # downloaded now
    bytes: int
    skipped: int  # already there, unchanged
    elapsed_s: float
    source: str  # the run's folder: <container URL>/<prefix>
    dest: Path


def download_results(
    job: dict[str, Any],
    dest: Path,
    sas: str | None = None,
    account_key: str | None = None,
    concurrency: int = 8,
    with_logs: bool = False,
    show_progress: bool = True,
) -> Downloaded:
    """Download the job's run (its results; the pods' logs too `with_logs`) into `dest`, resumable, with the
    caller's credentials (a SAS, an account key, their environment variables, or the Entra ID identity).
    StorageFailure naming the cause (a job without spec.output: USAGE)."""
    from dtjob.azure.clients import container_client
    from dtjob.azure.download import Stager
    from dtjob.azure.progress import Progress

    output, prefix = run_location(job)
    target = output.target
    subject, hint = f"container {target.container}", "the credentials"
    progress = Progress()
    skip = () if with_logs else (f"{LOGS_DIR}/",)
    try:
        credential, hint = blob_cli.credential(sas, account_key, target.account_name)
        client = container_client(target.container_url, credential, concurrency)
        with blob_cli.progress_bar(progress, "download", enabled=show_progress):
            snap = Stager(
                lambda: client,
                lambda: None,
                dest,
                progress,
                subject,
                hint,
                concurrency=concurrency,
                skip_prefixes=skip,
            ).run(prefix)
    except Exception as err:
        raise blob_cli.storage_failure(err, subject, hint) from None
    source = f"{target.container_url}/{prefix}"
    return Downloaded(snap.files_done, snap.bytes_done, snap.files_skipped, snap.elapsed_s, source, dest)


# A SAS for one upload: long enough for a slow one, short enough to be worthless soon after.
UPLOAD_SAS_LIFETIME = timedelta(hours=2)


def kept_results_pod(job: dict[str, Any]) -> str:
    """The pod holding results that the job's own upload did not get into storage. StorageFailure(USAGE)
    naming why there is nothing to upload."""
    name = job["metadata"]["name"]
    results = ((job.get("status") or {}).get("output") or {}).get("results") or {}
    state, pod = results.get("state"), results.get("keptOnPod")
    if state == results_upload.FAILED and pod:
        return str(pod)
    if state == results_upload.UPLOADED:
        raise StorageFailure(
            ExitCode.OK, f"job {name}'s results are already uploaded: {results.get('message')}"
        )
    if state == results_upload.FAILED:
        raise StorageFailure(
            ExitCode.NOT_FOUND,
            f"job {name}'s results upload failed and no pod kept them: {results.get('message')}",
        )
    phase = (job.get("status") or {}).get("phase") or "Pending"
    said = f"results {state}: {results.get('message')}" if state else "no results upload yet"
    raise StorageFailure(
        ExitCode.USAGE, f"job {name} has no results waiting for an upload (it is {phase}, {said})"
    )


def _write_sas(args: argparse.Namespace, output: Output) -> str:
    """A create+write token for the output container: the caller's --sas as given, else one signed now with
    the caller's account key or Entra ID identity (a user delegation SAS)."""
    from dtjob.azure.sas import mint_with_account_key, mint_with_user_delegation

    target = output.target
    credential, _hint = blob_cli.credential(args.sas, args.account_key, target.account_name)
    if isinstance(credential, str):
        return credential
    now = datetime.now(UTC)
    start, expiry = now - timedelta(minutes=5), now + UPLOAD_SAS_LIFETIME
    if isinstance(credential, dict):
        key = str(credential["account_key"])
        sas = mint_with_account_key(
            target.endpoint, target.account_name, key, target.container, Access.OUTPUT, start, expiry
        )
    else:
        sas = mint_with_user_delegation(
            target.endpoint, target.account_name, credential, target.container, Access.OUTPUT, start, expiry
        )
    return sas.token


def run_upload(args: argparse.Namespace) -> int:
    if args.retry_for < 0 or args.wait < 0:
        print("dtjob results: --retry-for and --wait must not be negative", file=sys.stderr)
        return int(ExitCode.USAGE)
    try:
        cluster = kube_cli.connect(args)
        output, prefix, pod_name = _kept_results(cluster, args.job)
    except (StorageFailure, kube_cli.KubeFailure) as err:
        print(f"dtjob results: {err}", file=sys.stderr)
        return int(err.code)
    subject = f"container {output.target.container}"
    try:
        token = _write_sas(args, output)
    except Exception as err:
        return blob_cli.fail("dtjob results", err, subject, "the credentials")
    said: list[str] = []

    def relay(text: str) -> None:
        said.append(text)
        sys.stderr.write(text)
        sys.stderr.flush()

    script = results_upload_later_script(args.job, prefix, args.retry_for)
    print(
        f"uploading the results kept on pod {pod_name} to {output.target.container_url}/{prefix}",
        file=sys.stderr,
    )
    try:
        code = cluster.exec_in_pod(
            pod_name,
            WORKER_CONTAINER,
            ["sh", "-c", script],
            f"{output.target.container_url}\n{token}\n",
            relay,
        )
    except kube_cli.KubeFailure as err:
        print(f"dtjob results: {err}", file=sys.stderr)
        return int(err.code)
    report = results_upload.latest_report("".join(said))
    if code != 0 or report is None or report.state != results_upload.UPLOADED:
        print(
            f"dtjob results: the upload on pod {pod_name} failed (exit {code}); the results stay there",
            file=sys.stderr,
        )
        return code or int(ExitCode.STORAGE)
    record = f"{report.message} (dtjob results upload, {format_time(datetime.now(UTC))})"
    try:
        cluster.annotate_job(args.job, results_upload.ANNOTATION_UPLOADED_LATER, record)
    except kube_cli.KubeFailure as err:
        print(f"dtjob results: uploaded, but could not record it on the job: {err}", file=sys.stderr)
        return int(err.code)
    print(f"uploaded: {report.message}")
    return _wait_succeeded(cluster, args.job, args.wait)


def _kept_results(cluster: kube_cli.Cluster, name: str) -> tuple[Output, str, str]:
    """The job's output, its run's prefix and the Running pod of the job that kept its results."""
    job = cluster.read_job(name)
    output, prefix = run_location(job)
    pod_name = kept_results_pod(job)
    pod = cluster.read_pod(pod_name)
    if str(job["metadata"]["uid"]) not in owner_uids(pod):
        raise StorageFailure(ExitCode.USAGE, f"pod {pod_name} does not belong to job {name}")
    pod_phase = (pod.get("status") or {}).get("phase")
    if pod_phase != "Running":
        raise StorageFailure(
            ExitCode.NOT_FOUND, f"pod {pod_name} is {pod_phase}: the results it kept cannot be read"
        )
    return output, prefix, pod_name


def _wait_succeeded(cluster: kube_cli.Cluster, name: str, seconds: int) -> int:
    deadline = time.monotonic() + seconds
    while seconds and time.monotonic() < deadline:
        try:
            status = cluster.read_job(name).get("status") or {}
        except kube_cli.KubeFailure as err:
            print(f"dtjob results: {err}", file=sys.stderr)
            return int(err.code)
        if status.get("phase") == "Succeeded":
            print(f"job {name} is Succeeded: {status.get('message')}")
            return int(ExitCode.OK)
        time.sleep(2)
    if seconds:
        print(
            f"the operator has not marked job {name} Succeeded yet; it will once it reads the record",
            file=sys.stderr,
        )
    return int(ExitCode.OK)
