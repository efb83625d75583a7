"""Entry point of the staging program (see the package docstring)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from dtjob.azure.clients import SasFileSource
from dtjob.azure.errors import StorageFailure
from dtjob.azure.progress import Progress
from dtjob.stager.reporter import Reporter
from dtjob.transfer_report import ExitCode

DEFAULT_TERMINATION_FILE = Path("/dev/termination-log")


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
    else:
        parser.add_argument("--src", type=Path, required=True, help="local directory to upload")
        parser.add_argument(
            "--overwrite",
            action="store_true",
            help="upload every file without listing the prefix first (for a SAS without list permission)",
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
    source = SasFileSource(args.container_url_file, args.sas_file, concurrency=args.concurrency)
    progress = Progress()
    try:
        with Reporter(progress, args.progress_interval, args.progress_file, termination):
            try:
                _transfer(command, args, source, progress)
            except StorageFailure as failure:
                progress.set_phase("failed", failure.reason)
                raise
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


if __name__ == "__main__":
    sys.exit(main())
