"""`dtjob results download JOB DIR`: fetch a run's results (rank 0's models and metrics) from Blob Storage.

The job's own `spec.output` and UID say where its run lives (`<prefix>/<namespace>/<job>/<uid>/`), so the user
names the job, not a blob path. The download uses the caller's credentials (--sas, --account-key, or
DefaultAzureCredential), never the operator's, and is resumable: a second run downloads only what is missing
or changed. The pods' logs under `logs/` are left out unless --with-logs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from dtjob.azure.errors import StorageFailure
from dtjob.commands import blob_cli, kube_cli
from dtjob.names import LOGS_DIR, run_prefix
from dtjob.spec_reader import SpecError
from dtjob.storage_spec import Output, parse_output
from dtjob.transfer_report import ExitCode

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
    download.add_argument("--account-key", help="account key (default $AZURE_STORAGE_KEY)")
    download.add_argument("--sas", help="SAS token with read and list (default $AZURE_STORAGE_SAS_TOKEN)")
    download.add_argument("--concurrency", type=int, default=8, help="parallel downloads (default 8)")
    download.add_argument("--no-progress", action="store_true", help="no progress bar")
    download.set_defaults(func=run_download)


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
    from dtjob.azure.clients import container_client
    from dtjob.azure.download import Stager
    from dtjob.azure.progress import Progress

    if args.concurrency < 1:
        print("dtjob results: --concurrency must be at least 1", file=sys.stderr)
        return int(ExitCode.USAGE)
    try:
        job = kube_cli.connect(args).read_job(args.job)
        output, prefix = run_location(job)
    except (StorageFailure, kube_cli.KubeFailure) as err:
        print(f"dtjob results: {err}", file=sys.stderr)
        return int(err.code)
    target = output.target
    phase = (job.get("status") or {}).get("phase") or "Pending"
    if phase not in FINISHED_PHASES:
        print(
            f"dtjob results: job {args.job} is {phase}; its results may not be complete yet", file=sys.stderr
        )
    subject = f"container {target.container}"
    hint = "the credentials"
    progress = Progress()
    skip = () if args.with_logs else (f"{LOGS_DIR}/",)
    try:
        credential, hint = blob_cli.credential(args.sas, args.account_key, target.account_name)
        client = container_client(target.container_url, credential, args.concurrency)
        with blob_cli.progress_bar(progress, "download", enabled=not args.no_progress):
            snap = Stager(
                lambda: client,
                lambda: None,
                args.dest,
                progress,
                subject,
                hint,
                concurrency=args.concurrency,
                skip_prefixes=skip,
            ).run(prefix)
    except KeyboardInterrupt:
        print("dtjob results: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except Exception as err:
        return blob_cli.fail("dtjob results", err, subject, hint)
    print(
        f"downloaded {snap.files_done} file(s), {snap.bytes_done} bytes in {snap.elapsed_s:.1f}s "
        f"({snap.files_skipped} already there) from {target.container_url}/{prefix} to {args.dest}"
    )
    return int(ExitCode.OK)
