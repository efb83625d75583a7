"""`dtjob results download JOB DIR`: fetch a run's results (rank 0's models and metrics) from Blob Storage.
`dtjob results upload JOB` (dtjob.cli.results_upload): upload them again when the job's own upload failed for
good (ResultsUploadFailed).

The job's own `spec.output` and UID say where its run lives (`<prefix>/<namespace>/<job>/<uid>/`), so the user
names the job, not a blob path. Both use the caller's credentials (--sas-file, --account-key-file, their
environment variables, or DefaultAzureCredential), never the operator's. The download is resumable: a second
run downloads only what is missing or changed. The pods' logs under `logs/` and the run's manifest are left
out unless --with-logs (the logs).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtjob.azure.errors import StorageFailure
from dtjob.cli import blob_access as blob_cli
from dtjob.cli import kept_results
from dtjob.cli import kube_access as kube_cli
from dtjob.cli.run_location import FINISHED_PHASES, run_location
from dtjob.contract.results_upload import MANIFEST_NAME
from dtjob.contract.transfer_report import ExitCode
from dtjob.names import LOGS_DIR


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

    kept_results.add_parser(commands)


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
    skip = (MANIFEST_NAME,) if with_logs else (MANIFEST_NAME, f"{LOGS_DIR}/")
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
