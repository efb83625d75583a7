"""Entry point of the staging program (see the package docstring)."""

from __future__ import annotations

import argparse
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from dtjob.azure.clients import SasFileSource
from dtjob.azure.errors import StorageFailure
from dtjob.azure.progress import Progress
from dtjob.azure.stage_lock import DEFAULT_LOCK_WAIT_S
from dtjob.contract import results_upload
from dtjob.contract.transfer_report import ExitCode
from dtjob.stager.reporter import Reporter

DEFAULT_TERMINATION_FILE = Path("/dev/termination-log")
# Failures a later try can get past: storage away or refusing (a token rotated or re-minted meanwhile). Not a
# bad command line, an unreadable local tree or a corrupt transfer.
RETRYABLE = frozenset({ExitCode.DENIED, ExitCode.NOT_FOUND, ExitCode.STORAGE})


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--container-url-file", type=Path, required=True, help="file holding the container URL"
    )
    parser.add_argument("--sas-file", type=Path, required=True, help="file holding the SAS token")
    parser.add_argument(
        "--prefix", default="", help="blob prefix (a virtual directory; empty = whole container)"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="parallel transfers (default 16)")
    parser.add_argument("--progress-file", type=Path, help="rewrite this file with progress JSON")
    parser.add_argument("--progress-interval", type=float, default=5.0, help="seconds between reports")
    parser.add_argument(
        "--termination-file",
        type=Path,
        help="write the final progress JSON here (default /dev/termination-log when it exists)",
    )
    parser.add_argument(
        "--credentials-hint",
        default="the SAS Secret",
        help="what a denial message tells the user to check, e.g. 'Secret r50-sas-in'",
    )


def build_parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m dtjob.stager {command}")
    _common(parser)
    if command == "download":
        parser.add_argument("--dest", type=Path, required=True, help="destination directory")
        parser.add_argument(
            "--no-fsync", action="store_true", help="skip fsync before each rename (faster, less durable)"
        )
        parser.add_argument(
            "--lock-wait",
            type=float,
            default=DEFAULT_LOCK_WAIT_S,
            help="seconds to wait for another stager writing the same destination "
            f"(default {DEFAULT_LOCK_WAIT_S:.0f})",
        )
    else:
        parser.add_argument("--src", type=Path, required=True, help="local directory to upload")
        parser.add_argument(
            "--overwrite",
            action="store_true",
            help="upload every file without listing the prefix first (for a SAS without list permission)",
        )
        parser.add_argument(
            "--retry-for",
            type=float,
            default=0.0,
            help="seconds to keep retrying, with backoff, an upload that storage refused (default 0: none)",
        )
    return parser


def _split_command(argv: list[str]) -> tuple[str, list[str]]:
    if argv and argv[0] in ("download", "upload"):
        return argv[0], argv[1:]
    return "download", argv


def _transfer(command: str, args: argparse.Namespace, source: SasFileSource, progress: Progress) -> None:
    container = urlsplit(source.container_url).path.rstrip("/").rsplit("/", 1)[-1]
    if command == "download":
        from dtjob.azure.download import Stager

        subject = f"input container {container}"
        Stager(
            source,
            source.refresh,
            args.dest,
            progress,
            subject,
            args.credentials_hint,
            concurrency=args.concurrency,
            fsync=not args.no_fsync,
            lock_wait_s=args.lock_wait,
        ).run(args.prefix)
    else:
        from dtjob.azure.upload import Uploader

        subject = f"output container {container}"
        Uploader(
            source,
            source.refresh,
            progress,
            subject,
            args.credentials_hint,
            concurrency=args.concurrency,
            skip_existing=not args.overwrite,
            manifest=results_upload.MANIFEST_NAME,
        ).run(args.src, args.prefix)


def main(argv: Sequence[str] | None = None) -> int:
    command, rest = _split_command(list(sys.argv[1:] if argv is None else argv))
    args = build_parser(command).parse_args(rest)
    if args.concurrency < 1:
        print("--concurrency must be at least 1", file=sys.stderr)
        return ExitCode.USAGE
    termination = args.termination_file
    if termination is None and DEFAULT_TERMINATION_FILE.exists():
        termination = DEFAULT_TERMINATION_FILE
    if command == "upload":
        return _upload_with_retries(args, termination)
    source = SasFileSource(args.container_url_file, args.sas_file, concurrency=args.concurrency)
    progress = Progress()
    try:
        _attempt(command, args, source, progress, termination)
    except StorageFailure as failure:
        print(f"{command} failed: {failure.reason}", file=sys.stderr)
        return failure.code
    snap = progress.snapshot()
    print(
        f"{command} done: {snap.files_done} transferred, {snap.files_skipped} already present, "
        f"{snap.bytes_done} bytes in {snap.elapsed_s:.1f}s",
        file=sys.stderr,
    )
    return ExitCode.OK


def _attempt(
    command: str,
    args: argparse.Namespace,
    source: SasFileSource,
    progress: Progress,
    termination: Path | None,
) -> None:
    with Reporter(progress, args.progress_interval, args.progress_file, termination):
        try:
            _transfer(command, args, source, progress)
        except StorageFailure as failure:
            progress.set_phase("failed", failure.reason)
            raise


def _upload_with_retries(args: argparse.Namespace, termination: Path | None) -> int:
    """The results upload: a try, and while storage refuses, more tries with backoff for --retry-for
    seconds, each with the token read again from its file (the operator rotates it). One line per try on
    stderr, which the operator reads from the launcher's log (dtjob.contract.results_upload); the last names
    this pod (its hostname, the pod's name), which holds the results."""
    started = time.monotonic()
    deadline = started + args.retry_for
    pod = socket.gethostname()
    print(results_upload.started_line(pod), file=sys.stderr, flush=True)
    attempt = 0
    while True:
        attempt += 1
        source = SasFileSource(args.container_url_file, args.sas_file, concurrency=args.concurrency)
        progress = Progress()
        try:
            _attempt("upload", args, source, progress, termination)
        except StorageFailure as failure:
            left = deadline - time.monotonic()
            if failure.code not in RETRYABLE or left <= 0:
                line = results_upload.failed_line(attempt, time.monotonic() - started, failure.reason, pod)
                print(line, file=sys.stderr, flush=True)
                return failure.code
            wait = min(results_upload.backoff_seconds(attempt), left)
            print(results_upload.retry_line(attempt, wait, left, failure.reason), file=sys.stderr, flush=True)
            time.sleep(wait)
            continue
        snap = progress.snapshot()
        done = results_upload.done_line(snap.files_done + snap.files_skipped, snap.bytes_total, attempt, pod)
        print(done, file=sys.stderr, flush=True)
        return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
